"""The ``tenure`` command. Every option has a ``TENURE_*`` environment twin, shown in --help.

Heavy imports (psycopg, rich) happen inside the commands that need them, so that
``tenure exec`` in a crontab starts fast.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "show_default": True}

EXIT_ERROR = 1


def db_options(fn: F) -> F:
    """--dsn, --schema and the logging options, shared by every command that talks to the DB."""
    fn = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        envvar="TENURE_LOG_FORMAT",
        show_envvar=True,
        help="Log line format on stderr.",
    )(fn)
    fn = click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="warning",
        envvar="TENURE_LOG_LEVEL",
        show_envvar=True,
        help="Least severe log level shown.",
    )(fn)
    fn = click.option(
        "--schema",
        default="tenure",
        envvar="TENURE_SCHEMA",
        show_envvar=True,
        help="PostgreSQL schema holding tenure's tables.",
    )(fn)
    fn = click.option(
        "--dsn",
        default=None,
        envvar="TENURE_DSN",
        show_envvar=True,
        help="PostgreSQL connection string. Unset: $DATABASE_URL, else the embedded server."
        " Behind PgBouncer in transaction mode, also set TENURE_PREPARE_THRESHOLD=none.",
    )(fn)
    return fn


def json_option_with(help_text: str) -> Callable[[F], F]:
    """--json (and $TENURE_JSON) for commands that can print machine-readable output."""
    return click.option(
        "--json", "as_json", is_flag=True, envvar="TENURE_JSON", show_envvar=True, help=help_text
    )


def json_option(fn: F) -> F:
    return json_option_with("Print JSON instead of a table.")(fn)


def handle_errors(fn: F) -> F:
    """Turn tenure errors into one line on stderr and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from .errors import TenureError

        try:
            return fn(*args, **kwargs)
        except TenureError as exc:
            click.echo(f"tenure: error: {exc}", err=True)
            sys.exit(EXIT_ERROR)

    return wrapper  # type: ignore[return-value]


def _setup_logs(log_level: str, log_format: str) -> None:
    from . import logs

    logs.setup(log_level, log_format)


def _connect(dsn: str | None, schema: str) -> Any:
    import tenure

    return tenure.connect(dsn, schema=schema)


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="tenure")
def cli() -> None:
    """tenure: scheduled jobs that stay correct when several instances run them.

    PostgreSQL leases with fencing tokens: every takeover of a job increments its token, and
    every fenced write refuses tokens older than the last one accepted, so an executor that
    was paused past its lease can never commit a result older than its successor's.

    \b
    Start here:
      tenure demo                      the seed scenario, live (embedded PostgreSQL if no DSN)
      tenure migrate                   create or upgrade tenure's tables
      tenure exec --key K -- CMD       run a command under a fenced lease (cron, k8s, systemd)
      tenure worker myapp:app          run a tenure.Scheduler's cron jobs, once per slot
      tenure relay --webhook T=URL     deliver outbox messages, at least once
      tenure status                    every job: holder token, expiry, runs, failures, p95
      tenure doctor                    check DSN, connectivity, schema, clocks, PgBouncer
    """


@cli.command(context_settings=CONTEXT)
@db_options
@click.option(
    "--ttl",
    default="2s",
    envvar="TENURE_DEMO_TTL",
    show_envvar=True,
    help="Lease TTL the demo's executors use.",
)
@handle_errors
def demo(dsn: str | None, schema: str, log_level: str, log_format: str, ttl: str) -> None:
    """Run the acceptance scenario live: a paused executor cannot overwrite its successor.

    Executor A (a real process) takes the lease with token N and is frozen with SIGSTOP; its
    lease expires by the database clock; executor B takes token N+1 and writes its result;
    A is resumed and tries to write with token N: the write affects zero rows and is
    rejected. Exits 0 when the final result is B's, 1 otherwise.
    """
    from rich.console import Console

    from . import demo as scenario
    from .validation import check_ttl

    _setup_logs(log_level, log_format)
    console = Console(highlight=False)
    ok = scenario.run(
        dsn, schema, check_ttl(ttl), lambda line: console.print(line, markup=False, soft_wrap=True)
    )
    sys.exit(0 if ok else 1)


@cli.command(context_settings=CONTEXT)
@db_options
@handle_errors
def migrate(dsn: str | None, schema: str, log_level: str, log_format: str) -> None:
    """Create or upgrade tenure's tables (safe to run repeatedly and concurrently)."""
    _setup_logs(log_level, log_format)
    from . import migrations

    with _connect(dsn, schema) as client:
        applied = client.migrate()
        where = client.where
    if applied:
        click.echo(f"schema {schema!r} on {where}: applied {', '.join(map(str, applied))}")
    else:
        click.echo(f"schema {schema!r} on {where}: up to date (version {migrations.latest()})")


