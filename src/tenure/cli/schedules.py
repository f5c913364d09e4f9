"""``tenure schedules``: runtime schedules (issue 27, docs/schedules.md) from the command line:
add, update, remove, list, show, backfill. Each change is one statement that records who made
it and notifies every worker; refused input is one line (exit 2) and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .common import CONTEXT, connect, db_options, handle_errors, json_option, setup_logs
from .params import DURATION, LIMIT, POSITIVE_DURATION
from .tables import printable

F = TypeVar("F", bound=Callable[..., Any])

OVERLAPS = click.Choice(["skip", "buffer_one"])
MISFIRES = click.Choice(["latest", "all", "skip"])
IF_EXISTS = click.Choice(["error", "keep", "replace"])


def _env(name: str) -> str:
    return f"TENURE_SCHEDULE_{name.upper().replace('-', '_')}"


def definition_options(fn: F) -> F:
    """The options of a definition (add and update share them; update's are all optional)."""
    options: list[tuple[str, dict[str, Any]]] = [
        ("task", {"help": "The task to run (registered with @app.task)."}),
        ("every", {"type": POSITIVE_DURATION, "help": "Run every D (30s, 5m, 1h, 1d)."}),
        ("cron", {"help": "Run on this cron expression (five fields, or @daily...)."}),
        ("tz", {"help": "Time zone of --cron and of times without an offset (IANA name)."}),
        ("at", {"help": "Run once at this time (ISO 8601)."}),
        ("args", {"help": "The run's ctx.args: a JSON object."}),
        ("start", {"help": "No slot before this time (ISO 8601)."}),
        ("end", {"help": "No slot after this time (ISO 8601)."}),
        ("jitter", {"type": DURATION, "help": "Move each slot later by a stable offset below D."}),
        ("max-runs", {"type": click.IntRange(1, 2**31 - 1), "help": "No slot after N runs."}),
        (
            "overlap",
            {"type": OVERLAPS, "help": "A slot while the last run still goes: skip or run once."},
        ),
        ("misfire", {"type": MISFIRES, "help": "Slots missed while no worker ran."}),
        (
            "catch-up",
            {"type": DURATION, "help": "How late a missed slot may still run (misfire grace)."},
        ),
        ("ttl", {"type": POSITIVE_DURATION, "help": "The run's lease TTL."}),
        ("app", {"help": "The app whose workers run it (default: the one with the task)."}),
    ]
    for name, extra in reversed(options):
        fn = click.option(
            f"--{name}",
            name.replace("-", "_"),
            default=None,
            envvar=_env(name),
            show_envvar=True,
            show_default=False,
            **extra,
        )(fn)
    return fn


def _fields(values: dict[str, Any]) -> dict[str, Any]:
    """The given options as keywords of tenure.add_schedule / update_schedule."""
    renames = {"tz": "timezone", "max_runs": "max_runs", "catch_up": "catch_up"}
    return {renames.get(k, k): v for k, v in values.items() if v is not None}


def _client(dsn: str | None, schema: str, log_level: str, log_format: str) -> Any:
    setup_logs(log_level, log_format)
    return connect(dsn, schema)


@click.group("schedules", context_settings=CONTEXT)
def schedules_group() -> None:
    """Runtime schedules: tasks in code (@app.task), schedules in the database.

    Added, changed and removed while the workers run; every worker sees a change at once
    (LISTEN/NOTIFY) and no run starts under a definition older than the newest committed one.
    """


@schedules_group.command("add", context_settings=CONTEXT)
@db_options
@click.argument("key")
@definition_options
@click.option(
    "--if-exists",
    type=IF_EXISTS,
    default="error",
    envvar="TENURE_SCHEDULE_IF_EXISTS",
    show_envvar=True,
    help="When KEY exists: refuse, keep it, or replace its definition.",
)
@json_option
@handle_errors
def schedules_add(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    key: str,
    if_exists: str,
    as_json: bool,
    **values: Any,
) -> None:
    """Add schedule KEY: --task NAME and one of --every, --cron (with --tz) or --at."""
    import tenure

    fields = _fields(values)
    if "task" not in fields:
        raise tenure.InvalidArgument("--task is required: the task the schedule runs")
    with _client(dsn, schema, log_level, log_format) as client:
        outcome = tenure.add_schedule(client, key, if_exists=if_exists, **fields)
        info = tenure.get_schedule(client, key)
    _report(key, outcome, info, as_json)


@schedules_group.command("update", context_settings=CONTEXT)
@db_options
@click.argument("key")
@definition_options
@json_option
@handle_errors
def schedules_update(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    key: str,
    as_json: bool,
    **values: Any,
) -> None:
    """Change KEY's options given here; the rest stay. Takes effect from the next slot."""
    import tenure

    fields = _fields(values)
    if not fields:
        raise tenure.InvalidArgument("nothing to change: give at least one option")
    with _client(dsn, schema, log_level, log_format) as client:
        outcome = tenure.update_schedule(client, key, **fields)
        info = tenure.get_schedule(client, key)
    _report(key, outcome, info, as_json)


def _report(key: str, outcome: str, info: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"outcome": outcome, "schedule": info and info.as_json()}))
        return
    if info is None:
        click.echo(f"{printable(key)}: {outcome}")
        return
    nxt = "none" if info.next_slot is None else info.next_slot.isoformat(timespec="seconds")
    click.echo(
        f"{printable(key)}: {outcome} (revision {info.revision}): task {printable(info.task)}, "
        f"{printable(info.schedule)}, next slot {nxt}"
    )


