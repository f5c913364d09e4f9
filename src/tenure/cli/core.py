"""The lease core's commands: demo, migrate, release, result put/get, embedded."""

from __future__ import annotations

import json
import os
import sys

import click

from .common import CONTEXT, EXIT_ERROR, connect, db_options, fail, handle_errors, setup_logs
from .params import DURATION, TOKEN, check_ttl_option
from .tables import printable

#: Set by `tenure exec` in its command's environment (with the token): the lease is held.
EXEC_MARK = "TENURE_LEASE_OWNER"


@click.command(context_settings=CONTEXT)
@db_options
@click.option(
    "--ttl",
    type=DURATION,
    default="2s",
    callback=check_ttl_option,
    envvar="TENURE_DEMO_TTL",
    show_envvar=True,
    help="Lease TTL the demo's executors use.",
)
@handle_errors
def demo(dsn: str | None, schema: str, log_level: str, log_format: str, ttl: float) -> None:
    """Run the acceptance scenario live: a paused executor cannot overwrite its successor.

    Executor A (a real process) takes the lease with token N and is frozen with SIGSTOP; its
    lease expires by the database clock; executor B takes token N+1 and writes its result;
    A is resumed and tries to write with token N: the write affects zero rows and is
    rejected. Exits 0 when the final result is B's, 1 otherwise.
    """
    from rich.console import Console

    from . import demo as scenario

    setup_logs(log_level, log_format)
    console = Console(highlight=False)
    ok = scenario.run(
        dsn, schema, ttl, lambda line: console.print(line, markup=False, soft_wrap=True)
    )
    sys.exit(0 if ok else 1)


@click.command(context_settings=CONTEXT)
@db_options
@handle_errors
def migrate(dsn: str | None, schema: str, log_level: str, log_format: str) -> None:
    """Create or upgrade tenure's tables (safe to run repeatedly and concurrently)."""
    setup_logs(log_level, log_format)
    from ..db import migrations

    with connect(dsn, schema) as client:
        applied = client.migrate()
        where = client.where
    if applied:
        click.echo(f"schema {schema!r} on {where}: applied {', '.join(map(str, applied))}")
    else:
        click.echo(f"schema {schema!r} on {where}: up to date (version {migrations.latest()})")


@click.command(context_settings=CONTEXT)
@db_options
@click.option(
    "--key",
    required=True,
    # Not TENURE_JOB_KEY: `tenure exec` sets that for its command, which must not expire
    # the lease it runs under by calling `tenure release` without naming a key.
    envvar="TENURE_RELEASE_KEY",
    show_envvar=True,
    help="Job key whose lease to expire.",
)
@handle_errors
def release(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Expire a stuck lease now (operator action). The token stays: the old holder's writes
    remain fenced, and the next acquire gets a higher token."""
    setup_logs(log_level, log_format)
    with connect(dsn, schema) as client:
        token = client.release(key)
        if not token and client.inspect(key) is None:
            fail(
                f"no lease was ever taken for {key!r}; `tenure status` shows the keys "
                "(is the key or --schema misspelled?)"
            )
    click.echo(
        f"{printable(key)}: expired token {token}" if token else f"{printable(key)}: no live lease"
    )


@click.group(context_settings=CONTEXT)
def result() -> None:
    """Read and write fenced results (e.g. from shell scripts run by `tenure exec`)."""


def _exec_holds(key: str, token: int, schema: str) -> bool:
    """Whether KEY and TOKEN are the lease of the enclosing `tenure exec` (which holds it while
    its command runs, so a write with them must not land once that lease is gone), however
    they were passed: from its environment or spelled out as options with the same values."""
    if not os.environ.get(EXEC_MARK):
        return False
    env = os.environ
    return (
        env.get("TENURE_JOB_KEY") == key
        and env.get("TENURE_FENCING_TOKEN", "").strip() == str(token)
        and env.get("TENURE_SCHEMA", "tenure") == schema
    )


@result.command("put", context_settings=CONTEXT)
@db_options
@click.option(
    "--key",
    required=True,
    envvar="TENURE_JOB_KEY",
    show_envvar=True,
    help="Job key the result belongs to.",
)
@click.option(
    "--token",
    required=True,
    type=TOKEN,
    envvar="TENURE_FENCING_TOKEN",
    show_envvar=True,
    help="Fencing token of this execution.",
)
@click.option(
    "--strict/--no-strict",
    default=None,
    envvar="TENURE_RESULT_STRICT",
    show_envvar=True,
    help="--strict: accept the write only while TOKEN is the newest takeover and its lease "
    "is unexpired (the rule of a fenced transaction). --no-strict: the seed's rule, the last "
    "accepted token wins (a late write is refused only once a newer token has written). "
    "[default: strict inside `tenure exec` when KEY and TOKEN are its own, whether read from "
    "$TENURE_JOB_KEY/$TENURE_FENCING_TOKEN or given as options; else --no-strict]",
)
@handle_errors
def result_put(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    key: str,
    token: int,
    strict: bool | None,
) -> None:
    """Store the JSON document on stdin as KEY's result, if TOKEN is not stale.

    Exits 1 with a message naming both tokens when the write is refused.
    """
    setup_logs(log_level, log_format)
    from ..validation import parse_json

    if strict is None:
        strict = _exec_holds(key, token, schema)

    # Bytes: json decodes UTF-8 (or -16/-32) itself, and bad bytes become a clear error.
    payload = parse_json(sys.stdin.buffer.read(), what="stdin")
    with connect(dsn, schema) as client:
        stored = client.results.put(key, payload, token=token, strict=strict)
    click.echo(f"{printable(key)}: stored with token {stored.token}")


@result.command("get", context_settings=CONTEXT)
@db_options
@click.option(
    "--key", required=True, envvar="TENURE_JOB_KEY", show_envvar=True, help="Job key to read."
)
@handle_errors
def result_get(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Print KEY's stored result as JSON: {"token", "written_at", "payload"}."""
    setup_logs(log_level, log_format)
    with connect(dsn, schema) as client:
        stored = client.results.get(key)
    if stored is None:
        click.echo(f"tenure: error: no result stored for {key!r}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(
        json.dumps(
            {
                "token": stored.token,
                "written_at": stored.written_at.isoformat(),
                "payload": stored.payload,
            }
        )
    )


@click.group(context_settings=CONTEXT)
def embedded() -> None:
    """The embedded PostgreSQL used when no DSN is given."""


@embedded.command("dsn", context_settings=CONTEXT)
@handle_errors
def embedded_dsn() -> None:
    """Start the embedded server if needed and print its DSN."""
    from ..db import embedded as emb

    click.echo(emb.dsn())


@embedded.command("stop", context_settings=CONTEXT)
@handle_errors
def embedded_stop() -> None:
    """Stop the embedded server (its data stays)."""
    from ..db import embedded as emb

    click.echo("stopped" if emb.stop() else "not running")
