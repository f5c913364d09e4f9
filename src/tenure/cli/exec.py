"""``tenure exec``: the command line (its options, ``--`` and usage errors); the run itself is
:mod:`tenure.exec.runner`."""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

import click

from ..exec.output import PROG
from ..exec.runner import EXIT_LEASE_LOST, EXIT_USAGE, ExecRequest, main, run_with_textfile
from ..exec.slots import check_period, check_slot
from .common import CONTEXT, db_options, error_line, setup_logs
from .logs import DRIVER_LOGGER
from .params import DURATION, POSITIVE_DURATION, check_ttl_option

EPILOG = f"""\b
Exit codes:
  0    the command exited 0; or the lease is busy (see --busy-exit); or the slot
       (--slot/--every) already completed on some host
  N    the command's own exit code; 128+N if it died of signal N (like a shell)
  1    tenure error: database unreachable, schema not migrated, a slot this role may
       not mark done, ... (command not run); or the command exited 0 but its slot
       could not be marked done (it may run again)
  2    bad usage: missing --, unknown option, bad duration
  {EXIT_LEASE_LOST}   the lease was lost while the command ran (renewal refused, or the
       database unreachable until the local deadline); the command was stopped, or,
       if it had already exited 0, its slot was not marked done
  126  the command was found but is not executable
  127  the command was not found

\b
The command's environment also has:
  TENURE_JOB_KEY, TENURE_FENCING_TOKEN   what `tenure result put` reads by default
                                         (strict inside exec: see `result put --help`)
  TENURE_LEASE_OWNER                     this execution's owner UUID
  TENURE_DSN, TENURE_SCHEMA              where the lease lives (resolved DSN)
  TENURE_SLOT                            the slot, with --slot/--every
and not this exec's own TENURE_EXEC_* settings: a nested `tenure exec` takes only
the options it is given (TENURE_JOB_KEY is not --key's twin: TENURE_EXEC_KEY is).

\b
Examples:
  tenure exec --key nightly-report -- ./report.sh
  */5 * * * *  tenure exec -q --key sync --every 5m -- /opt/sync/run
  echo '{{"rows": 42}}' | tenure result put      # inside the command: fenced write
"""


class UsageProblem(click.ClickException):
    """Bad usage, printed as one line (click's default adds the usage block)."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(error_line(f"{self.message} (see `{PROG} --help`)", PROG), err=True)


class ExecCommand(click.Command):
    """A command whose own options end at ``--``; everything after it is the command to run.

    Requiring ``--`` keeps the child's options (``ls -l``) from being read as ours.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            if not ctx.resilient_parsing and not any(a in ("-h", "--help") for a in args):
                raise UsageProblem(
                    "missing `--` before the command: "
                    "tenure exec --key KEY [OPTIONS] -- COMMAND [ARGS...]"
                )
            own, command = args, []
        else:
            split = args.index("--")
            own, command = args[:split], args[split + 1 :]
        try:
            rest = super().parse_args(ctx, own)
        except click.UsageError as exc:
            raise UsageProblem(exc.format_message()) from None
        if not command and not ctx.resilient_parsing:
            raise UsageProblem("no command after `--`")
        ctx.params["command"] = tuple(command)
        return rest

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[OPTIONS]", "--", "COMMAND", "[ARGS]..."]


