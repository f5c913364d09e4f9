"""Operator actions on scheduled jobs, from any host: list, pause, resume, trigger, cancel a
running run, history.

Each is one or two named statements (``db/sql/scheduler.sql``) on a sync :class:`~tenure.Client`,
and each change notifies the workers (``NOTIFY``), so they act on it at once instead of at
their next planned wake-up.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..db.executor import R
from ..errors import JobStillDefined, TenureError, UnknownJob
from ..validation import check_int, check_job_key, check_token
from .presence import PRESENCE_TTL
from .registration import REGISTER_LOCK
from .rows import (
    CancelledRow,
    HistoryRow,
    JobGetRow,
    JobListRow,
    PausedRow,
    RemovedRow,
    ResumedRow,
    TriggeredRow,
    UndefinedRow,
)
from .schedules import schedule_from_row

if TYPE_CHECKING:
    from ..leases._sync.client import Client

#: The state of a job that no live worker of its app defines (scheduler/presence.py).
UNDEFINED = "no worker defines it"
#: Most history rows one call returns.
MAX_LIMIT = 100_000


#: A job's states, one vocabulary for ``tenure jobs list`` and the dashboard; a job is in the
#: first that applies (:func:`job_state`).
JOB_STATES = ("quarantined", "paused", "running", "failing", "idle")


def job_state(
    *, quarantined: bool, paused: bool, running: bool, failed: bool, undefined: bool = False
) -> str:
    """no worker defines it (:data:`UNDEFINED`: removed from the code, see
    scheduler/presence.py), quarantined (paused after crashing, see docs/safety.md), paused,
    running (a run in progress or unfinished), failing (its last run failed), else idle."""
    if undefined:
        return UNDEFINED
    if quarantined:
        return "quarantined"
    if paused:
        return "paused"
    if running:
        return "running"
    return "failing" if failed else "idle"


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job as ``tenure jobs list`` shows it (database times)."""

    job_key: str
    schedule: str
    ttl: dt.timedelta
    misfire: str
    misfire_grace: dt.timedelta | None
    on_crash: str
    revision: int
    defined_at: dt.datetime
    defined_by: str
    paused: bool
    next_slot: dt.datetime
    running_slot: dt.datetime | None
    running_token: int | None
    trigger_pending: bool
    token: int | None
    lease_until: dt.datetime | None
    held: bool
    last_outcome: str | None
    last_slot: dt.datetime | None
    last_finished_at: dt.datetime | None
    observed_at: dt.datetime
    quarantine_after: int | None = None
    crash_streak: int = 0
    quarantined_at: dt.datetime | None = None
    quarantined: str | None = None  # the reason, while quarantined
    app: str | None = None  # the app that owns the definition (None: not stamped yet)
    task: str | None = None  # a runtime schedule's task (None: a coded job)
    #: A coded job that no live worker of its app defines (removed from the code; its app
    #: has live workers): nothing runs it. ``tenure jobs remove`` deletes it.
    undefined: bool = False

    @property
    def state(self) -> str:
        """:func:`job_state` (+trigger when one is pending)."""
        state = job_state(
            undefined=self.undefined,
            quarantined=self.quarantined is not None,
            paused=self.paused,
            running=self.running_slot is not None,
            failed=self.last_outcome == "failed",
        )
        # A pending trigger of a job no worker defines runs nowhere: not shown as pending.
        pending = self.trigger_pending and not self.undefined
        return state + " +trigger" if pending else state

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job_key,
            "schedule": self.schedule,
            "ttl": self.ttl.total_seconds(),
            "misfire": self.misfire,
            "misfire_grace": (
                None if self.misfire_grace is None else self.misfire_grace.total_seconds()
            ),
            "on_crash": self.on_crash,
            "revision": self.revision,
            "defined_at": self.defined_at.isoformat(),
            "defined_by": self.defined_by,
            "paused": self.paused,
            "next_slot": self.next_slot.isoformat(),
            "running_slot": _iso(self.running_slot),
            "running_token": self.running_token,
            "trigger_pending": self.trigger_pending,
            "token": self.token,
            "held": self.held,
            "lease_until": _iso(self.lease_until),
            "last_outcome": self.last_outcome,
            "last_slot": _iso(self.last_slot),
            "last_finished_at": _iso(self.last_finished_at),
            "quarantine_after": self.quarantine_after,
            "crash_streak": self.crash_streak,
            "quarantined": self.quarantined,
            "quarantined_at": _iso(self.quarantined_at),
            "app": self.app,
            "task": self.task,
            "state": self.state,
            "defined": not self.undefined,
        }


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One row of run history."""

    run_id: int
    job_key: str
    slot: dt.datetime
    kind: str
    attempt: int
    token: int
    owner: uuid.UUID | None
    worker_id: str
    host: str
    pid: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    outcome: str
    error: str | None
    #: How many consecutive slots the row stands for (a run of missed slots, slot to
    #: last_slot; version 13); 1 for a run.
    slots: int = 1
    last_slot: dt.datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "job": self.job_key,
            "slot": self.slot.isoformat(),
            "kind": self.kind,
            "attempt": self.attempt,
            "token": self.token,
            "owner": None if self.owner is None else str(self.owner),
            "worker": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "outcome": self.outcome,
            "error": self.error,
            "slots": self.slots,
            "last_slot": _iso(self.last_slot),
        }


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def undefined_jobs(client: Client) -> set[str]:
    """The job keys no worker defines (``sched_undefined``, see scheduler/presence.py)."""
    rows = client.fetch(
        "sched_undefined", {}, doing="reading which jobs no worker defines", row=UndefinedRow
    )
    return {r.job_key for r in rows}


def list_jobs(client: Client) -> list[JobStatus]:
    rows = client.fetch("sched_list", {}, doing="listing scheduled jobs", row=JobListRow)
    undefined = undefined_jobs(client) if rows else set()
    return [
        JobStatus(
            r.job_key,
            schedule_from_row(
                r.job_key,
                r.cron,
                r.every,
                r.timezone,
                run_at=r.run_at,
                starts_at=r.starts_at,
                ends_at=r.ends_at,
                jitter=r.jitter,
            ).describe(),
            r.ttl,
            r.misfire,
            r.misfire_grace,
            r.on_crash,
            r.revision,
            r.defined_at,
            r.defined_by,
            r.paused,
            r.next_slot,
            r.running_slot,
            r.running_token,
            r.trigger_at is not None,
            r.fencing_token,
            r.lease_until,
            r.held,
            r.outcome,
            r.slot,
            r.finished_at,
            r.now,
            r.quarantine_after,
            r.crash_streak,
            r.quarantined_at,
            r.quarantine_reason,
            r.app,
            r.task,
            r.job_key in undefined,
        )
        for r in rows
    ]


def _unknown(job_key: str) -> UnknownJob:
    return UnknownJob(
        f"no scheduled job {job_key!r}; `tenure jobs list` shows the registered jobs "
        "(a job is registered when a worker that defines it starts)"
    )


def _require(rows: list[R], job_key: str) -> R:
    if not rows:
        raise _unknown(job_key)
    return rows[0]


def pause(client: Client, job_key: str, *, channel: str) -> bool:
    """Pause ``job_key``: no new runs (a running one finishes). False if it already was."""
    check_job_key(job_key)
    row = _require(
        client.fetch(
            "sched_pause",
            {"job_key": job_key, "channel": channel},
            doing=f"pausing {job_key!r}",
            wrote=True,
            row=PausedRow,
        ),
        job_key,
    )
    return bool(row.changed)


@dataclass(frozen=True, slots=True)
class Resumed:
    next_slot: dt.datetime
    quarantine: str | None  # the quarantine this resume lifted, if any


def resume(client: Client, job_key: str, *, channel: str) -> Resumed | None:
    """Resume ``job_key`` from now on (lifting a quarantine too); None if it was not paused.

    Slots that passed while it was paused are not run (a pending trigger or an unfinished
    run still is).
    """
    check_job_key(job_key)
    for _ in range(5):
        job = _require(
            client.fetch(
                "sched_get", {"job_key": job_key}, doing=f"reading {job_key!r}", row=JobGetRow
            ),
            job_key,
        )
        if not job.paused:
            return None
        first = schedule_from_row(
            job.job_key,
            job.cron,
            job.every,
            job.timezone,
            run_at=job.run_at,
            starts_at=job.starts_at,
            ends_at=job.ends_at,
            jitter=job.jitter,
        ).next_after(job.now)
        resumed = client.fetch_one(
            "sched_resume",
            {"job_key": job_key, "next_slot": first, "revision": job.revision, "channel": channel},
            doing=f"resuming {job_key!r}",
            wrote=True,
            row=ResumedRow,
        )
        if resumed is not None:
            return Resumed(resumed.next_slot, job.quarantine_reason)
        # The definition changed between the two statements: compute again.
    raise TenureError(f"job {job_key!r} keeps changing under this command; try again")


@dataclass(frozen=True, slots=True)
class Triggered:
    at: dt.datetime
    already_pending: bool
    paused: bool


def trigger(client: Client, job_key: str, *, channel: str) -> Triggered:
    """Ask for one run of ``job_key`` now (by any worker that has it)."""
    check_job_key(job_key)
    row = _require(
        client.fetch(
            "sched_trigger",
            {"job_key": job_key, "channel": channel},
            doing=f"triggering {job_key!r}",
            wrote=True,
            row=TriggeredRow,
        ),
        job_key,
    )
    return Triggered(
        row.triggered or row.pending,  # type: ignore[arg-type]  # one of them is set
        row.triggered is None,
        bool(row.paused),
    )


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What :func:`cancel` did: ``cancelled`` whether the run with that token was ended;
    ``lease_ended`` whether its lease was live until then (False: its worker was already
    gone); ``running_token`` the token of the run that was in progress, if any."""

    cancelled: bool
    lease_ended: bool
    running_token: int | None


