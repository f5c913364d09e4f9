"""Runtime schedules as values: :class:`ScheduleDef` (a definition to store, validated before
any SQL runs), :class:`ScheduleInfo` (one stored), :class:`ScheduleChange` (one recorded
change), and the task check (a schedule must name a task some worker of its app registered).

Pure: no I/O; the database's time is passed in (docs/schedules.md).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidArgument
from ..validation import MAX_JSON_DEPTH, Duration, check_job_key, check_ttl, parse_duration, to_json
from .schedules import (
    MISFIRE_POLICIES,
    NEVER,
    ON_CRASH_POLICIES,
    OVERLAP_POLICIES,
    QUARANTINE_AFTER,
    Schedule,
    zone,
)

#: Largest JSON arguments of one schedule (the encoded text), checked here and in the table.
MAX_ARGS_BYTES = 65_536
#: Longest task name.
MAX_TASK = 200
#: How a stored schedule may be re-added: refuse, leave it, or replace its definition.
IF_EXISTS = ("error", "keep", "replace")
DEFAULT_TTL = 30.0

When = dt.datetime | str


def check_task(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_TASK:
        raise InvalidArgument(
            f"task must be a name of at most {MAX_TASK} characters, like 'reports.send', got "
            f"{name!r}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidArgument(f"task name must not contain control characters, got {name!r}")
    return name


def check_args(args: object) -> tuple[dict[str, Any], str]:
    """The arguments as a dict and as compact JSON text, or one line saying what is wrong."""
    if args is None:
        return {}, "{}"
    if isinstance(args, (str, bytes)):
        # The payload rules (depth, NUL, surrogates, NaN), with a message of its own.
        try:
            args = json.loads(args)
        except RecursionError:
            raise InvalidArgument(
                f"args are nested more than {MAX_JSON_DEPTH} levels deep; flatten them"
            ) from None
        except ValueError as exc:
            reason = " ".join(str(exc).split())
            raise InvalidArgument(f"args are not JSON ({reason}); give a JSON object") from None
    if not isinstance(args, Mapping):
        raise InvalidArgument(
            f"args must be a JSON object (a dict: ctx.args), got {type(args).__name__}"
        )
    # Depth, NUL, lone surrogates, NaN, what JSON cannot hold: the rules of every payload.
    text = to_json(dict(args), what="args")
    size = len(text.encode("utf-8"))
    if size > MAX_ARGS_BYTES:
        raise InvalidArgument(
            f"args are {size} bytes of JSON, over the limit of {MAX_ARGS_BYTES}; keep large "
            "data in your own table and pass its key"
        )
    return json.loads(text), text


def parse_when(value: When, *, what: str, timezone: str) -> dt.datetime:
    """An instant: an aware datetime, or ISO 8601 text (without an offset: in ``timezone``)."""
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidArgument(
                f"{what} {value!r} is not a time; give ISO 8601 like 2026-12-05T02:00 (in the "
                "schedule's time zone) or 2026-12-05T02:00+01:00"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=zone(timezone))
        value = parsed
    if not isinstance(value, dt.datetime):
        raise InvalidArgument(f"{what} must be a datetime or ISO 8601 text, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(f"{what} {value.isoformat()} has no time zone; give an aware time")
    if not dt.datetime(1970, 1, 1, tzinfo=dt.UTC) <= value < NEVER:
        raise InvalidArgument(f"{what} {value.isoformat()} is out of range (1970 .. 9998)")
    return value.astimezone(dt.UTC)


def _seconds(value: Duration | None, *, what: str) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value, what=what)
    if seconds < 0 or math.isnan(seconds):
        raise InvalidArgument(f"{what} must not be negative, got {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class ScheduleDef:
    """One runtime schedule to store: key, task, trigger (exactly one of ``cron``,
    ``every``, ``at``), JSON ``args`` and options. Build it with :func:`schedule_def`, which
    checks every field."""

    key: str
    task: str
    args: dict[str, Any] = field(default_factory=dict)
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    at: dt.datetime | None = None
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    jitter: float | None = None
    max_runs: int | None = None
    overlap: str = "skip"
    misfire: str = "latest"
    catch_up: float | None = None
    ttl: float = DEFAULT_TTL
    on_crash: str = "retry"
    quarantine_after: int | None = QUARANTINE_AFTER
    app: str | None = None

    @property
    def schedule(self) -> Schedule:
        base = (
            Schedule.build(
                self.key,
                cron=self.cron,
                every=None if self.every is None else dt.timedelta(seconds=self.every),
                timezone=self.timezone if self.cron is not None else None,
            )
            if self.at is None
            else Schedule(self.key, timezone=self.timezone)
        )
        return replace(
            base,
            run_at=self.at,
            starts_at=self.start,
            ends_at=self.end,
            jitter_us=0 if self.jitter is None else round(self.jitter * 1e6),
        )

    def first_slot(self, now: dt.datetime) -> dt.datetime:
        """The first slot after the database's ``now`` (:data:`NEVER`: none)."""
        return self.schedule.next_after(now)

    def row(self, now: dt.datetime, *, expect: int | None = None) -> dict[str, Any]:
        """The definition as one object of ``sched_define``'s JSON array."""

        def secs(v: float | None) -> str | None:
            return None if v is None else f"{v} seconds"

        return {
            "job_key": self.key,
            "task": self.task,
            "args": self.args,
            "cron": self.cron,
            "every": secs(self.every),
            "timezone": self.timezone,
            "run_at": None if self.at is None else self.at.isoformat(),
            "starts_at": None if self.start is None else self.start.isoformat(),
            "ends_at": None if self.end is None else self.end.isoformat(),
            "jitter": secs(self.jitter),
            "max_runs": self.max_runs,
            "overlap": self.overlap,
            "misfire": self.misfire,
            "misfire_grace": secs(self.catch_up),
            "on_crash": self.on_crash,
            "ttl": secs(self.ttl),
            "quarantine_after": self.quarantine_after,
            "next_slot": self.first_slot(now).isoformat(),
            "app": self.app,
            "expect": expect,
        }

    def describe(self) -> str:
        return self.schedule.describe()


