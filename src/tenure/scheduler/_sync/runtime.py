# WARNING: this file is generated from src/tenure/scheduler/_async/runtime.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""Runtime schedules: add, change, remove, list and backfill them while the fleet runs.

Every function takes ``target``: a tenure client (each call is one statement on its pool,
committed on its own) or your own psycopg connection (the statement runs in your
transaction: the schedule commits, or not, with your other writes; the workers are
notified at commit). ``schema`` is the client's, or given with a connection.

Each change is one statement that also records who made it (``schedule_changes``: role,
application_name, when, before and after) and notifies every worker (``NOTIFY``). A refused
call (bad input, an unknown task, a conflict) writes nothing. docs/schedules.md has the
model; ``db/sql/schedules.sql`` the statements.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from psycopg import Connection

from ...db.channels import channel
from ...db.queries import query
from ...errors import InvalidArgument, ScheduleConflict, UnknownJob, mapped
from ...leases._sync.client import Client
from ...validation import Duration, check_int, check_job_key, check_schema, check_text
from ..definitions import (
    IF_EXISTS,
    ScheduleChange,
    ScheduleDef,
    ScheduleInfo,
    When,
    parse_when,
    resolve_app,
    schedule_def,
)
from ..schedules import NEVER

Target = Client | Connection[Any]
#: Most schedules one list call returns.
MAX_PAGE = 10000
#: Longest pause note.
MAX_NOTE = 1000
#: Most slots one backfill runs.
MAX_BACKFILL = 100000
#: Seconds a bulk add may take per schedule (beyond the pool's 5 s): 100,000 in one call.
SECONDS_PER_SCHEDULE = 0.0005


def _schema(target: Target, schema: str | None) -> str:
    if isinstance(target, Client):
        if schema is not None and schema != target.schema:
            raise InvalidArgument(
                f"schema {schema!r} differs from the client's {target.schema!r}; leave it out"
            )
        return target.schema
    if not isinstance(target, Connection):
        raise InvalidArgument(
            f"target must be a tenure client or a psycopg connection, got {type(target).__name__}"
        )
    return check_schema("tenure" if schema is None else schema)


def _run(
    target: Target, schema: str, name: str, params: dict[str, Any], *, doing: str, size: int = 1
) -> list[tuple[Any, ...]]:
    if isinstance(target, Client):
        if size > 1000:
            return target.fetch_sized(
                name,
                params,
                doing=doing,
                seconds=max(5.0, size * SECONDS_PER_SCHEDULE),
                serialize="schedules",
                wrote=True,
            )
        return target.fetch(name, params, doing=doing, wrote=True)
    with mapped(doing, wrote=True):
        cur = target.execute(query(schema, name), params)
        return [] if cur.description is None else cur.fetchall()


def _now(target: Target) -> dt.datetime:
    if isinstance(target, Client):
        return target.now()
    with mapped("reading the database clock"):
        cur = target.execute(b"SELECT clock_timestamp()")
        row = cur.fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


def registered_tasks(target: Target, *, schema: str | None = None) -> dict[str, list[str]]:
    """The tasks each app's workers registered (``@app.task``), by app."""
    name = _schema(target, schema)
    rows = _run(target, name, "sched_tasks", {}, doing="reading registered tasks")
    return {app: list(tasks) for app, tasks in rows}


def add_schedule(
    target: Target,
    key: str,
    *,
    task: str,
    every: Duration | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    at: When | None = None,
    args: Mapping[str, Any] | str | None = None,
    start: When | None = None,
    end: When | None = None,
    jitter: Duration | None = None,
    max_runs: int | None = None,
    overlap: str = "skip",
    misfire: str = "latest",
    catch_up: Duration | None = None,
    ttl: Duration = 30.0,
    on_crash: str = "retry",
    app: str | None = None,
    if_exists: str = "error",
    schema: str | None = None,
) -> str:
    """Store runtime schedule ``key``: run task ``task`` with ``args`` (a JSON object, the
    run's ``ctx.args``) every ``every``, on ``cron`` in ``timezone``, or once ``at``.

    ``start``/``end``: no slot before/after; ``jitter``: each slot later by a stable offset
    below it; ``max_runs``: no more slots after that many; ``overlap``: a slot that comes
    while the previous run still holds the job is skipped ("skip") or run once after it
    ("buffer_one"); ``misfire`` and ``catch_up`` (the misfire grace): slots missed while no
    worker ran. ``if_exists``: "error" (raise :class:`~tenure.ScheduleConflict`), "keep" or
    "replace". Returns "added", "changed", "kept" or "unchanged".
    """
    definition = schedule_def(
        key,
        task=task,
        every=every,
        cron=cron,
        timezone=timezone,
        at=at,
        args=args,
        start=start,
        end=end,
        jitter=jitter,
        max_runs=max_runs,
        overlap=overlap,
        misfire=misfire,
        catch_up=catch_up,
        ttl=ttl,
        on_crash=on_crash,
        app=app,
    )
    outcomes = add_schedules(target, [definition], if_exists=if_exists, schema=schema)
    return outcomes[key]


