"""The bad-input items of issue #11, each as reported: a traceback, a multi-line server error
or a silently wrong name on the code before the fix.

Each test shows the reported input is refused where it enters, with the one documented
exception (library) or without a traceback (CLI), and (separate tests) that the CLI's
answer is the issue's one line with exit 2.
"""

from __future__ import annotations

import datetime as dt
import math

import psycopg
import pytest
from click.testing import CliRunner

import tenure
from tenure.cli.main import cli
from tests.hardening.hostile import (
    SEEDED_KEY,
    Seeded,
    assert_one_line,
    assert_refused,
    deep,
    error_lines,
)
from tests.support.env import run_tenure, tenure_env

HUGE = "99999999999d"


# -- the command line -------------------------------------------------------------------------


def test_result_put_deeply_nested_json_is_refused_in_one_line(seeded: Seeded) -> None:
    # A real process: the RecursionError was a traceback on the real command.
    env = tenure_env(seeded.dsn, seeded.schema)
    out = run_tenure(
        ["result", "put", "--key", SEEDED_KEY, "--token", str(seeded.token)],
        env,
        input="[" * 100_000 + "]" * 100_000,
    )
    assert "Traceback" not in out.stderr, out.stderr
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith("tenure: error: "), lines
    assert "nested" in lines[0] and "100 levels" in lines[0], lines
    assert out.returncode in (1, 2)
    seeded.check()


def test_result_put_nul_in_payload_is_refused_in_one_line(seeded: Seeded) -> None:
    env = tenure_env(seeded.dsn, seeded.schema)
    out = run_tenure(
        ["result", "put", "--key", SEEDED_KEY, "--token", str(seeded.token)],
        env,
        input='{"a": "x\\u0000y"}',
    )
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith("tenure: error: "), lines
    assert "NUL" in lines[0], lines
    assert out.returncode in (1, 2)
    seeded.check()


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--window", HUGE],
        ["outbox", "purge", "--older-than", HUGE],
        ["relay", "--timeout", HUGE, "--webhook", "a=http://127.0.0.1:9/"],
        ["jobs", "history", SEEDED_KEY, "--limit", "99999999999999999999"],
    ],
    ids=["status-window", "purge-older-than", "relay-timeout", "history-limit"],
)
def test_out_of_range_options_are_usage_errors(
    seeded: Seeded, cli_runner: CliRunner, args: list[str]
) -> None:
    result = cli_runner.invoke(cli, args)
    assert_refused(result)
    assert result.exit_code == 2, result.stderr
    message = error_lines(result.stderr)[-1]
    assert "36500d" in message or "100000" in message, message  # says what is allowed
    seeded.check()


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--window", HUGE],
        ["outbox", "purge", "--older-than", HUGE],
        ["relay", "--timeout", HUGE, "--webhook", "a=http://127.0.0.1:9/"],
        ["jobs", "history", SEEDED_KEY, "--limit", "99999999999999999999"],
    ],
    ids=["status-window", "purge-older-than", "relay-timeout", "history-limit"],
)
def test_out_of_range_options_in_one_line(
    seeded: Seeded, cli_runner: CliRunner, args: list[str]
) -> None:
    assert_one_line(cli_runner.invoke(cli, args), 2)


@pytest.mark.parametrize("payload", ["[" * 5000 + "]" * 5000, '{"a": "\\u0000"}'])
def test_refused_payloads_exit_2(seeded: Seeded, cli_runner: CliRunner, payload: str) -> None:
    args = ["result", "put", "--key", SEEDED_KEY, "--token", str(seeded.token)]
    assert_one_line(cli_runner.invoke(cli, args, input=payload), 2)


# -- schema names -----------------------------------------------------------------------------


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                psycopg.sql.Identifier(schema)
            )
        )