def schedule_def(
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
    ttl: Duration = DEFAULT_TTL,
    on_crash: str = "retry",
    quarantine_after: int | None = QUARANTINE_AFTER,
    app: str | None = None,
) -> ScheduleDef:
    """A checked :class:`ScheduleDef`; :class:`~tenure.InvalidArgument` (one line) if any
    field is wrong: give exactly one of ``every`` (a duration), ``cron`` (in ``timezone``)
    and ``at`` (one run at that time)."""
    check_job_key(key)
    task = check_task(task)
    given = [n for n, v in (("every", every), ("cron", cron), ("at", at)) if v is not None]
    if len(given) != 1:
        raise InvalidArgument(
            f"schedule {key!r}: give exactly one of every (a duration), cron (an expression) "
            f"and at (a time), got {', '.join(given) or 'none'}"
        )
    tz = "UTC" if timezone is None else timezone
    zone(tz)
    if every is not None and timezone not in (None, "UTC"):
        raise InvalidArgument(
            f"schedule {key!r}: a time zone applies to cron and to --at without an offset; "
            "an every schedule counts real elapsed time"
        )
    every_s = None if every is None else parse_duration(every, what=f"schedule {key!r}: every")
    at_t = None if at is None else parse_when(at, what=f"schedule {key!r}: at", timezone=tz)
    start_t = (
        None if start is None else parse_when(start, what=f"schedule {key!r}: start", timezone=tz)
    )
    end_t = None if end is None else parse_when(end, what=f"schedule {key!r}: end", timezone=tz)
    if start_t is not None and end_t is not None and end_t < start_t:
        raise InvalidArgument(
            f"schedule {key!r}: end {end_t.isoformat()} is before start {start_t.isoformat()}"
        )
    if overlap not in OVERLAP_POLICIES:
        raise InvalidArgument(
            f"schedule {key!r}: overlap must be one of {', '.join(OVERLAP_POLICIES)}, got "
            f"{overlap!r}"
        )
    if misfire not in MISFIRE_POLICIES:
        raise InvalidArgument(
            f"schedule {key!r}: misfire must be one of {', '.join(MISFIRE_POLICIES)}, got "
            f"{misfire!r}"
        )
    if on_crash not in ON_CRASH_POLICIES:
        raise InvalidArgument(
            f"schedule {key!r}: on_crash must be one of {', '.join(ON_CRASH_POLICIES)}, got "
            f"{on_crash!r}"
        )
    if max_runs is not None and (
        isinstance(max_runs, bool) or not isinstance(max_runs, int) or not 1 <= max_runs < 2**31
    ):
        raise InvalidArgument(
            f"schedule {key!r}: max_runs must be a positive integer, got {max_runs!r}"
        )
    if quarantine_after is not None and (
        isinstance(quarantine_after, bool)
        or not isinstance(quarantine_after, int)
        or not 1 <= quarantine_after < 2**31
    ):
        raise InvalidArgument(
            f"schedule {key!r}: quarantine_after must be a positive integer or None, got "
            f"{quarantine_after!r}"
        )
    args_d, _text = check_args(args)
    definition = ScheduleDef(
        key,
        task,
        args_d,
        cron=cron,
        every=every_s,
        timezone=tz,
        at=at_t,
        start=start_t,
        end=end_t,
        jitter=_seconds(jitter, what=f"schedule {key!r}: jitter") or None,
        max_runs=max_runs,
        overlap=overlap,
        misfire=misfire,
        catch_up=_seconds(catch_up, what=f"schedule {key!r}: catch_up"),
        ttl=check_ttl(ttl),
        on_crash=on_crash,
        quarantine_after=quarantine_after,
        app=app,
    )
    schedule = definition.schedule  # checks the cron expression, the interval
    if cron is not None:
        definition = replace(definition, cron=schedule.cron)
    if definition.jitter is not None:
        gap = schedule.min_gap(dt.datetime.now(dt.UTC))
        if gap is not None and definition.jitter >= gap.total_seconds():
            raise InvalidArgument(
                f"schedule {key!r}: jitter {definition.jitter:g}s must be shorter than the "
                f"gap between its slots ({gap.total_seconds():g}s), so they stay in order"
            )
    return definition


