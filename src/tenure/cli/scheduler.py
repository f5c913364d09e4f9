"""``tenure worker MODULE:ATTR`` and ``tenure jobs list|pause|resume|trigger|history``.

Registered by ``tenure.cli`` (import this module through it). Heavy imports stay inside the
command bodies.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from .common import (
    CONTEXT,
    connect,
    db_options,
    handle_errors,
    json_option,
    metrics_options,
    serve_from_cli,
    setup_logs,
)
from .params import CONCURRENCY, DURATION, LIMIT, QUEUE, retention_options
from .tables import printable

if TYPE_CHECKING:
    from ..scheduler.app import Scheduler


def load_app(path: str) -> Scheduler:
    """Import ``MODULE:ATTR`` (from the current directory too) and return the Scheduler.

    A malformed path is bad usage (:class:`InvalidArgument`, exit 2); an app that cannot be
    loaded (no such module or attribute, an import that fails, a bad job definition in its
    code) is a :class:`ConfigurationError` (exit 1): the command line was fine."""
    from ..errors import ConfigurationError, InvalidArgument
    from ..scheduler.app import Scheduler

    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(
            f"app {path!r} must look like MODULE:ATTRIBUTE, e.g. myapp.jobs:app (the module "
            "that creates the tenure.Scheduler and the name it is bound to)"
        )
    # Like `python -m`, find the app's module in the current directory.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"app {path!r}: no module named {exc.name!r} (searched the current directory "
                f"{cwd} and sys.path); check the spelling and where you run the worker from"
            ) from None
        raise ConfigurationError(f"app {path!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        if isinstance(exc, InvalidArgument):
            # A bad job definition (invalid cron, unknown time zone, duplicate key, ...).
            raise ConfigurationError(f"app {path!r}: {exc}") from exc
        raise ConfigurationError(
            f"app {path!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(
            f"app {path!r}: module {module_name!r} has no attribute {attr!r}"
        ) from None
    if not isinstance(app, Scheduler):
        raise ConfigurationError(
            f"app {path!r} is a {type(app).__name__}, not a tenure.Scheduler; point at the "
            "object created with `app = tenure.Scheduler()`"
        )
    return app


def _check_app_path(ctx: click.Context, param: click.Parameter, value: str) -> str:
    module_name, sep, attr = value.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(
            f"{value!r} must look like MODULE:ATTRIBUTE, e.g. myapp.jobs:app (the module that "
            "creates the tenure.Scheduler and the name it is bound to)"
        )
    return value


@click.command("worker", context_settings={**CONTEXT, "default_map": {"log_level": "info"}})
@db_options
@click.argument("app", envvar="TENURE_APP", callback=_check_app_path)
@click.option(
    "--concurrency",
    type=CONCURRENCY,
    default=None,
    envvar="TENURE_CONCURRENCY",
    show_envvar=True,
    help="Most job bodies running at once on this worker (sync ones each take a thread); "
    "runs claimed ahead of their slots and runs whose end is being recorded do not count. "
    "[default: the app's, 8]",
)
@click.option(
    "--claim-ahead",
    type=QUEUE,
    default=None,
    envvar="TENURE_CLAIM_AHEAD",
    show_envvar=True,
    help="Most claimed runs whose bodies have not begun (claimed ahead of their slots, kept "
    "for their next slots as runs end, being started, or waiting for a body slot); the worker "
    "claims nothing more while it has as many. [default: the app's, 10000]",
)
@click.option(
    "--finish-backlog",
    type=QUEUE,
    default=None,
    envvar="TENURE_FINISH_BACKLOG",
    show_envvar=True,
    help="Most ended runs whose end is not recorded yet (the finisher records them in "
    "batches); the worker claims nothing more while it has as many. [default: the app's, 1000]",
)
@click.option(
    "--shutdown-grace",
    type=DURATION,
    default=None,
    envvar="TENURE_SHUTDOWN_GRACE",
    show_envvar=True,
    help="On SIGTERM, how long running jobs may finish before they are cancelled and "
    "handed over. [default: the app's, 30s]",
)
@click.option(
    "--migrate",
    is_flag=True,
    envvar="TENURE_MIGRATE",
    show_envvar=True,
    help="Apply pending migrations before starting.",
)
@click.option(
    "--adopt",
    is_flag=True,
    envvar="TENURE_WORKER_ADOPT",
    show_envvar=True,
    help="Take over job keys that another app registered (without it the worker refuses to "
    "start rather than redefine them). The app is Scheduler(name=...), default APP as given.",
)
@click.option(
    "--vacuum-every",
    type=DURATION,
    default=None,
    envvar="TENURE_VACUUM_EVERY",
    show_envvar=True,
    help="How often to look whether the scheduler's own tables (one row per job, updated on "
    "every run) have gathered dead rows, and vacuum them if so; a busy scheduler's claims "
    "slow down without it. 0: leave them to autovacuum. Needs a role that owns the tables, "
    "else it says so once. [default: the app's, 5s]",
)
@retention_options
@metrics_options
@click.option(
    "--ui",
    "ui_on_metrics_port",
    is_flag=True,
    envvar="TENURE_WORKER_UI",
    show_envvar=True,
    help="Also serve the web dashboard (as `tenure ui`; needs the ui extra) on the metrics "
    "port: one port for /metrics, /healthz, /readyz and the dashboard (needs --metrics-port; "
    "binds --metrics-host). [default: no dashboard]",
)
@click.option(
    "--ui-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar="TENURE_WORKER_UI_PORT",
    show_envvar=True,
    help="Or serve the dashboard on a port of its own (0: any free port, printed). "
    "[default: no dashboard]",
)
@click.option(
    "--ui-host",
    default="127.0.0.1",
    envvar="TENURE_WORKER_UI_HOST",
    show_envvar=True,
    help="Address the dashboard binds to with --ui-port.",
)
@click.option(
    "--ui-token",
    default=None,
    envvar="TENURE_WORKER_UI_TOKEN",
    show_envvar=True,
    help="Credential the dashboard requires (HTTP Basic password or Bearer token; not asked "
    "of /metrics, /healthz, /readyz). Prefer the environment variable (a flag shows in ps).",
)
@click.option(
    "--ui-actions",
    is_flag=True,
    envvar="TENURE_WORKER_UI_ACTIONS",
    show_envvar=True,
    help="Enable the dashboard's pause, resume, trigger, release, retry and purge buttons "
    "(needs --ui-token). [default: read-only]",
)
@click.pass_context
@handle_errors
def worker_command(
    ctx: click.Context,
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    app: str,
    concurrency: int | None,
    claim_ahead: int | None,
    finish_backlog: int | None,
    shutdown_grace: float | None,
    migrate: bool,
    adopt: bool,
    vacuum_every: float | None,
    retention: float,
    inbox_retention: float,
    metrics_port: int | None,
    metrics_host: str,
    ui_on_metrics_port: bool,
    ui_port: int | None,
    ui_host: str,
    ui_token: str | None,
    ui_actions: bool,
) -> None:
    """Run the scheduled jobs of APP (MODULE:ATTRIBUTE, a tenure.Scheduler; or $TENURE_APP)
    until SIGTERM.

    Start it on as many hosts as you like: each slot of each job runs once, under a lease
    with a fencing token; a dead worker's slots are retried by the others. SIGTERM: stop
    claiming, let running jobs finish within --shutdown-grace, hand the rest over; a second
    SIGTERM cancels at once. A job whose runs keep killing their worker is quarantined
    (`tenure jobs list`; `tenure jobs resume KEY` lifts it). Job definitions belong to the
    app: another app's worker defining the same key refuses to start without --adopt.
    """
    if ui_on_metrics_port and ui_port is not None:
        raise click.UsageError(
            "--ui serves the dashboard on the metrics port, --ui-port on a port of its own: "
            "give one of them"
        )
    if ui_on_metrics_port and metrics_port is None:
        raise click.UsageError(
            "--ui serves the dashboard on the metrics port: give --metrics-port (or "
            "$TENURE_METRICS_PORT)"
        )
    if ui_actions and not (ui_on_metrics_port or ui_port is not None):
        raise click.UsageError("--ui-actions needs the dashboard: give --ui or --ui-port")
    if ui_actions and not ui_token:
        raise click.UsageError(
            "--ui-actions needs a credential: set --ui-token or $TENURE_WORKER_UI_TOKEN"
        )
    from . import logs

    logs.setup(log_level, log_format)
    scheduler = load_app(app)
    scheduler.default_name = app  # the app's name unless Scheduler(name=...) gives one

    # Operator settings win over the app's, but only when actually given.
    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT

    if given("dsn"):
        scheduler.dsn = dsn
    if given("schema"):
        scheduler.schema = schema
    if migrate:
        scheduler.migrate = True
    if vacuum_every is not None:
        scheduler.vacuum_every = vacuum_every
    if claim_ahead is not None:
        scheduler.claim_ahead = claim_ahead
    if finish_backlog is not None:
        scheduler.finish_backlog = finish_backlog
    if given("retention") or given("inbox_retention"):
        from ..db.retention import Retention

        scheduler.retention = Retention.of(
            retention if given("retention") else scheduler.retention.history,
            inbox_retention if given("inbox_retention") else scheduler.retention.inbox,
        )
    dashboard = None
    if ui_on_metrics_port and metrics_port is not None:  # (both, as checked above)
        from .ui import serve_dashboard_with_metrics

        dashboard = serve_dashboard_with_metrics(
            dsn=scheduler.dsn,
            schema=scheduler.schema,
            host=metrics_host,
            port=metrics_port,
            actions=ui_actions,
            token=ui_token,
            check=not migrate,  # the worker migrates first: nothing to warn about
        )
    else:
        serve_from_cli(metrics_port, metrics_host, dsn=scheduler.dsn, schema=scheduler.schema)
    if ui_port is not None:
        from ..ui.server import BackgroundServer
        from .ui import start_dashboard

        built, sock = start_dashboard(
            dsn=scheduler.dsn,
            schema=scheduler.schema,
            host=ui_host,
            port=ui_port,
            actions=ui_actions,
            token=ui_token,
            check=not migrate,
            flags="--ui-port (0: any free port) or --ui-host",
        )
        dashboard = BackgroundServer(built.app, sock).start()
    from ..scheduler import collector

    collector.settle()  # this process is the worker: the collector is ours to tune
    try:
        scheduler.run(concurrency=concurrency, shutdown_grace=shutdown_grace, adopt=adopt)
    finally:
        if dashboard is not None:
            dashboard.close()
    if scheduler.left_behind:
        # A job body that did not stop still runs in this process (a thread, a task, an
        # executor thread that interpreter exit would join): the worker said it stopped, so
        # the process ends now. Its runs are recorded 'abandoned' and handed over.
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@click.group("jobs", context_settings=CONTEXT)
def jobs_group() -> None:
    """Scheduled jobs: list them, pause, resume, trigger, remove, read their run history.

    Works from any host; every worker sees the change at once (LISTEN/NOTIFY).
    """


def _client(dsn: str | None, schema: str, log_level: str, log_format: str) -> Any:
    setup_logs(log_level, log_format)
    return connect(dsn, schema)


def _when(value: Any) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


@jobs_group.command("list", context_settings=CONTEXT)
@db_options
@json_option
@handle_errors
def jobs_list(dsn: str | None, schema: str, log_level: str, log_format: str, as_json: bool) -> None:
    """Every scheduled job: schedule, state, next slot, last outcome (database clock)."""
    from ..scheduler.jobs import list_jobs

    with _client(dsn, schema, log_level, log_format) as client:
        found = list_jobs(client)
    if as_json:
        click.echo(json.dumps([job.as_json() for job in found], indent=2))
        return
    if not found:
        click.echo("no scheduled jobs yet (a worker registers its app's jobs when it starts)")
        return
    from .tables import show

    rows = []
    for job in found:
        rows.append(
            (
                job.job_key,
                job.schedule,
                job.state,
                _when(job.next_slot),
                str(job.token or "-"),
                f"{job.last_outcome} ({_when(job.last_slot)})" if job.last_outcome else "-",
            )
        )
    show(("job", "schedule", "state", "next slot (db)", "token", "last outcome"), rows)
    for job in found:
        if job.quarantined is not None:
            click.echo(f"{printable(job.job_key)}: {printable(job.quarantined)}")


@jobs_group.command("pause", context_settings=CONTEXT)
@db_options
@click.argument("key")
@handle_errors
def jobs_pause(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Pause KEY on every worker: no new runs (a running one finishes)."""
    from ..db.channels import channel
    from ..scheduler.jobs import pause

    with _client(dsn, schema, log_level, log_format) as client:
        changed = pause(client, key, channel=channel("jobs", schema))
    click.echo(f"{printable(key)}: paused" if changed else f"{printable(key)}: was already paused")