@pytest.mark.parametrize("name", ["t%b_pct", "t%s%%(x)s", "q\"u'o{te}", "é" * 31 + "%"])
def test_schema_with_percent_and_quotes_works_everywhere(dsn: str, name: str) -> None:
    try:
        with tenure.connect(dsn, schema=name, migrate=True) as client:
            lease = client.acquire("k", ttl=60)
            assert lease is not None
            client.results.put("k", {"v": 1}, token=lease.token)
            assert client.results.get("k") is not None
            with psycopg.connect(dsn) as conn, conn.transaction():
                tenure.fence(conn, "k", lease.token, schema=name)
                assert tenure.outbox.enqueue(conn, "t", "m1", {}, schema=name)
                assert tenure.inbox.claim(conn, "c", "m1", schema=name)
            assert [m.key for m in tenure.outbox.messages(client)] == ["m1"]
            _notified_on_channels(dsn, name)
            assert client.schema_version() is not None
            assert client.migrate() == []
    finally:
        _drop(dsn, name)


def _notified_on_channels(dsn: str, schema: str) -> None:
    """The outbox's and the scheduler's LISTEN/NOTIFY channels work for this schema: LISTEN
    as the relay and the worker do, then an enqueue and a pause notify them."""
    from tenure.db.channels import channel

    channels = {tenure.outbox.channel(schema), channel("jobs", schema)}
    assert all(len(c.encode()) <= 63 for c in channels), channels
    with psycopg.connect(dsn, autocommit=True) as listener:
        for name in channels:
            listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(name)))
        with psycopg.connect(dsn) as conn, conn.transaction():
            tenure.outbox.enqueue(conn, "t", "m2", {}, schema=schema)
        app = tenure.Scheduler(dsn, schema=schema)
        app.job("j", every="1h")(lambda ctx: None)
        app.register()
        heard = {n.channel for n in listener.notifies(timeout=5, stop_after=2)}
    assert heard == channels, (heard, channels)


def test_schema_name_is_limited_by_its_bytes_not_its_characters(dsn: str) -> None:
    name = "é" * 40  # 40 characters, 80 bytes: PostgreSQL would truncate it to 63 bytes
    with pytest.raises(tenure.InvalidArgument, match="80 bytes"):
        tenure.connect(dsn, schema=name)
    with pytest.raises(tenure.InvalidArgument, match="bytes"):
        tenure.Scheduler(schema=name)


def test_empty_schema_is_refused_by_scheduler_as_by_connect() -> None:
    with pytest.raises(tenure.InvalidArgument, match="empty"):
        tenure.connect(schema="")
    with pytest.raises(tenure.InvalidArgument, match="empty"):
        tenure.Scheduler(schema="")


# -- the library ------------------------------------------------------------------------------


def test_invalid_argument_is_the_documented_type() -> None:
    assert issubclass(tenure.InvalidArgument, tenure.TenureError)
    assert issubclass(tenure.InvalidArgument, ValueError)
    assert issubclass(tenure.InvalidArgumentType, tenure.InvalidArgument)
    assert issubclass(tenure.InvalidArgumentType, TypeError)


def test_lone_surrogate_key_is_invalid_argument(seeded: Seeded) -> None:
    with pytest.raises(tenure.InvalidArgument, match="surrogate"):
        seeded.client.acquire("\ud800")
    with pytest.raises(tenure.InvalidArgument, match="surrogate"):
        seeded.client.results.put("ok", {"a": "\udfff"}, token=1)
    seeded.check()


def test_nul_payload_is_invalid_argument_before_sql(seeded: Seeded) -> None:
    with pytest.raises(tenure.InvalidArgument, match="NUL"):
        seeded.client.results.put(SEEDED_KEY, {"a\x00": 1}, token=seeded.token)
    seeded.check()


def test_deep_payload_is_invalid_argument(seeded: Seeded) -> None:
    with pytest.raises(tenure.InvalidArgument, match="nested"):
        seeded.client.results.put(SEEDED_KEY, deep(5000), token=seeded.token)
    seeded.client.results.put("shallow", deep(99), token=_token(seeded, "shallow"))
    seeded.check()


def _token(seeded: Seeded, key: str) -> int:
    lease = seeded.client.acquire(key, ttl=60)
    assert lease is not None
    return lease.token