def resolve_app(definition: ScheduleDef, registered: Mapping[str, Sequence[str]]) -> str | None:
    """The app whose workers run ``definition`` (its ``app``, or the one app that registered
    its task); refuses a task that no worker of the app registered, once workers of that
    app (or, without ``app``, of any app) have registered their tasks."""
    task = definition.task
    if definition.app is not None:
        tasks = registered.get(definition.app)
        if tasks is not None and task not in tasks:
            raise InvalidArgument(
                f"schedule {definition.key!r}: unknown task {task!r}: the workers of app "
                f"{definition.app!r} registered {_named(tasks)}; register it with "
                "@app.task and start a worker, or fix the name"
            )
        return definition.app
    if not registered:
        return None  # no worker registered tasks yet: any worker with the task runs it
    apps = sorted(a for a, tasks in registered.items() if task in tasks)
    if len(apps) == 1:
        return apps[0]
    if not apps:
        known = sorted({t for tasks in registered.values() for t in tasks})
        raise InvalidArgument(
            f"schedule {definition.key!r}: unknown task {task!r}: no worker has registered it "
            f"(registered: {_named(known)}); register it with @app.task and start a worker, "
            "or fix the name"
        )
    raise InvalidArgument(
        f"schedule {definition.key!r}: task {task!r} is registered by several apps "
        f"({', '.join(map(repr, apps))}); say which with app= (--app)"
    )


def _named(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "") or "none"