@cli.command(context_settings=CONTEXT)
@db_options
@json_option
@click.option(
    "--window",
    default="1h",
    envvar="TENURE_STATUS_WINDOW",
    show_envvar=True,
    help="Period the run counts and duration percentiles cover (runs started in it).",
)
@handle_errors
def status(
    dsn: str | None, schema: str, log_level: str, log_format: str, as_json: bool, window: str
) -> None:
    """Every job as the database sees it, whichever process did the work.

    Per job: lease holder token and expiry, last run and outcome, next slot, runs / failures /
    lost leases / stale rejections and duration p50/p95/p99 over --window (from the
    scheduler's run history), last result token. Every time is the database clock.
    """
    _setup_logs(log_level, log_format)
    from .errors import InvalidArgument
    from .status import overview
    from .validation import parse_duration

    seconds = parse_duration(window, what="--window")
    if seconds <= 0:
        raise InvalidArgument(f"--window must be positive, got {window!r}")
    with _connect(dsn, schema) as client:
        jobs = overview(client, window=seconds)
    if as_json:
        click.echo(json.dumps([job.as_json() for job in jobs], indent=2))
        return
    if not jobs:
        click.echo("no leases or scheduled jobs yet")
        return
    from rich.console import Console
    from rich.table import Table

    def took(value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value * 1000:.3g}ms" if value < 1 else f"{value:.3g}s"

    def ago(seconds: float) -> str:
        """Compact relative time (the table has to fit 80 columns)."""
        n = abs(seconds)
        if n < 60:
            text = f"{n:.1f}s"
        elif n < 3600:
            text = f"{n / 60:.0f}m"
        elif n < 86400:
            text = f"{n / 3600:.1f}h"
        else:
            text = f"{n / 86400:.1f}d"
        return f"{text} ago" if seconds >= 0 else f"in {text}"

    from rich import box

    terminal = sys.stdout.isatty()
    # A rich table on a terminal; plain aligned text when piped (grep, awk, a file).
    table = Table(
        title=f"times: database clock; counts: last {window}",
        title_justify="left",
        box=box.HEAVY_HEAD if terminal else None,
    )
    table.add_column("job", no_wrap=True)
    for name in (
        "token",
        "lease",
        "last run",
        "next slot",
        "runs/fail/lost/stale",
        "p50 / p95 / p99",
    ):
        table.add_column(name, no_wrap=True)
    table.add_column("result", justify="right")
    for job in jobs:
        lease = "-"
        if job.token is not None and job.seconds_left is not None:
            lease = f"held {job.seconds_left:.1f}s" if job.held else "free"
        last = "-"
        if job.last_run is not None:
            since = (job.now - job.last_run.started_at).total_seconds()
            last = f"{job.last_run.outcome} {ago(since)}"
        next_slot = "-"
        if job.next_slot is not None:
            due = (job.now - job.next_slot).total_seconds()
            next_slot = "due now" if due >= 0 else ago(due)
        if job.paused:
            next_slot = "paused"
        table.add_row(
            job.job_key,
            "-" if job.token is None else str(job.token),
            lease,
            last,
            next_slot,
            f"{job.runs}/{job.failures}/{job.lost_leases}/{job.stale_rejections}",
            f"{took(job.p50)} / {took(job.p95)} / {took(job.p99)}",
            "-" if job.result_token is None else str(job.result_token),
        )
    # Piped: no terminal width to fit, so do not wrap cells.
    Console(width=None if terminal else 200).print(table)


@cli.command(context_settings=CONTEXT)
@db_options
@click.option(
    "--key",
    required=True,
    envvar="TENURE_JOB_KEY",
    show_envvar=True,
    help="Job key whose lease to expire.",
)
@handle_errors
def release(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Expire a stuck lease now (operator action). The token stays: the old holder's writes
    remain fenced, and the next acquire gets a higher token."""
    _setup_logs(log_level, log_format)
    with _connect(dsn, schema) as client:
        token = client.release(key)
    click.echo(f"{key}: expired token {token}" if token else f"{key}: no live lease")


@cli.group(context_settings=CONTEXT)
def result() -> None:
    """Read and write fenced results (e.g. from shell scripts run by `tenure exec`)."""


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
    type=int,
    envvar="TENURE_FENCING_TOKEN",
    show_envvar=True,
    help="Fencing token of this execution.",
)
@handle_errors
def result_put(
    dsn: str | None, schema: str, log_level: str, log_format: str, key: str, token: int
) -> None:
    """Store the JSON document on stdin as KEY's result, if TOKEN is not stale.

    Exits 1 with a message naming both tokens when a newer token was accepted.
    """
    _setup_logs(log_level, log_format)
    from .errors import InvalidArgument

    text = sys.stdin.read()
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"stdin is not a JSON document: {exc}") from None
    with _connect(dsn, schema) as client:
        stored = client.results.put(key, payload, token=token)
    click.echo(f"{key}: stored with token {stored.token}")


@result.command("get", context_settings=CONTEXT)
@db_options
@click.option(
    "--key", required=True, envvar="TENURE_JOB_KEY", show_envvar=True, help="Job key to read."
)
@handle_errors
def result_get(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Print KEY's stored result as JSON: {"token", "written_at", "payload"}."""
    _setup_logs(log_level, log_format)
    with _connect(dsn, schema) as client:
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


@cli.group(context_settings=CONTEXT)
def embedded() -> None:
    """The embedded PostgreSQL used when no DSN is given."""


@embedded.command("dsn", context_settings=CONTEXT)
@handle_errors
def embedded_dsn() -> None:
    """Start the embedded server if needed and print its DSN."""
    from . import embedded as emb

    click.echo(emb.dsn())


@embedded.command("stop", context_settings=CONTEXT)
@handle_errors
def embedded_stop() -> None:
    """Stop the embedded server (its data stays)."""
    from . import embedded as emb

    click.echo("stopped" if emb.stop() else "not running")


# -- commands defined in their own modules (one line each: import, then add_command) -------
from .exec_command import exec_command  # noqa: E402

cli.add_command(exec_command)
from .outbox_command import outbox, relay  # noqa: E402

cli.add_command(relay)
cli.add_command(outbox)
from .scheduling.commands import jobs, worker  # noqa: E402

cli.add_command(worker)
cli.add_command(jobs)
from .doctor import doctor  # noqa: E402

cli.add_command(doctor)


def main() -> None:
    cli()
