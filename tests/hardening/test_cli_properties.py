"""Property: the ``tenure`` command, driven in process (click's CliRunner) with generated
hostile option values, stdin payloads, schema names and DSNs, never shows a traceback, ends
with an error line and exit 1 or 2 when it refuses, and never changes rows stored before.

The issue's exact form (one line ``tenure: error: ...``, exit 2 for every usage or validation
error) is asserted by the ``*_in_one_line`` properties (they stop at their first failing
example, unshrunk). A few real processes at the end check the same without CliRunner.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

import tenure
from tenure.cli.main import cli
from tests.hardening.hostile import (
    SEEDED_KEY,
    Seeded,
    assert_one_line,
    assert_refused,
    error_lines,
    examples,
    hostile_payloads,
    hostile_text,
    no_traceback,
    payload_ok,
    tried,
    valid_schema,
    valid_text,
)
from tests.support.env import run_tenure, tenure_env

# The one-line properties stop at their first failing example: shrinking would only cost time.
NO_SHRINK = (Phase.explicit, Phase.generate)

# Command lines taking one duration: (args before the value, option).
DURATION_COMMANDS = {
    "status --window": ["status", "--window"],
    "outbox purge --older-than": ["outbox", "purge", "--older-than"],
    "relay --timeout": ["relay", "--timeout"],  # no handler: refused after parsing
}
INT_COMMANDS = {
    "jobs history --limit": (["jobs", "history", "seeded-job", "--limit"], 100_000),
    "outbox list --limit": (["outbox", "list", "--limit"], 100_000),
    "outbox purge --id": (["outbox", "purge", "--id"], 2**63 - 1),
}

duration_text = st.one_of(
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.one_of(st.integers(-5, 10**16), st.floats(allow_nan=True, allow_infinity=True)),
        st.sampled_from(["", "ms", "s", "m", "h", "d", "w", " d", "e9"]),
    ),
    hostile_text,
)
int_text = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["0", "-1", "1e3", "0x10", "1_000", " 5", "١٢", "99999999999999999999"]),
    hostile_text,
)


#: Duration options that must be more than zero (checked while parsing, like the rest).
POSITIVE_DURATIONS = {"status --window"}


def _duration_refused(text: str, *, positive: bool = False) -> bool:
    try:
        seconds = tenure.parse_duration(text)
    except tenure.InvalidArgument:
        return True
    return positive and seconds == 0


def _int_refused(text: str, maximum: int) -> bool:
    try:
        value = int(text)  # click's int: Python's int() on the text
    except ValueError:
        return True
    return not 1 <= value <= maximum


def _run(runner: CliRunner, args: list[str], stdin: Any = None) -> Result:
    return runner.invoke(cli, args, input=stdin)


def _check_outcome(result: Result, *, refused: bool) -> None:
    no_traceback(result)
    if refused:
        assert_refused(result)
        assert result.exit_code == 2, (result.exit_code, result.stderr)
    elif result.exit_code != 0:  # valid input may still meet a runtime error: one line
        assert result.exit_code == 1, (result.exit_code, result.stderr)
        lines = error_lines(result.stderr)
        assert len(lines) == 1 and lines[0].startswith("tenure: error: "), lines


# -- durations and integers -------------------------------------------------------------------


@settings(max_examples=examples(30))
@given(command=st.sampled_from(sorted(DURATION_COMMANDS)), value=duration_text)
@example(command="status --window", value="99999999999d")
@example(command="outbox purge --older-than", value="99999999999d")
@example(command="relay --timeout", value="99999999999d")
def test_duration_options(seeded: Seeded, cli_runner: CliRunner, command: str, value: str) -> None:
    tried("cli: duration options")
    result = _run(cli_runner, [*DURATION_COMMANDS[command], value])
    refused = _duration_refused(value, positive=command in POSITIVE_DURATIONS)
    if command == "relay --timeout" and not refused:
        # Parsed; then refused for want of a handler, before connecting.
        assert_refused(result)
    else:
        _check_outcome(result, refused=refused)
    seeded.check()


@settings(max_examples=examples(10), phases=NO_SHRINK)
@given(command=st.sampled_from(sorted(DURATION_COMMANDS)), value=duration_text)
@example(command="status --window", value="99999999999d")
def test_duration_options_in_one_line(
    seeded: Seeded, cli_runner: CliRunner, command: str, value: str
) -> None:
    tried("cli: duration options, one line")
    result = _run(cli_runner, [*DURATION_COMMANDS[command], value])
    if _duration_refused(value, positive=command in POSITIVE_DURATIONS):
        assert_one_line(result, 2)


@settings(max_examples=examples(30))
@given(command=st.sampled_from(sorted(INT_COMMANDS)), value=int_text)
@example(command="jobs history --limit", value="99999999999999999999")
@example(command="outbox purge --id", value=str(2**63))
def test_integer_options(seeded: Seeded, cli_runner: CliRunner, command: str, value: str) -> None:
    tried("cli: integer options")
    args, maximum = INT_COMMANDS[command]
    result = _run(cli_runner, [*args, value])
    _check_outcome(result, refused=_int_refused(value, maximum))
    seeded.check()


@settings(max_examples=examples(10), phases=NO_SHRINK)
@given(command=st.sampled_from(sorted(INT_COMMANDS)), value=int_text)
@example(command="jobs history --limit", value="99999999999999999999")
def test_integer_options_in_one_line(
    seeded: Seeded, cli_runner: CliRunner, command: str, value: str
) -> None:
    tried("cli: integer options, one line")
    args, maximum = INT_COMMANDS[command]
    result = _run(cli_runner, [*args, value])
    if _int_refused(value, maximum):
        assert_one_line(result, 2)


# -- keys -------------------------------------------------------------------------------------

# A positional KEY follows `--`, as a key like "-0" needs on any command line.
KEY_COMMANDS = {
    "release --key": ["release", "--key"],
    "result get --key": ["result", "get", "--key"],
    "jobs history": ["jobs", "history", "--"],
    "jobs pause": ["jobs", "pause", "--"],
    "jobs trigger": ["jobs", "trigger", "--"],
    "schedules show": ["schedules", "show", "--"],
    "schedules remove": ["schedules", "remove", "--"],
}


@settings(max_examples=examples(25))
@given(command=st.sampled_from(sorted(KEY_COMMANDS)), key=hostile_text)
@example(command="release --key", key="\ud800")
@example(command="jobs pause", key="k" * 201)
@example(command="jobs history", key="-0")
def test_key_arguments(seeded: Seeded, cli_runner: CliRunner, command: str, key: str) -> None:
    tried("cli: job keys")
    if key in (SEEDED_KEY, "seeded-job", "seeded-schedule"):
        return
    result = _run(cli_runner, [*KEY_COMMANDS[command], key])
    no_traceback(result)
    if not valid_text(key, 200):
        assert_refused(result)
    elif result.exit_code != 0:  # no such job, no result: one line
        lines = error_lines(result.stderr)
        assert result.exit_code == 1 and len(lines) == 1, (result.exit_code, lines)
    seeded.check()


@settings(max_examples=examples(10), phases=NO_SHRINK)
@given(key=hostile_text.filter(lambda k: not valid_text(k, 200)))
def test_refused_keys_exit_2(seeded: Seeded, cli_runner: CliRunner, key: str) -> None:
    tried("cli: job keys, exit 2")
    assert_one_line(_run(cli_runner, ["release", "--key", key]), 2)


# -- payloads on stdin ------------------------------------------------------------------------


def _dumps(payload: Any) -> bytes:
    try:
        return json.dumps(payload, default=str, allow_nan=True).encode()
    except ValueError:  # an int of more than 4300 digits
        return b"1" * 5000
    except RecursionError:  # nested deeper than json.dumps goes: write it by hand
        return b"[" * 3000 + b"]" * 3000


stdin_documents = st.one_of(
    hostile_payloads.map(_dumps),
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"[" * 3000 + b"]" * 3000,
            b'{"a": "\\u0000"}',
            b'"\\ud800"',
            b"1" * 5000,
            b"NaN",
            b"\xff\xfe{}",
            b"",
        ]
    ),
)


def _document_ok(document: bytes) -> bool:
    try:
        value = json.loads(document)
    except (ValueError, RecursionError):
        return False
    return payload_ok(value)


@settings(max_examples=examples(40))
@given(document=stdin_documents)
def test_result_put_payloads(seeded: Seeded, cli_runner: CliRunner, document: bytes) -> None:
    tried("cli: result put payloads")
    args = ["result", "put", "--key", SEEDED_KEY, "--token", str(seeded.token)]
    ok = _document_ok(document)
    if ok:
        # Accepted documents go to a key of their own: the seeded result must stay.
        lease = seeded.client.acquire("cli-writable", ttl=60)
        assert lease is not None
        args = ["result", "put", "--key", "cli-writable", "--token", str(lease.token)]
    result = _run(cli_runner, args, stdin=document)
    no_traceback(result)
    if ok:
        assert result.exit_code == 0, result.stderr
        seeded.client.release("cli-writable")
    else:
        assert_refused(result)
        lines = error_lines(result.stderr)
        assert len(lines) == 1, lines
    seeded.check()


@settings(max_examples=examples(10), phases=NO_SHRINK)
@given(document=stdin_documents.filter(lambda d: not _document_ok(d)))
def test_refused_payloads_exit_2(seeded: Seeded, cli_runner: CliRunner, document: bytes) -> None:
    tried("cli: result put payloads, exit 2")
    args = ["result", "put", "--key", SEEDED_KEY, "--token", str(seeded.token)]
    assert_one_line(_run(cli_runner, args, stdin=document), 2)


# -- schema names and DSNs --------------------------------------------------------------------


@settings(max_examples=examples(20))
@given(name=hostile_text)
@example(name="a%b")
@example(name="é" * 40)
def test_schema_option(seeded: Seeded, cli_runner: CliRunner, name: str) -> None:
    tried("cli: --schema")
    result = _run(cli_runner, ["status", "--schema", name])
    no_traceback(result)
    if not valid_schema(name):
        assert_refused(result)
    elif name != seeded.schema:
        # A schema that does not exist: one runtime line saying to migrate.
        lines = error_lines(result.stderr)
        assert result.exit_code == 1 and len(lines) == 1, (result.exit_code, lines)
        assert "tenure migrate" in lines[0], lines
    seeded.check()


# DSNs that fail fast: unparseable text, or a local server with hostile parts.
hostile_dsns = st.one_of(
    hostile_text,
    st.builds(
        "postgresql://{}:{}@127.0.0.1:{}/{}".format,
        hostile_text,
        hostile_text,
        st.sampled_from(["1", "5432", "99999", "x", ""]),
        hostile_text,
    ),
    st.builds(lambda extra: f"host=127.0.0.1 port=1 {extra}", hostile_text),
)


@settings(max_examples=examples(20))
@given(dsn=hostile_dsns)
@example(dsn="postgresql://postgres:secret@[::1:5432/db")
@example(dsn="host=127.0.0.1 dbname=\x00")
def test_dsn_option(seeded: Seeded, cli_runner: CliRunner, dsn: str) -> None:
    tried("cli: --dsn")
    result = _run(cli_runner, ["status", "--dsn", dsn])
    no_traceback(result)
    if result.exit_code != 0:
        assert_refused(result)
        lines = error_lines(result.stderr)
        assert len(lines) == 1, lines
    seeded.check()


# -- a few real processes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "stdin", "code"),
    [
        (["status", "--window", "99999999999d"], None, 2),
        (["jobs", "history", "k", "--limit", "99999999999999999999"], None, 2),
        (["status", "--schema", "a%b"], None, 1),
        (["result", "put", "--key", "k", "--token", "1"], b"\xff\xfe\x00{", None),
    ],
    ids=["window", "limit", "percent-schema", "bad-utf8-stdin"],
)
def test_real_process(
    seeded: Seeded, args: list[str], stdin: bytes | None, code: int | None
) -> None:
    import subprocess
    import sys

    tried("cli: real processes")
    out = subprocess.run(
        [sys.executable, "-m", "tenure", *args],
        env=tenure_env(seeded.dsn, seeded.schema),
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    stderr = out.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    lines = error_lines(stderr)
    assert out.returncode in (1, 2) and lines, (out.returncode, stderr)
    assert lines[-1].startswith(("tenure: error: ", "Error: ")), lines
    if code is not None:
        assert out.returncode == code, (out.returncode, stderr)
    seeded.check()


def test_run_tenure_helper_is_the_same_command(seeded: Seeded) -> None:
    # The text-mode helper the other CLI tests use sees the same refusal.
    out = run_tenure(["status", "--window", "-1s"], tenure_env(seeded.dsn, seeded.schema))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