def _check_every(ctx: click.Context, param: click.Parameter, value: float | None) -> int | None:
    from ..errors import InvalidArgument

    if value is None:
        return None
    try:
        return check_period(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _check_slot(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from ..errors import InvalidArgument

    if value is None:
        return None
    try:
        return check_slot(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _check_key(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from ..errors import InvalidArgument
    from ..validation import check_job_key

    try:
        return check_job_key(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("exec", cls=ExecCommand, context_settings=CONTEXT, epilog=EPILOG)
@db_options
@click.option(
    "--key",
    required=True,
    envvar="TENURE_EXEC_KEY",
    show_envvar=True,
    callback=_check_key,
    help="Job key: one lease (and token sequence) per key.",
)
@click.option(
    "--ttl",
    type=DURATION,
    default="30s",
    envvar="TENURE_EXEC_TTL",
    show_envvar=True,
    callback=check_ttl_option,
    help="Lease TTL: how long this host may go silent before another may take over. "
    "Renewed every ttl/3 while the command runs.",
)
@click.option(
    "--wait",
    type=DURATION,
    default=None,
    envvar="TENURE_EXEC_WAIT",
    show_envvar=True,
    help="When busy, keep trying to take the lease for this long (unset: try once).",
)
@click.option(
    "--grace",
    type=DURATION,
    default="10s",
    envvar="TENURE_EXEC_GRACE",
    show_envvar=True,
    help="After the lease is lost, or a SIGTERM, SIGINT or SIGQUIT was passed on to the "
    "command: time until SIGKILL to the command's group if it has not exited (a second such "
    "signal: SIGKILL at once).",
)
@click.option(
    "--busy-exit",
    type=click.IntRange(0, 255),
    default=0,
    envvar="TENURE_EXEC_BUSY_EXIT",
    show_envvar=True,
    help="Exit code when another execution holds the lease.",
)
@click.option(
    "--slot",
    default=None,
    envvar="TENURE_EXEC_SLOT",
    show_envvar=True,
    callback=_check_slot,
    help="Run once per slot (e.g. the CronJob's scheduled time): a slot that completed "
    "with exit 0 on any host exits 0 as 'already done'; a failed or lost one runs again. "
    "With --every: VALUE@<the period's slot> (e.g. eu@2026-12-04T04:35:00Z), once per "
    "VALUE and period.",
)
@click.option(
    "--every",
    type=DURATION,
    default=None,
    envvar="TENURE_EXEC_EVERY",
    show_envvar=True,
    callback=_check_every,
    help="Slot = the latest multiple of this period (UTC, from the epoch) by the database "
    "clock plus --early: hosts whose cron fires at or just before the boundary share a slot. "
    "Fire at the period's boundaries (e.g. */5 with 5m).",
)
@click.option(
    "--early",
    type=DURATION,
    default="2s",
    envvar="TENURE_EXEC_EARLY",
    show_envvar=True,
    help="With --every: how long before its time a slot may already run (a cron firing a "
    "moment early still runs the coming slot). Never more than half the period.",
)
@click.option(
    "--metrics-textfile",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    envvar="TENURE_EXEC_METRICS_TEXTFILE",
    show_envvar=True,
    help="After the run, write gauges about it (end time, duration, exit code, outcome, last "
    "success) to this file for node_exporter's textfile collector, e.g. "
    "/var/lib/node_exporter/textfile/KEY.prom.",
)
@click.option(
    "--retention",
    type=POSITIVE_DURATION,
    default="7d",
    envvar="TENURE_EXEC_RETENTION",
    show_envvar=True,
    help="After each run, prune a bounded amount of exec history older than this (finished "
    "runs; slots no run can name again). `tenure prune` does the rest on demand.",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    envvar="TENURE_EXEC_QUIET",
    show_envvar=True,
    help="Say nothing when busy or already done (errors are still printed).",
)
def exec_command(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    key: str,
    ttl: float,
    wait: float | None,
    grace: float,
    busy_exit: int,
    slot: str | None,
    every: int | None,
    early: float,
    retention: float,
    quiet: bool,
    metrics_textfile: str | None,
    command: tuple[str, ...],
) -> NoReturn:
    """Run COMMAND under the lease KEY, once at a time across hosts.

    Takes the lease (or exits as busy), starts COMMAND in its own process group with the
    fencing token in $TENURE_FENCING_TOKEN, renews the lease while it runs, and releases it
    when COMMAND ends, so a successor can start at once. If the lease is lost meanwhile,
    COMMAND's group gets SIGTERM, then SIGKILL after --grace, and tenure exits with 75.
    SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on to the group; a
    command that does not exit within --grace of a SIGTERM, SIGINT or SIGQUIT gets SIGKILL,
    and a second one of those SIGKILLs the group at once.
    Processes COMMAND leaves behind in its group are killed when it exits.

    Put `--` before COMMAND. Durations: 250ms, 30s, 5m, 1h.
    """
    setup_logs(log_level, log_format)
    # tenure's own renewal warnings already say the database is unreachable: psycopg_pool's
    # failed reconnections (routed like tenure's lines) only from ERROR, or with debug.
    if log_level != "debug":
        logging.getLogger(DRIVER_LOGGER).setLevel(logging.ERROR)
    request = ExecRequest(
        key=key,
        command=command,
        ttl=ttl,
        wait=wait,
        grace=grace,
        busy_exit=busy_exit,
        slot=slot,
        every=every,
        early=early,
        quiet=quiet,
        dsn=dsn,
        schema=schema,
        retention=retention,
    )
    if metrics_textfile is None:
        sys.exit(main(request))
    sys.exit(run_with_textfile(request, metrics_textfile))