@schedules_group.command("remove", context_settings=CONTEXT)
@db_options
@click.argument("key")
@handle_errors
def schedules_remove(
    dsn: str | None, schema: str, log_level: str, log_format: str, key: str
) -> None:
    """Remove KEY: no run starts after this (one going finishes under its token)."""
    import tenure

    with _client(dsn, schema, log_level, log_format) as client:
        removed = tenure.remove_schedule(client, key)
    if not removed:
        raise tenure.UnknownJob(f"no runtime schedule {key!r}; `tenure schedules list` shows them")
    click.echo(f"{printable(key)}: removed")


@schedules_group.command("pause", context_settings=CONTEXT)
@db_options
@click.argument("key")
@click.option(
    "--note",
    default=None,
    envvar="TENURE_SCHEDULE_NOTE",
    show_envvar=True,
    help="Why it is paused (shown by list and show, recorded with the change).",
)
@handle_errors
def schedules_pause(
    dsn: str | None, schema: str, log_level: str, log_format: str, key: str, note: str | None
) -> None:
    """Pause KEY on every worker, with a note: no run starts after this."""
    import tenure

    with _client(dsn, schema, log_level, log_format) as client:
        was = tenure.pause_schedule(client, key, note=note)
    click.echo(f"{printable(key)}: " + ("note changed (was paused)" if was else "paused"))


@schedules_group.command("resume", context_settings=CONTEXT)
@db_options
@click.argument("key")
@handle_errors
def schedules_resume(
    dsn: str | None, schema: str, log_level: str, log_format: str, key: str
) -> None:
    """Resume KEY from its next slot (slots that passed while paused are not run)."""
    import tenure

    with _client(dsn, schema, log_level, log_format) as client:
        slot = tenure.resume_schedule(client, key)
    if slot is None:
        click.echo(f"{printable(key)}: was not paused (or has no slot left)")
    else:
        click.echo(f"{printable(key)}: resumed; next slot {slot.isoformat()}")