def cancel(client: Client, job_key: str, token: int, *, by: str) -> Cancelled:
    """Cancel ``job_key``'s run in progress with ``token`` (``by``: who, for its history row).

    Its lease ends at once: the worker's next renewal fails, so the body is told to stop
    (``ctx.check()`` raises, ``ctx.wait()`` returns True; an async body is cancelled) and the
    strict fence refuses its writes from now on. The run is recorded as ``cancelled``; its
    slot is not retried. A run that already ended, or one that another worker took over (a
    higher token), is left alone: ``cancelled`` is False.
    """
    check_job_key(job_key)
    check_token(token)
    row = client.fetch_one(
        "sched_cancel",
        {"job_key": job_key, "token": token, "error": f"cancelled by an operator ({by})"},
        doing=f"cancelling {job_key!r} token {token}",
        wrote=True,
        row=CancelledRow,
    )
    if row is None or not row.known:
        raise _unknown(job_key)
    return Cancelled(row.cancelled, row.lease_ended, row.running_token)


def history(client: Client, job_key: str, *, limit: int = 20) -> list[RunRecord]:
    """The newest ``limit`` history rows of ``job_key``, newest first."""
    check_job_key(job_key)
    check_int(limit, what="limit", minimum=1, maximum=MAX_LIMIT)
    rows = client.fetch(
        "sched_history",
        {"job_key": job_key, "limit": limit},
        doing=f"reading the history of {job_key!r}",
        row=HistoryRow,
    )
    if not rows:  # no runs yet, or no such job (an error, as for pause and trigger)
        _require(
            client.fetch(
                "sched_get", {"job_key": job_key}, doing=f"reading {job_key!r}", row=JobGetRow
            ),
            job_key,
        )
    return [RunRecord(*row) for row in rows]  # the same fields, in the same order


