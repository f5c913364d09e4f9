"""Exit codes and the one-line error: a usage error exits 2, a runtime error 1, both as one
line ``tenure: error: ...`` (``tenure exec: error: ...``) on stderr, on every command; an
unexpected exception is one line too, never a traceback."""

from __future__ import annotations

import click
import pytest

import tenure
from tenure.cli.params import DurationType
from tests.support.cli_commands import leaf_commands, with_options
from tests.support.env import run_tenure, tenure_env


def _bad_value(param: click.Option) -> str | None:
    """A value the option's type refuses, or None for free text and flags."""
    kind = param.type
    if param.is_flag or param.count:
        return None
    if isinstance(kind, click.Choice):
        return "banana"
    if isinstance(kind, click.IntRange):
        return str(kind.min - 1) if kind.min is not None else str((kind.max or 0) + 1)
    if isinstance(kind, click.types.IntParamType | click.types.FloatParamType | DurationType):
        return "banana"
    return None


def _bad_value_cases() -> list[tuple[list[str], str]]:
    cases = []
    for path, command in leaf_commands():
        for param in command.params:
            if isinstance(param, click.Option) and param.name not in ("help", "version"):
                value = _bad_value(param)
                if value is not None:
                    cases.append((with_options(path, param.opts[0], value), " ".join(path)))
    return cases


BAD_VALUES = _bad_value_cases()
UNKNOWN = [(with_options(path, "--frobnicate"), " ".join(path)) for path, _ in leaf_commands()]
# The reproductions, and durations that cannot be a timedelta.
NAMED = [
    ["worker", "secret_app:app", "--concurrency", "0"],
    ["worker", "secret_app:app", "--shutdown-grace", "banana"],
    ["status", "--window", "banana"],
    ["status", "--window", "99999999999d"],
    ["demo", "--ttl", "soon"],
    ["relay", "--webhook", "t=http://127.0.0.1:1/", "--timeout", "99999999999d"],
    ["relay", "--webhook", "t=http://127.0.0.1:1/", "--poll", "never"],
    ["outbox", "purge", "--older-than", "99999999999d"],
    ["jobs", "history", "k", "--limit", "99999999999999999999"],
    ["exec", "--key", "k", "--ttl", "banana", "--", "true"],
    ["exec", "--key", "k", "true"],
    ["relay", "--webhook", "no-equals-sign"],
    ["outbox", "retry"],
    ["worker", "no_colon"],
]


def test_the_cases_cover_every_command() -> None:
    assert len(UNKNOWN) == len(leaf_commands()) >= 18
    typed = {name for _, name in BAD_VALUES}
    assert {"worker", "relay", "status", "exec", "jobs history", "outbox list"} <= typed


def _one_usage_line(out: object, args: list[str]) -> None:
    import subprocess

    assert isinstance(out, subprocess.CompletedProcess)
    lines = out.stderr.strip().splitlines()
    prefix = "tenure exec: error: " if args[0] == "exec" else "tenure: error: "
    assert out.returncode == 2, (args, out.returncode, out.stderr)
    assert len(lines) == 1, (args, out.stderr)
    assert lines[0].startswith(prefix), (args, out.stderr)
    assert out.stdout == "", (args, out.stdout)


@pytest.mark.parametrize(("args", "name"), BAD_VALUES + UNKNOWN, ids=lambda v: str(v))
def test_usage_errors_exit_2_with_one_line(
    dsn: str, schema: str, args: list[str], name: str
) -> None:
    _one_usage_line(run_tenure(args, tenure_env(dsn, schema)), args)


@pytest.mark.parametrize("args", NAMED, ids=" ".join)
def test_named_usage_errors_exit_2_with_one_line(dsn: str, schema: str, args: list[str]) -> None:
    _one_usage_line(run_tenure(args, tenure_env(dsn, schema)), args)


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        # Was a RecursionError inside json.loads.
        (["result", "put", "--key", "deep", "--token", "1"], "[" * 100_000 + "]" * 100_000),
        # Was PostgreSQL's refusal of \u0000 in jsonb, with DETAIL and CONTEXT lines.
        (["result", "put", "--key", "nul", "--token", "1"], '{"a": "\\u0000"}'),
    ],
    ids=["recursion", "nul-in-jsonb"],
)
def test_payloads_that_broke_the_command_are_refused_in_one_line(
    client: tenure.Client, dsn: str, schema: str, args: list[str], stdin: str
) -> None:
    """Refused where they enter now (bad input: exit 2), before any SQL runs."""
    lease = client.acquire(args[3], ttl=60)
    assert lease is not None and lease.token == 1
    out = run_tenure(args, tenure_env(dsn, schema), input=stdin)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out
    assert len(lines) == 1 and lines[0].startswith("tenure: error: "), out.stderr
    assert "Traceback" not in out.stderr
    assert client.results.get(args[3]) is None  # nothing stored


def test_an_unexpected_exception_is_one_line_and_exit_1() -> None:
    """The last line of defence: an exception tenure does not expect (a bug, or an input it
    does not handle yet) is one line naming it, exit 1, never a traceback."""
    from click.testing import CliRunner

    from tenure.cli.common import TenureGroup

    group = TenureGroup("tenure")

    @group.command("boom")
    def boom() -> None:
        raise RecursionError("maximum recursion depth exceeded")

    result = CliRunner().invoke(group, ["boom"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("tenure: error: unexpected RecursionError")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [[], ["jobs"], ["outbox"]], ids=lambda a: " ".join(a) or "-")
def test_a_group_alone_prints_its_help(dsn: str, schema: str, args: list[str]) -> None:
    out = run_tenure(args, tenure_env(dsn, schema))
    assert out.returncode == 2 and "Usage:" in out.stderr and "Commands:" in out.stderr
