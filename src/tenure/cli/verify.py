"""``tenure verify``: the fault-injection workload and checker against the user's own
deployment (the machinery is :mod:`tenure.verify`; this module is only the command line).

Its usage errors are one line and exit 2, like ``tenure exec``'s.

Exit status: 0 PASS, 1 FAIL (or an error that prevented a verdict), 2 usage error,
130 interrupted by Ctrl-C before any violation was found (a partial PASS is not a PASS).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from ..errors import one_line
from .common import CONTEXT, setup_logs

EXIT_PASS, EXIT_FAIL, EXIT_INTERRUPTED = 0, 1, 130


EPILOG = """\b
Examples:
  tenure verify --dsn postgresql://app@db/app --duration 2m
  tenure verify --dsn postgresql://app@db/app --through postgresql://app@pgbouncer:6432/app
  tenure verify --duration 30s --report verify.html --json verify.json
  tenure verify --unsafe-no-fence --duration 30s    # see the checker catch stale writes

\b
What it needs: a role that may CREATE a schema in the database (the run's own, named
tenure_verify_<random>, dropped afterwards). The terminate fault also needs
pg_signal_backend (or superuser); without it that fault is skipped and reported so.
It never touches other schemas and never restarts a server."""


def _duration(what: str, *, minimum: float = 0.0) -> Any:
    def convert(ctx: click.Context, param: click.Parameter, value: str) -> float:
        from ..errors import InvalidArgument
        from ..validation import parse_duration

        try:
            seconds = parse_duration(value, what=what)
        except InvalidArgument as exc:
            raise click.BadParameter(str(exc)) from None
        if seconds <= minimum:
            raise click.BadParameter(f"{what} must be more than {minimum:g}s, got {value!r}")
        return seconds

    return convert


def _ttl(ctx: click.Context, param: click.Parameter, value: str) -> float:
    from ..errors import InvalidArgument
    from ..validation import check_ttl

    try:
        return check_ttl(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _faults(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    from ..errors import InvalidArgument
    from ..verify.config import parse_faults

    try:
        return parse_faults(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _report_path(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if path.suffix.lower() not in (".html", ".htm", ".json"):
        raise click.BadParameter(f"{value!r}: name it .html (a page) or .json")
    if not path.parent.is_dir():
        raise click.BadParameter(f"{value!r}: directory {str(path.parent)!r} does not exist")
    return path


@click.command("verify", context_settings=CONTEXT, epilog=EPILOG)
@click.option(
    "--dsn",
    default=None,
    envvar="TENURE_DSN",
    show_envvar=True,
    help="The database to verify (the checker reads it directly). Unset: $DATABASE_URL, "
    "else the embedded server.",
)
@click.option(
    "--through",
    default=None,
    metavar="URL",
    envvar="TENURE_VERIFY_THROUGH",
    show_envvar=True,
    help="Run the workers through this pooler (PgBouncer, RDS Proxy...) in front of the "
    "same database; prepared statements are turned off for them.",
)
@click.option(
    "--duration",
    default="60s",
    envvar="TENURE_VERIFY_DURATION",
    show_envvar=True,
    callback=_duration("--duration"),
    help="How long the workload runs under faults (250ms, 30s, 2m...).",
)
@click.option(
    "--workers",
    default=6,
    type=click.IntRange(1, 64),
    envvar="TENURE_VERIFY_WORKERS",
    show_envvar=True,
    help="Worker processes; every third one runs the scheduler's claim path, the others "
    "library leases with fenced writes.",
)
@click.option(
    "--keys",
    default=3,
    type=click.IntRange(1, 100),
    envvar="TENURE_VERIFY_KEYS",
    show_envvar=True,
    help="Job keys the workers compete for (and scheduled jobs each scheduler worker runs).",
)
@click.option(
    "--ttl",
    default="1s",
    envvar="TENURE_VERIFY_TTL",
    show_envvar=True,
    callback=_ttl,
    help="Lease TTL of the workload. Short TTLs make more takeovers per minute.",
)
@click.option(
    "--faults",
    default="pause,kill,terminate",
    envvar="TENURE_VERIFY_FAULTS",
    show_envvar=True,
    callback=_faults,
    help="Comma-separated faults: pause (SIGSTOP a worker past its TTL), kill (SIGKILL), "
    "terminate (pg_terminate_backend its connections), or none.",
)
@click.option(
    "--report",
    "report_path",
    default=None,
    metavar="FILE",
    envvar="TENURE_VERIFY_REPORT",
    show_envvar=True,
    callback=_report_path,
    help="Also write the report here: FILE.html (self-contained page with the timeline) or "
    "FILE.json.",
)
@click.option(
    "--json",
    "json_path",
    default=None,
    metavar="FILE",
    envvar="TENURE_VERIFY_JSON",
    show_envvar=True,
    callback=_report_path,
    help="Also write the report as JSON here.",
)
@click.option(
    "--keep",
    is_flag=True,
    envvar="TENURE_VERIFY_KEEP",
    show_envvar=True,
    help="Keep the run's schema and worker logs for inspection instead of dropping them.",
)
@click.option(
    "--seed",
    default=None,
    type=int,
    envvar="TENURE_VERIFY_SEED",
    show_envvar=True,
    help="Seed of the workload's and the nemesis' random choices (default: random, printed).",
)
@click.option(
    "--unsafe-no-fence",
    is_flag=True,
    envvar="TENURE_VERIFY_UNSAFE_NO_FENCE",
    show_envvar=True,
    help="Deliberately broken workload: write without the fence and let the last writer win. "
    "Must FAIL: it shows the checker catching stale writes.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    envvar="TENURE_LOG_LEVEL",
    show_envvar=True,
    help="Least severe log level shown.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="TENURE_LOG_FORMAT",
    show_envvar=True,
    help="Log line format on stderr.",
)
def verify_command(
    dsn: str | None,
    through: str | None,
    duration: float,
    workers: int,
    keys: int,
    ttl: float,
    faults: tuple[str, ...],
    report_path: Path | None,
    json_path: Path | None,
    keep: bool,
    seed: int | None,
    unsafe_no_fence: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Prove tenure's guarantee on your own deployment: database, pooler, TTLs.

    Runs worker processes that take leases, write fenced results and ledger rows on their
    own connections and run scheduled jobs, while a nemesis pauses them past their TTL,
    kills them and terminates their connections. Then a checker reads what the database
    recorded and checks every invariant: no two live holders by the database clock, tokens
    strictly increasing and never reissued, no stale commit after a successor's takeover,
    no zero-row write counted as success, no renewal reviving an expired lease.

    Everything happens in a throwaway schema of its own, dropped afterwards. Prints
    progress on stderr, then the counts, the timing margins, on a FAIL the shortest history
    excerpt that shows the violation, and a last line `verdict: PASS` or `verdict: FAIL`.
    Exit status: 0 PASS, 1 FAIL, 2 usage error, 130 interrupted (Ctrl-C stops the workers,
    drops the schema and prints a partial verdict).
    """
    from ..errors import TenureError
    from ..verify import Progress, VerifyConfig, run

    setup_logs(log_level, log_format)
    stop = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # the second Ctrl-C: skip the check (still cleans up)
        stop.set()
        click.echo(
            "interrupted: stopping the workers, checking what ran and dropping the schema "
            "(Ctrl-C again to skip the check)",
            err=True,
        )

    def on_progress(p: Progress) -> None:
        click.echo(
            f"[{p.elapsed:5.1f}s/{p.duration:g}s] operations {p.ops}, faults {p.faults}, "
            f"takeovers {p.takeovers}, stale writes refused {p.stale_refused}",
            err=True,
        )

    cfg = VerifyConfig(
        dsn=dsn,
        through=through,
        duration=duration,
        workers=workers,
        keys=keys,
        ttl=ttl,
        faults=faults,
        fenced=not unsafe_no_fence,
        keep=keep,
        seed=seed,
    )
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        result = run(cfg, stop=stop, on_progress=on_progress)
    except TenureError as exc:
        click.echo(f"tenure: error: {one_line(str(exc))}", err=True)
        sys.exit(EXIT_FAIL)
    except KeyboardInterrupt:
        click.echo(
            "tenure: error: interrupted twice: no verdict (the schema was dropped)", err=True
        )
        sys.exit(EXIT_INTERRUPTED)
    finally:
        signal.signal(signal.SIGINT, previous)
    for path in (report_path, json_path):
        if path is None:
            continue
        is_html = path.suffix.lower() in (".html", ".htm") and path is report_path
        path.write_text(result.to_html() if is_html else result.to_json(), encoding="utf-8")
    click.echo(result.text())
    if not result.passed:
        sys.exit(EXIT_FAIL)
    sys.exit(EXIT_INTERRUPTED if result.partial else EXIT_PASS)