@jobs_group.command("resume", context_settings=CONTEXT)
@db_options
@click.argument("key")
@handle_errors
def jobs_resume(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Resume KEY from now on (slots that passed while it was paused are not run).

    Also lifts a quarantine (a job paused because its runs kept killing their workers):
    deploy the fix first.
    """
    from ..db.channels import channel
    from ..scheduler.jobs import resume

    with _client(dsn, schema, log_level, log_format) as client:
        done = resume(client, key, channel=channel("jobs", schema))
    if done is None:
        click.echo(f"{printable(key)}: was not paused")
    else:
        lifted = "quarantine lifted, " if done.quarantine is not None else ""
        click.echo(f"{printable(key)}: {lifted}resumed, next slot {done.next_slot.isoformat()}")


@jobs_group.command("trigger", context_settings=CONTEXT)
@db_options
@click.argument("key")
@handle_errors
def jobs_trigger(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Run KEY once now, on whichever worker claims it first."""
    from ..db.channels import channel
    from ..scheduler.jobs import trigger

    with _client(dsn, schema, log_level, log_format) as client:
        done = trigger(client, key, channel=channel("jobs", schema))
    note = " (a trigger was already pending: one run)" if done.already_pending else ""
    if done.paused:
        note += "; the job is paused: it runs when resumed"
    click.echo(f"{printable(key)}: triggered at {done.at.isoformat()}{note}")


@jobs_group.command("remove", context_settings=CONTEXT)
@db_options
@click.argument("key")
@handle_errors
def jobs_remove(dsn: str | None, schema: str, log_level: str, log_format: str, key: str) -> None:
    """Delete KEY's definition: a job removed from the code ("no worker defines it").

    Refused while a live worker of the job's app defines it or its lease is live. Its lease
    and token stay: if KEY is defined again, its tokens continue above the old ones. Its
    history stays until retention.
    """
    from ..db.channels import channel
    from ..scheduler.jobs import remove

    with _client(dsn, schema, log_level, log_format) as client:
        done = remove(client, key, channel=channel("jobs", schema))
    floor = "" if done.token is None else f" (its tokens stay above {done.token})"
    click.echo(f"{printable(key)}: removed{floor}")


@jobs_group.command("history", context_settings=CONTEXT)
@db_options
@click.argument("key")
@click.option(
    "--limit",
    type=LIMIT,
    default=20,
    envvar="TENURE_LIMIT",
    show_envvar=True,
    help="How many rows, newest first.",
)
@json_option
@handle_errors
def jobs_history(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    key: str,
    limit: int,
    as_json: bool,
) -> None:
    """KEY's run history, newest first: slot, token, outcome, worker host and pid."""
    from ..scheduler.jobs import history

    with _client(dsn, schema, log_level, log_format) as client:
        rows = history(client, key, limit=limit)
    if as_json:
        click.echo(json.dumps([row.as_json() for row in rows], indent=2))
        return
    from .tables import show

    if not rows:
        click.echo(f"{printable(key)}: no runs recorded")
        return
    show(
        ("slot (db)", "kind", "token", "outcome", "started", "finished", "worker", "error"),
        [
            (
                _when(row.slot),
                row.kind if row.attempt == 1 else f"{row.kind} #{row.attempt}",
                str(row.token),
                row.outcome if row.slots == 1 else f"{row.outcome} x{row.slots}",
                _when(row.started_at),
                _when(row.finished_at),
                f"{row.host}:{row.pid}",
                row.error or "",
            )
            for row in rows
        ],
        title=f"{key}: newest first",
    )


# Declared types for tenure.cli, which imports these back (mypy cannot infer decorated names
# across the import cycle).
worker: click.Command = worker_command
jobs: click.Group = jobs_group
