"""Looking at a deployment: status (every job, cluster-wide) and doctor (what is wrong)."""

from __future__ import annotations

import json
import sys

import click

from .common import (
    CONTEXT,
    connect,
    db_options,
    handle_errors,
    json_option,
    json_option_with,
    setup_logs,
)
from .params import POSITIVE_DURATION


@click.command(context_settings=CONTEXT)
@db_options
@json_option
@click.option(
    "--window",
    type=POSITIVE_DURATION,
    default="1h",
    envvar="TENURE_STATUS_WINDOW",
    show_envvar=True,
    help="Period the run counts and duration percentiles cover (runs started in it).",
)
@handle_errors
def status(
    dsn: str | None, schema: str, log_level: str, log_format: str, as_json: bool, window: float
) -> None:
    """Every job as the database sees it, whichever process did the work.

    Per job: lease holder token and expiry, last run and outcome, next slot, runs / failures /
    lost leases / stale rejections and duration p50/p95/p99 over --window (from the
    scheduler's run history), last result token. Every time is the database clock. First,
    which server answered (through HAProxy or a multi-host DSN, the member that is primary
    now) and its WAL timeline; --json has them in every row (answered_by, standby,
    timeline).
    """
    setup_logs(log_level, log_format)
    from ..observability.status import overview, server
    from ..scheduler.jobs import UNDEFINED

    with connect(dsn, schema) as client:
        answered = server(client)
        jobs = overview(client, window=window)
    if as_json:
        click.echo(json.dumps([{**job.as_json(), **answered.as_json()} for job in jobs], indent=2))
        return
    click.echo(answered.describe())
    if not jobs:
        click.echo("no leases or scheduled jobs yet")
        return
    from .tables import printable, show

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

    rows = []
    for job in jobs:
        lease = "-"
        if job.token is not None and job.seconds_left is not None:
            lease = f"held {job.seconds_left:.1f}s" if job.held else "free"
        last = "-"
        if job.last_run is not None:
            since = (job.now - job.last_run.started_at).total_seconds()
            outcome = job.last_run.outcome
            if job.last_run.exit_code not in (None, 0):
                outcome += f" (exit {job.last_run.exit_code})"
            last = f"{outcome} {ago(since)}"
        next_slot = "-"
        if job.next_slot is not None:
            due = (job.now - job.next_slot).total_seconds()
            next_slot = "due now" if due >= 0 else ago(due)
        if job.paused:
            next_slot = "quarantined" if job.quarantined is not None else "paused"
        if job.undefined:
            next_slot = UNDEFINED
        rows.append(
            (
                job.job_key,
                "-" if job.token is None else str(job.token),
                lease,
                last,
                next_slot,
                f"{job.runs}/{job.failures}/{job.lost_leases}/{job.stale_rejections}",
                f"{took(job.p50)} / {took(job.p95)} / {took(job.p99)}",
                "-" if job.result_token is None else str(job.result_token),
            )
        )
    show(
        (
            "job",
            "token",
            "lease",
            "last run",
            "next slot",
            "runs/fail/lost/stale",
            "p50 / p95 / p99",
            "result",
        ),
        rows,
        title=f"times: database clock; counts: last {window:g}s",
        right=("result",),
    )
    for job in jobs:
        if job.quarantined is not None:
            click.echo(f"{printable(job.job_key)}: {printable(job.quarantined)}")


@click.command("doctor", context_settings=CONTEXT)
@db_options
@json_option_with("Print JSON instead of text.")
@click.pass_context
@handle_errors
def doctor(
    ctx: click.Context, dsn: str | None, schema: str, log_level: str, log_format: str, as_json: bool
) -> None:
    """Check this host's set-up against the database.

    DSN (where it comes from, password hidden), connectivity, server version and role,
    schema version, privileges, who vacuums the scheduler's tables, whether shared_buffers
    holds the history pages the scheduled jobs keep hot, clock difference with the database
    (a warning only: tenure trusts the database clock), timeouts in force, and whether
    PgBouncer sits in between.

    Exits 1 if a check failed, 0 otherwise (warnings included).
    """
    from ..observability.doctor import FAIL, diagnose, render

    setup_logs(log_level, log_format)
    source = ctx.get_parameter_source("dsn")
    origin = "$TENURE_DSN" if source is click.core.ParameterSource.ENVIRONMENT else "--dsn"
    checks = diagnose(dsn, schema, origin=origin)
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        click.echo(
            json.dumps({"ok": not failed, "checks": [c.as_json() for c in checks]}, indent=2)
        )
    else:
        for line in render(checks):
            click.echo(line)
        click.echo("\n" + ("some checks FAILED" if failed else "no failures"))
    sys.exit(1 if failed else 0)