def add_schedules(
    target: Target,
    definitions: Iterable[ScheduleDef],
    *,
    if_exists: str = "error",
    schema: str | None = None,
    action: str = "replace",
    expect: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """Store many schedules (built with :func:`~tenure.schedule_def`) in ONE statement:
    100,000 take seconds, not 100,000 round trips. All or nothing: a refused key refuses the
    call. Returns each key's outcome ("added", "changed", "kept", "unchanged")."""
    name = _schema(target, schema)
    if if_exists not in IF_EXISTS:
        raise InvalidArgument(f"if_exists must be one of {', '.join(IF_EXISTS)}, got {if_exists!r}")
    defs = list(definitions)
    for d in defs:
        if not isinstance(d, ScheduleDef):
            raise InvalidArgument(f"expected ScheduleDef values (tenure.schedule_def), got {d!r}")
    keys = [d.key for d in defs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise InvalidArgument(f"schedule key {dup!r} is given twice")
    if not defs:
        return {}
    registered = registered_tasks(target, schema=name)
    resolved = [replace(d, app=resolve_app(d, registered)) for d in defs]
    now = _now(target)
    for d in resolved:
        if d.at is not None and d.first_slot(now) >= NEVER:
            raise InvalidArgument(
                f"schedule {d.key!r}: at {d.at.isoformat()} has passed (database time "
                f"{now.isoformat()}); give a time to come"
            )
    rows_json = [d.row(now, expect=None if expect is None else expect.get(d.key)) for d in resolved]
    rows = _run(
        target,
        name,
        "sched_define",
        {
            "schedules": json.dumps(rows_json, separators=(",", ":"), ensure_ascii=False),
            "count": len(rows_json),
            "if_exists": if_exists,
            "action": action,
            "defined_by": "tenure.add_schedule",
            "channel": channel("jobs", name),
        },
        doing=f"storing {len(defs)} schedules",
        size=len(defs),
    )
    refused = {key: outcome[8:] for key, outcome, *_ in rows if outcome.startswith("refused:")}
    if refused:
        raise _conflict(refused, name)
    done = {key: outcome for key, outcome, *_ in rows if key is not None}
    kept = "kept" if if_exists == "keep" else "unchanged"
    return {k: done.get(k, kept) for k in keys}


def _conflict(refused: dict[str, str], schema: str) -> ScheduleConflict:
    key = sorted(refused)[0]
    more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
    why = refused[key]
    if why == "coded":
        text = (
            f"{key!r} is a coded job (@app.job) in schema {schema!r}, not a runtime "
            f"schedule{more}; use another key, or `tenure jobs` for coded jobs"
        )
    elif why == "moved":
        text = f"schedule {key!r} was changed by someone else meanwhile{more}; read it and retry"
    else:
        text = (
            f"schedule {key!r} already exists in schema {schema!r}{more}; pass "
            "if_exists='replace' (--if-exists replace) to change it or 'keep' to leave it"
        )
    return ScheduleConflict(text + "; nothing was stored", refused)


def get_schedule(target: Target, key: str, *, schema: str | None = None) -> ScheduleInfo | None:
    """Runtime schedule ``key`` as stored, or None."""
    check_job_key(key)
    found = _page(target, _schema(target, schema), keys=[key])
    return found[0] if found else None


def list_schedules(
    target: Target,
    *,
    after: str = "",
    search: str | None = None,
    limit: int = 100,
    schema: str | None = None,
) -> list[ScheduleInfo]:
    """A page of runtime schedules, by key, from the first key after ``after``; ``search``:
    only those whose key or task contains it. The next page starts after the last key."""
    check_int(limit, what="limit", minimum=1, maximum=MAX_PAGE)
    if not isinstance(after, str):
        raise InvalidArgument(f"after must be a key (text), got {after!r}")
    return _page(target, _schema(target, schema), after=after, search=search, limit=limit)


def _page(
    target: Target,
    schema: str,
    *,
    keys: Sequence[str] | None = None,
    after: str = "",
    search: str | None = None,
    limit: int = 1,
) -> list[ScheduleInfo]:
    rows = _run(
        target,
        schema,
        "sched_schedules",
        {
            "keys": None if keys is None else list(keys),
            "after": after,
            "search": search or None,
            "limit": limit,
        },
        doing="listing schedules",
    )
    return [ScheduleInfo.from_row(row) for row in rows]


def update_schedule(target: Target, key: str, *, schema: str | None = None, **changes: Any) -> str:
    """Change some fields of runtime schedule ``key`` (the keywords of
    :func:`add_schedule`; a trigger keyword replaces the trigger). Takes effect from
    the next slot; a run already going finishes with what it had. Returns "changed" or
    "unchanged"; raises :class:`~tenure.UnknownJob` if there is no such schedule."""
    name = _schema(target, schema)
    current = get_schedule(target, key, schema=name)
    if current is None:
        raise UnknownJob(f"no runtime schedule {key!r} in schema {name!r}; add it first")
    base = current.definition()
    fields: dict[str, Any] = {
        "task": base.task,
        "args": base.args,
        "timezone": base.timezone,
        "start": base.start,
        "end": base.end,
        "jitter": base.jitter,
        "max_runs": base.max_runs,
        "overlap": base.overlap,
        "misfire": base.misfire,
        "catch_up": base.catch_up,
        "ttl": base.ttl,
        "on_crash": base.on_crash,
        "app": base.app,
    }
    unknown = set(changes) - set(fields) - {"every", "cron", "at"}
    if unknown:
        raise InvalidArgument(f"update_schedule: unknown field(s) {', '.join(sorted(unknown))}")
    trigger = {k: changes.pop(k) for k in ("every", "cron", "at") if k in changes}
    if len(trigger) > 1:
        raise InvalidArgument("give at most one of every, cron and at")
    if not trigger:
        trigger = (
            {"cron": base.cron}
            if base.cron
            else {"every": base.every}
            if base.every
            else {"at": base.at}
        )
    if "every" in trigger and "timezone" not in changes:
        fields["timezone"] = None
    fields.update(changes)
    definition = schedule_def(key, **trigger, **fields)
    outcomes = add_schedules(
        target,
        [definition],
        if_exists="replace",
        schema=name,
        action="update",
        expect={key: current.revision},
    )
    return outcomes[key]


def remove_schedule(target: Target, key: str, *, schema: str | None = None) -> bool:
    """Remove runtime schedule ``key``: no run starts after this commits (a run going
    finishes under its token). False if there was none. Its token floor is kept: the key
    added again continues above its last token."""
    return key in remove_schedules(target, [key], schema=schema)


def remove_schedules(target: Target, keys: Sequence[str], *, schema: str | None = None) -> set[str]:
    """Remove these runtime schedules in one statement; returns the keys removed."""
    name = _schema(target, schema)
    for key in keys:
        check_job_key(key)
    rows = _run(
        target,
        name,
        "sched_remove",
        {"keys": list(keys), "channel": channel("jobs", name)},
        doing=f"removing {len(keys)} schedules",
        size=len(keys),
    )
    coded = {key: "coded" for key, outcome in rows if outcome == "refused:coded"}
    if coded:
        raise _conflict(coded, name)
    return {key for key, outcome in rows if outcome == "removed"}


def pause_schedule(
    target: Target, key: str, *, note: str | None = None, schema: str | None = None
) -> bool:
    """Pause runtime schedule ``key`` with ``note`` (why, for the next operator): no run
    starts after this commits. Returns whether it was already paused (the note is replaced);
    raises :class:`~tenure.UnknownJob` if there is no such schedule."""
    name = _schema(target, schema)
    check_job_key(key)
    if note is not None:
        note = check_text(note, what="note", max_chars=MAX_NOTE, blank_ok=True) or None
    rows = _run(
        target,
        name,
        "sched_schedule_pause",
        {"job_key": key, "note": note, "channel": channel("jobs", name)},
        doing=f"pausing {key!r}",
    )
    if not rows:
        raise UnknownJob(f"no runtime schedule {key!r} in schema {name!r}")
    return bool(rows[0][0])


def resume_schedule(target: Target, key: str, *, schema: str | None = None) -> dt.datetime | None:
    """Resume paused runtime schedule ``key`` from its first slot after now (slots that
    passed while it was paused are not run); returns that slot (None: it was not paused)."""
    name = _schema(target, schema)
    for _ in range(5):
        current = get_schedule(target, key, schema=name)
        if current is None:
            raise UnknownJob(f"no runtime schedule {key!r} in schema {name!r}")
        if not current.paused:
            return None
        first = current.definition().schedule.next_after(_now(target))
        rows = _run(
            target,
            name,
            "sched_schedule_resume",
            {
                "job_key": key,
                "next_slot": first,
                "revision": current.revision,
                "channel": channel("jobs", name),
            },
            doing=f"resuming {key!r}",
        )
        if rows:
            slot: dt.datetime = rows[0][0]
            return None if slot >= NEVER else slot
    raise ScheduleConflict(f"schedule {key!r} keeps changing under this call; try again", {})


def schedule_changes(
    target: Target, key: str, *, limit: int = 50, schema: str | None = None
) -> list[ScheduleChange]:
    """The recorded changes of ``key``, newest first."""
    check_job_key(key)
    check_int(limit, what="limit", minimum=1, maximum=MAX_PAGE)
    rows = _run(
        target,
        _schema(target, schema),
        "sched_schedule_changes",
        {"job_key": key, "limit": limit},
        doing="reading schedule changes",
    )
    return [ScheduleChange(*row) for row in rows]


def backfill_schedule(
    target: Target, key: str, start: When, end: When, *, schema: str | None = None
) -> list[dt.datetime]:
    """Run the slots of ``key``'s schedule from ``start`` to ``end`` (both included, in the
    past) once each, oldest first, as runs of kind "backfill", each fenced with its own
    token. Replaces a backfill in progress. Returns the slots (at most
    :data:`MAX_BACKFILL`)."""
    name = _schema(target, schema)
    current = get_schedule(target, key, schema=name)
    if current is None:
        raise UnknownJob(f"no runtime schedule {key!r} in schema {name!r}")
    first_t = parse_when(start, what="backfill from", timezone=current.timezone)
    last_t = parse_when(end, what="backfill to", timezone=current.timezone)
    if last_t < first_t:
        raise InvalidArgument(
            f"backfill to {last_t.isoformat()} is before from {first_t.isoformat()}"
        )
    now = _now(target)
    if last_t > now:
        raise InvalidArgument(
            f"backfill to {last_t.isoformat()} is in the future (database time "
            f"{now.isoformat()}); a backfill runs past slots"
        )
    schedule = current.definition().schedule
    slots: list[dt.datetime] = []
    for slot in schedule.iter_after(first_t - dt.timedelta(microseconds=1)):
        if slot > last_t:
            break
        slots.append(slot)
        if len(slots) > MAX_BACKFILL:
            raise InvalidArgument(
                f"backfill of {key!r} from {first_t.isoformat()} to {last_t.isoformat()} has "
                f"more than {MAX_BACKFILL} slots; backfill a shorter range"
            )
    if not slots:
        raise InvalidArgument(
            f"{key!r} has no slot from {first_t.isoformat()} to {last_t.isoformat()}"
        )
    rows = _run(
        target,
        name,
        "sched_backfill",
        {"job_key": key, "first": slots[0], "last": slots[-1], "channel": channel("jobs", name)},
        doing=f"backfilling {key!r}",
    )
    if not rows:
        raise UnknownJob(f"no runtime schedule {key!r} in schema {name!r}")
    return slots


__all__ = [
    "Target",
    "add_schedule",
    "add_schedules",
    "backfill_schedule",
    "get_schedule",
    "list_schedules",
    "pause_schedule",
    "registered_tasks",
    "remove_schedule",
    "remove_schedules",
    "resume_schedule",
    "schedule_changes",
    "update_schedule",
]