@pytest.mark.parametrize(
    "every",
    [math.nan, math.inf, -1.0, 10**400, "99999999999d"],
    ids=["nan", "inf", "negative", "10**400", "huge-days"],
)
def test_every_nan_inf_and_huge_are_invalid_argument(every: object) -> None:
    app = tenure.Scheduler()
    with pytest.raises(tenure.InvalidArgument, match="every"):
        app.job("k", every=every)(lambda ctx: None)  # type: ignore[arg-type]


def test_wrong_types_are_invalid_argument_type(dsn: str) -> None:
    with pytest.raises(tenure.InvalidArgumentType, match="connection"):
        tenure.fence("not a connection", "k", 1)  # type: ignore[arg-type]
    with pytest.raises(tenure.InvalidArgumentType, match="dsn"):
        tenure.connect(12345)  # type: ignore[arg-type]
    with pytest.raises(tenure.InvalidArgumentType, match="connection"):
        tenure.outbox.enqueue("x", "t", "k", {})  # type: ignore[arg-type]
    with pytest.raises(tenure.InvalidArgumentType, match="connection"):
        tenure.inbox.claim(None, "c", "k")  # type: ignore[arg-type]
    with pytest.raises(tenure.InvalidArgumentType, match="pool_size"):
        tenure.connect(dsn, pool_size=True)
    with pytest.raises(tenure.InvalidArgumentType, match="number of seconds"):
        tenure.parse_duration(None)  # type: ignore[arg-type]


# -- found while hardening --------------------------------------------------------------------


def test_exec_slot_with_undecodable_bytes_is_a_usage_error(seeded: Seeded) -> None:
    # argv bytes that are not UTF-8 arrive as lone surrogates (surrogateescape).
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tenure", "exec", "--key", "ok", "--slot", b"\xff", "--", "true"],
        env=tenure_env(seeded.dsn, seeded.schema),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in out.stderr, out.stderr
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1 and "--slot" in lines[0], out.stderr
    seeded.check()


def test_lease_on_lost_refuses_a_non_callable(seeded: Seeded) -> None:
    lease = seeded.client.acquire("on-lost", ttl=60)
    assert lease is not None
    with pytest.raises(tenure.InvalidArgumentType, match="callable"):
        lease.on_lost(42)  # type: ignore[arg-type]
    lease.release()  # a stored non-callable would have raised here, in the loss path
    seeded.check()


@pytest.mark.parametrize("seconds", [math.nan, "soon", -1, None], ids=repr)
def test_job_context_wait_refuses_what_is_not_a_duration(seconds: object) -> None:
    import asyncio
    import types

    async def make() -> tenure.JobContext:
        return tenure.JobContext(
            job_key="k",
            token=1,
            slot=dt.datetime.now(dt.UTC),
            kind="scheduled",
            attempt=1,
            # wait() reads only the lease's `lost` flag, and never the client (the context
            # reads its schema when it is made).
            lease=types.SimpleNamespace(lost=False),  # type: ignore[arg-type]
            client=types.SimpleNamespace(schema="tenure"),  # type: ignore[arg-type]
            worker_id="w",
        )

    ctx = asyncio.run(make())
    with pytest.raises(tenure.InvalidArgument):
        ctx.wait(seconds)  # type: ignore[arg-type]
    assert ctx.wait(0.01) is False


def test_worker_concurrency_beyond_the_limit_is_a_usage_error(
    seeded: Seeded, cli_runner: CliRunner
) -> None:
    args = ["worker", "tests.support.scheduler_apps:slow", "--concurrency", str(2**70)]
    result = cli_runner.invoke(cli, args)
    assert_refused(result)
    assert result.exit_code == 2 and "10000" in error_lines(result.stderr)[-1], result.stderr
    seeded.check()


def test_a_long_duration_string_is_refused_by_its_length() -> None:
    # The pattern's adjacent optional spaces backtracked quadratically: 20000 spaces took
    # seconds. Durations are short; longer text is refused before any pattern runs.
    with pytest.raises(tenure.InvalidArgument, match="too long"):
        tenure.parse_duration("1" + " " * 20_000 + "x")
    assert tenure.parse_duration("  1.5 m ") == 90.0