@dataclass(frozen=True, slots=True)
class Removed:
    app: str | None
    token: int | None  # the key's token floor, kept: a job defined again continues above it


def remove(client: Client, job_key: str, *, channel: str) -> Removed:
    """Delete ``job_key``'s definition; its lease row and token stay (invariant 1: a lease
    row is never deleted; a key defined again continues above its token).

    Refused (:class:`~tenure.JobStillDefined`) while a live worker of its app defines it, or
    while its lease is live.
    """
    check_job_key(job_key)
    r = _require(
        client.fetch_sized(
            "sched_remove_job",
            {"job_key": job_key, "channel": channel},
            doing=f"removing {job_key!r}",
            seconds=5.0,
            serialize=REGISTER_LOCK,
            wrote=True,
            row=RemovedRow,
        ),
        job_key,
    )
    if r.removed:
        return Removed(r.app, r.token)
    if r.task is not None:
        raise JobStillDefined(
            f"job {job_key!r} is a runtime schedule (task {r.task!r}), not a job of the code: "
            "remove it with `tenure schedules remove`"
        )
    if r.definers:
        raise JobStillDefined(
            f"job {job_key!r} is still defined by live workers of app {r.app!r}: {r.definers}; "
            "deploy workers without it and stop these first (a killed worker counts for "
            f"{PRESENCE_TTL:g}s after its last beat), then remove it"
        )
    until = "-" if r.held_until is None else r.held_until.isoformat()
    raise JobStillDefined(
        f"job {job_key!r} has a live lease (token {r.token}, until {until}): "
        "a run is going; try again once it has ended"
    )
