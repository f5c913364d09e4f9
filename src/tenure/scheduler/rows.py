"""The scheduler statements' rows (``db/sql/scheduler.sql``), named as the statements name
their columns (:mod:`tenure.db.rows`; ``tests/db/test_row_types.py`` compares them)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NamedTuple, cast

from ..db.rows import row_of


@row_of("sched_claim")
class ClaimRow(NamedTuple):
    """One row of ``sched_claim``: a lease taken (``fencing_token`` set, the job's columns
    NULL), a job row read (``fencing_token`` NULL, the lease's columns NULL), or the summary
    (``job_key`` NULL; only ``now`` and ``ready_at`` set).
    :func:`tenure.scheduler.claim.claims_from_rows` joins them; the types are those of the
    row kind that carries the column."""

    job_key: str | None
    lease_owner: uuid.UUID
    fencing_token: int | None
    lease_until: dt.datetime
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    ttl: dt.timedelta
    misfire: str
    misfire_grace: dt.timedelta | None
    on_crash: str
    revision: int
    next_slot: dt.datetime
    done_slot: dt.datetime | None
    running_slot: dt.datetime | None
    running_kind: str | None
    running_token: int | None
    running_attempt: int | None
    trigger_at: dt.datetime | None
    now: dt.datetime
    ready_at: dt.datetime | None
    prior_gone: bool
    crash_streak: int
    quarantine_after: int | None
    freed_at: dt.datetime | None
    # A runtime schedule's definition (migration 14; NULL for a coded job).
    task: str | None
    args: dict[str, Any] | None
    run_at: dt.datetime | None
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    jitter: dt.timedelta | None
    max_runs: int | None
    runs_started: int
    overlap: str | None
    backfill_next: dt.datetime | None
    backfill_to: dt.datetime | None


@row_of("sched_register")
class RegisteredRow(NamedTuple):
    """One job of ``sched_register``: its revision and next slot now, and from ``cron`` on
    its definition before this registration (``defined_by`` NULL: a new job). A conflict row
    (``conflict``: another app owns the job and ``adopt`` was not given) has only the owner's
    ``defined_by``, ``defined_at`` and ``app`` (set). The types are those of a job defined
    before."""

    job_key: str
    revision: int | None
    next_slot: dt.datetime
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    ttl: dt.timedelta
    misfire: str
    misfire_grace: dt.timedelta | None
    on_crash: str
    defined_by: str | None
    defined_at: dt.datetime | None
    app: str | None
    redefined: bool
    conflict: bool
    notified: object
    #: A conflict with a runtime schedule's key: its task (code never takes that key over).
    task: str | None


@row_of("sched_finish")
class FinishedRow(NamedTuple):
    """One row of ``sched_finish``: a run it recorded (``token`` set: ``matched`` False when
    the job was taken over; ``outcome`` what was recorded; ``current`` the job's token now;
    ``now`` and ``ready_at``: the database's time and the earliest due time of the jobs the
    batch did not keep), or a job it kept for this worker's next run of it (``token`` NULL):
    from ``lease_owner`` on, the columns of :class:`ClaimRow` (:meth:`claim`), with the
    released lease's token and no owner or expiry (the start takes the lease over)."""

    job_key: str
    token: int | None
    matched: bool
    outcome: str | None
    current: int | None
    notified: object
    lease_owner: uuid.UUID
    fencing_token: int | None
    lease_until: dt.datetime
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    ttl: dt.timedelta
    misfire: str
    misfire_grace: dt.timedelta | None
    on_crash: str
    revision: int
    next_slot: dt.datetime
    done_slot: dt.datetime | None
    running_slot: dt.datetime | None
    running_kind: str | None
    running_token: int | None
    running_attempt: int | None
    trigger_at: dt.datetime | None
    now: dt.datetime
    ready_at: dt.datetime | None
    prior_gone: bool
    crash_streak: int
    quarantine_after: int | None
    freed_at: dt.datetime | None
    task: str | None
    args: dict[str, Any] | None
    run_at: dt.datetime | None
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    jitter: dt.timedelta | None
    max_runs: int | None
    runs_started: int
    overlap: str | None
    backfill_next: dt.datetime | None
    backfill_to: dt.datetime | None

    def claim(self) -> ClaimRow:
        """A kept job's row as the claim's (the same columns, in the same order)."""
        return ClaimRow(self.job_key, *cast("tuple[Any, ...]", self[_CLAIM_FROM:]))


#: Where the claim's columns begin in a row of ``sched_finish``.
_CLAIM_FROM = list(FinishedRow.__annotations__).index("lease_owner")


@row_of("sched_start")
class StartedRow(NamedTuple):
    """One job whose start ``sched_start`` recorded: its run's start (None: nothing to run)
    and, where the start took the job's lease over (a kept job), its token and expiry."""

    job_key: str
    started_at: dt.datetime | None
    token: int | None
    lease_until: dt.datetime | None


@row_of("sched_list")
class JobListRow(NamedTuple):
    """One job of ``sched_list`` (``tenure jobs list``)."""

    job_key: str
    cron: str | None
    every: dt.timedelta | None
    timezone: str
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
    trigger_at: dt.datetime | None
    fencing_token: int | None
    lease_until: dt.datetime | None
    held: bool
    outcome: str | None
    slot: dt.datetime | None
    finished_at: dt.datetime | None
    now: dt.datetime
    quarantine_after: int | None
    crash_streak: int
    quarantined_at: dt.datetime | None
    quarantine_reason: str | None
    app: str | None
    task: str | None
    run_at: dt.datetime | None
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    jitter: dt.timedelta | None


@row_of("sched_get")
class JobGetRow(NamedTuple):
    """One job's schedule as ``sched_get`` reads it (before a resume)."""

    job_key: str
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    revision: int
    paused: bool
    next_slot: dt.datetime
    trigger_at: dt.datetime | None
    now: dt.datetime
    quarantine_reason: str | None
    run_at: dt.datetime | None
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    jitter: dt.timedelta | None


@row_of("sched_pause")
class PausedRow(NamedTuple):
    was_paused: bool
    changed: bool
    notified: object


@row_of("sched_resume")
class ResumedRow(NamedTuple):
    next_slot: dt.datetime
    notified: object


@row_of("sched_trigger")
class TriggeredRow(NamedTuple):
    pending: dt.datetime | None
    triggered: dt.datetime | None
    paused: bool
    notified: object


@row_of("sched_cancel")
class CancelledRow(NamedTuple):
    """``sched_cancel``'s answer: ``cancelled`` whether the run with the token was ended
    (``lease_ended``: its lease was live until now), ``running_token`` the job's run in
    progress before the statement, ``recorded`` history rows written, ``known`` whether the
    job exists."""

    cancelled: bool
    lease_ended: bool
    running_token: int | None
    recorded: int
    known: bool


@row_of("sched_history")
class HistoryRow(NamedTuple):
    """One row of run history (``sched_history``), as :class:`~.jobs.RunRecord` holds it."""

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
    slots: int
    last_slot: dt.datetime | None


@row_of("sched_body_lengths")
class BodyLengthRow(NamedTuple):
    """How long a job ran lately (the shortest of its last three ended runs, seconds)."""

    job_key: str
    took: float


@row_of("sched_presence_beat")
class PresenceRow(NamedTuple):
    """One answer of a worker's beat (scheduler/presence.py): ``kind`` 'me' (its row was
    there; ``job_key`` NULL), 'excluded' (a key of its app its code lacks), 'lost' (a dead
    run recorded as lease_lost), 'workers', 'keepable' and 'spare' (``n``: the app's live
    workers, its jobs a worker may keep from one run to the next, and the other live workers
    that are not saturated)."""

    kind: str
    job_key: str | None
    n: int | None


@row_of("sched_undefined")
class UndefinedRow(NamedTuple):
    """A job that no live worker of its app defines."""

    job_key: str


@row_of("sched_remove_job")
class RemovedRow(NamedTuple):
    """``tenure jobs remove``'s answer: whether the definition was deleted, else who still
    defines it (``definers``) or until when its lease is live; the key's token floor."""

    app: str | None
    removed: bool
    definers: str | None
    held_until: dt.datetime | None
    token: int | None
    task: str | None
    notified: object