@schedules_group.command("list", context_settings=CONTEXT)
@db_options
@click.option(
    "--search",
    default=None,
    envvar="TENURE_SCHEDULES_SEARCH",
    show_envvar=True,
    help="Only schedules whose key or task contains this text.",
)
@click.option(
    "--after",
    default="",
    envvar="TENURE_SCHEDULES_AFTER",
    show_envvar=True,
    help="Start after this key (the last key of the previous page).",
)
@click.option(
    "--limit",
    type=LIMIT,
    default=100,
    envvar="TENURE_LIMIT",
    show_envvar=True,
    help="Schedules per page.",
)
@json_option
@handle_errors
def schedules_list(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    search: str | None,
    after: str,
    limit: int,
    as_json: bool,
) -> None:
    """A page of runtime schedules by key: task, trigger, state, next slot (database clock)."""
    import tenure

    with _client(dsn, schema, log_level, log_format) as client:
        found = tenure.list_schedules(client, after=after, search=search, limit=min(limit, 10_000))
    if as_json:
        click.echo(json.dumps([s.as_json() for s in found], indent=2))
        return
    if not found:
        click.echo("no runtime schedules" + (" match" if search else ""))
        return
    from .tables import show

    show(
        ("schedule", "task", "trigger", "state", "next slot (db)", "args"),
        [
            (
                s.key,
                s.task,
                s.schedule,
                s.state,
                "-" if s.next_slot is None else s.next_slot.isoformat(timespec="seconds"),
                json.dumps(s.args, ensure_ascii=False),
            )
            for s in found
        ],
    )
    if len(found) == limit:
        click.echo(f"next page: --after {printable(found[-1].key)}")


@schedules_group.command("show", context_settings=CONTEXT)
@db_options
@click.argument("key")
@json_option
@handle_errors
def schedules_show(
    dsn: str | None, schema: str, log_level: str, log_format: str, key: str, as_json: bool
) -> None:
    """KEY's definition and its recorded changes (who, when, before and after)."""
    import tenure

    with _client(dsn, schema, log_level, log_format) as client:
        info = tenure.get_schedule(client, key)
        changes = tenure.schedule_changes(client, key)
    if info is None and not changes:
        raise tenure.UnknownJob(f"no runtime schedule {key!r}; `tenure schedules list` shows them")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "schedule": None if info is None else info.as_json(),
                    "changes": [c.as_json() for c in changes],
                },
                indent=2,
                default=str,
            )
        )
        return
    if info is None:
        click.echo(f"{printable(key)}: removed")
    else:
        for name, value in info.as_json().items():
            if value is not None:
                text = json.dumps(value, ensure_ascii=False) if name == "args" else str(value)
                click.echo(f"{name:>14}: {printable(text)}")
    from .tables import show

    show(
        ("when (db)", "action", "role", "application", "before", "after"),
        [
            (
                c.changed_at.isoformat(timespec="seconds"),
                c.action,
                c.role,
                c.application_name,
                json.dumps(c.before, ensure_ascii=False, default=str) if c.before else "-",
                json.dumps(c.after, ensure_ascii=False, default=str) if c.after else "-",
            )
            for c in changes
        ],
        title=f"{key}: changes, newest first",
    )


@schedules_group.command("backfill", context_settings=CONTEXT)
@db_options
@click.argument("key")
@click.option(
    "--from",
    "start",
    required=True,
    envvar="TENURE_BACKFILL_FROM",
    show_envvar=True,
    help="The first time of the range (ISO 8601).",
)
@click.option(
    "--to",
    "end",
    required=True,
    envvar="TENURE_BACKFILL_TO",
    show_envvar=True,
    help="The last time of the range (ISO 8601, not in the future).",
)
@handle_errors
def schedules_backfill(
    dsn: str | None, schema: str, log_level: str, log_format: str, key: str, start: str, end: str
) -> None:
    """Run KEY's slots from --from to --to once each, oldest first, each fenced with its own
    token (runs of kind 'backfill'), beside its schedule."""
    import tenure

    with _client(dsn, schema, log_level, log_format) as client:
        slots = tenure.backfill_schedule(client, key, start, end)
    click.echo(
        f"{printable(key)}: backfilling {len(slots)} slots, {slots[0].isoformat()} .. "
        f"{slots[-1].isoformat()}"
    )


schedules: click.Group = schedules_group