def _interval(value: dt.timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One stored runtime schedule (database times)."""

    key: str
    task: str
    args: dict[str, Any]
    schedule: str
    cron: str | None
    every: float | None
    timezone: str
    at: dt.datetime | None
    start: dt.datetime | None
    end: dt.datetime | None
    jitter: float | None
    max_runs: int | None
    runs_started: int
    overlap: str | None
    misfire: str
    catch_up: float | None
    ttl: float
    app: str | None
    revision: int
    paused: bool
    pause_note: str | None
    next_slot: dt.datetime | None  # None: no more slots
    running_slot: dt.datetime | None
    backfill_next: dt.datetime | None
    backfill_to: dt.datetime | None
    defined_at: dt.datetime
    defined_by: str
    on_crash: str
    quarantine_after: int | None
    observed_at: dt.datetime

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ScheduleInfo:
        (
            key, task, args, cron, every, tz, run_at, starts_at, ends_at, jitter, max_runs,
            runs_started, overlap, misfire, grace, ttl, app, revision, paused, note, next_slot,
            running_slot, backfill_next, backfill_to, defined_at, defined_by, on_crash,
            quarantine_after, now,
        ) = row  # fmt: skip
        definition = ScheduleDef(
            key,
            task,
            args or {},
            cron=cron,
            every=_interval(every),
            timezone=tz,
            at=run_at,
            start=starts_at,
            end=ends_at,
            jitter=_interval(jitter),
        )
        return cls(
            key,
            task,
            args or {},
            definition.describe(),
            cron,
            _interval(every),
            tz,
            run_at,
            starts_at,
            ends_at,
            _interval(jitter),
            max_runs,
            runs_started,
            overlap,
            misfire,
            _interval(grace),
            ttl.total_seconds(),
            app,
            revision,
            paused,
            note,
            None if next_slot >= NEVER else next_slot,
            running_slot,
            backfill_next,
            backfill_to,
            defined_at,
            defined_by,
            on_crash,
            quarantine_after,
            now,
        )

    @property
    def state(self) -> str:
        if self.paused:
            return "paused"
        if self.running_slot is not None:
            return "running"
        if self.backfill_next is not None:
            return "backfilling"
        return "finished" if self.next_slot is None else "scheduled"

    def definition(self) -> ScheduleDef:
        """The stored definition, as :func:`schedule_def` would build it."""
        return ScheduleDef(
            self.key,
            self.task,
            dict(self.args),
            cron=self.cron,
            every=self.every,
            timezone=self.timezone,
            at=self.at,
            start=self.start,
            end=self.end,
            jitter=self.jitter,
            max_runs=self.max_runs,
            overlap=self.overlap or "skip",
            misfire=self.misfire,
            catch_up=self.catch_up,
            ttl=self.ttl,
            on_crash=self.on_crash,
            quarantine_after=self.quarantine_after,
            app=self.app,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "task": self.task,
            "args": self.args,
            "schedule": self.schedule,
            "cron": self.cron,
            "every": self.every,
            "timezone": self.timezone,
            "at": _iso(self.at),
            "start": _iso(self.start),
            "end": _iso(self.end),
            "jitter": self.jitter,
            "max_runs": self.max_runs,
            "runs_started": self.runs_started,
            "overlap": self.overlap,
            "misfire": self.misfire,
            "catch_up": self.catch_up,
            "ttl": self.ttl,
            "app": self.app,
            "revision": self.revision,
            "state": self.state,
            "paused": self.paused,
            "pause_note": self.pause_note,
            "next_slot": _iso(self.next_slot),
            "running_slot": _iso(self.running_slot),
            "backfill_next": _iso(self.backfill_next),
            "backfill_to": _iso(self.backfill_to),
            "defined_at": self.defined_at.isoformat(),
            "defined_by": self.defined_by,
        }


@dataclass(frozen=True, slots=True)
class ScheduleChange:
    """One recorded change: who (database role, application_name), when, before and after
    (the definition as JSON; None before an add and after a remove)."""

    change_id: int
    key: str
    action: str
    role: str
    application_name: str
    changed_at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        return {
            "change_id": self.change_id,
            "key": self.key,
            "action": self.action,
            "role": self.role,
            "application_name": self.application_name,
            "changed_at": self.changed_at.isoformat(),
            "before": self.before,
            "after": self.after,
        }


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()
