"""One claimed job, as ``sched_claim`` returned it, and the parameters that record a batch
of plans with ``sched_start`` and of finished runs with ``sched_finish`` (one JSON object per
claimed job, skipped slot or finished run)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .rows import ClaimRow
from .schedules import JobState, Plan, Policy, Schedule, schedule_of

if TYPE_CHECKING:
    from .spec import JobSpec


#: Seconds: a run that ends done keeps its job for this worker when the job's next slot comes
#: within this (and the worker has room): the finish leaves the job to it, and its start of
#: that slot takes the lease over (``sched_finish``/``sched_start``, docs/safety.md "A job
#: kept for its next slot"). Every-second and every-two-seconds jobs, say.
KEEP_AHEAD = 2.0
#: Seconds after a kept job's next slot until other workers may claim it: the keeping worker
#: starts it at the slot; if that worker died, the slot runs this much late elsewhere.
RESERVE = 1.0


@dataclass(frozen=True, slots=True)
class Claim:
    """One claimed job, as the claim statement returned it."""

    job_key: str
    owner: uuid.UUID
    token: int
    lease_until: dt.datetime
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    ttl: dt.timedelta
    misfire: str
    misfire_grace: dt.timedelta | None
    on_crash: str
    revision: int
    state: JobState
    now: dt.datetime
    quarantine_after: int | None = None
    #: When the lease before this claim ended (expired or released); None: the job's first.
    freed_at: dt.datetime | None = None
    #: A runtime schedule's definition (migration 14); task None: a coded job.
    task: str | None = None
    args: dict[str, Any] | None = None
    run_at: dt.datetime | None = None
    starts_at: dt.datetime | None = None
    ends_at: dt.datetime | None = None
    jitter: dt.timedelta | None = None
    max_runs: int | None = None
    overlap: str | None = None
    #: Kept by this worker's finish of the run before (not claimed): the start takes its lease
    #: over, from the released lease's ``token``; ``owner`` is the new one, ``lease_until``
    #: only a bound for :attr:`at` until the start answers with the lease.
    take: bool = False

    @classmethod
    def from_rows(cls, lease: ClaimRow, job: ClaimRow) -> Claim:
        """The claim of a lease taken and its job's row read (two rows of ``sched_claim``)."""
        return cls._of(
            lease.job_key, lease.lease_owner, lease.fencing_token, lease.lease_until, job
        )

    @classmethod
    def kept(cls, row: ClaimRow, owner: uuid.UUID) -> Claim:
        """The claim of a job a finish kept for this worker (one row of ``sched_finish``:
        the released lease's token): its start takes the lease over with ``owner``; until
        then the lease's term from the finish's ``now`` stands for its expiry."""
        return cls._of(row.job_key, owner, row.fencing_token, row.now + row.ttl, row, take=True)

    @classmethod
    def _of(
        cls,
        key: str | None,
        owner: uuid.UUID,
        token: int | None,
        lease_until: dt.datetime,
        job: ClaimRow,
        *,
        take: bool = False,
    ) -> Claim:
        assert key is not None and token is not None  # a taken (or released) lease's row
        state = JobState(
            job.next_slot,
            job.done_slot,
            job.running_slot,
            job.running_kind,
            job.running_token,
            job.running_attempt,
            job.trigger_at,
            bool(job.prior_gone),
            job.crash_streak,
            job.runs_started or 0,
            job.backfill_next,
            job.backfill_to,
            job.freed_at,
        )
        return cls(
            key,
            owner,
            token,
            lease_until,
            job.cron,
            job.every,
            job.timezone,
            job.ttl,
            job.misfire,
            job.misfire_grace,
            job.on_crash,
            job.revision,
            state,
            job.now,
            job.quarantine_after,
            job.freed_at,
            job.task,
            job.args,
            job.run_at,
            job.starts_at,
            job.ends_at,
            job.jitter,
            job.max_runs,
            job.overlap,
            take,
        )

    @property
    def bounds(self) -> tuple[Any, ...]:
        """What a runtime schedule adds to the trigger (one-shot, window, jitter)."""
        return (self.run_at, self.starts_at, self.ends_at, self.jitter)

    def schedule(self) -> Schedule:
        """The schedule as the claim read it (already validated when it was stored)."""
        return schedule_of(
            self.job_key,
            self.cron,
            self.every,
            self.timezone,
            run_at=self.run_at,
            starts_at=self.starts_at,
            ends_at=self.ends_at,
            jitter=self.jitter,
        )

    def due_here(self, slot: dt.datetime) -> dt.datetime:
        """When ``slot`` became this worker's to run: the slot, or the end of the job's
        previous lease if that lease kept it from being claimed (a holder that overran,
        froze or died). Lateness before then is not this worker's."""
        return slot if self.freed_at is None else max(slot, self.freed_at)

    def held_elsewhere(self, slot: dt.datetime) -> bool:
        """Whether ``slot`` came due while the job's previous lease still kept it."""
        return self.due_here(slot) > slot

    @property
    def at(self) -> dt.datetime:
        """The database time the claim is planned for: ``now``, or the job's next slot when
        it was claimed ahead of that slot (fire-ahead: no retry or trigger pending, the slot
        still to come, and within the lease just taken)."""
        state = self.state
        if (
            state.running_slot is None
            and state.trigger_at is None
            and state.backfill_next is None
            and self.now < state.next_slot < self.lease_until
        ):
            return state.next_slot
        return self.now

    def policy(self) -> Policy:
        grace = None if self.misfire_grace is None else self.misfire_grace.total_seconds()
        return Policy(
            self.misfire, grace, self.on_crash, self.quarantine_after, self.overlap, self.max_runs
        )

    def differs_from(self, spec: JobSpec) -> bool:
        mine = (
            spec.schedule.cron,
            spec.schedule.every,
            spec.schedule.timezone,
            spec.ttl,
            spec.policy.misfire,
            spec.policy.misfire_grace,
            spec.policy.on_crash,
            spec.policy.quarantine_after,
        )
        theirs = (
            self.cron,
            self.every,
            self.timezone,
            self.ttl.total_seconds(),
            self.misfire,
            None if self.misfire_grace is None else self.misfire_grace.total_seconds(),
            self.on_crash,
            self.quarantine_after,
        )
        return mine != theirs


def claims_from_rows(rows: Sequence[ClaimRow]) -> tuple[list[Claim], ClaimRow]:
    """The claims in ``sched_claim``'s rows, in the order the jobs came due, and the summary
    row (job_key NULL: the database's now and when to look again). The statement returns each
    taken lease (token set) and each job row read (token NULL) as rows of their own; a job
    read but whose lease was not taken (its lease turned out live) is no claim."""
    taken: dict[str | None, ClaimRow] = {}
    read: list[ClaimRow] = []
    summary: ClaimRow | None = None
    for row in rows:
        if row.job_key is None:
            summary = row
        elif row.fencing_token is not None:
            taken[row.job_key] = row
        else:
            read.append(row)
    if summary is None:
        raise ValueError("sched_claim returned no summary row")
    claims = [
        Claim.from_rows(lease, row) for row in read if (lease := taken.get(row.job_key)) is not None
    ]
    return claims, summary


def run_fields(job_key: str, token: int, slot: dt.datetime, **more: Any) -> dict[str, Any]:
    """A run's structured logging fields (``extra=``): job, token and slot, plus ``more``."""
    return {"job": job_key, "token": token, "slot": slot.isoformat(), **more}


def _text(value: str | None) -> str | None:
    """A string PostgreSQL's json-to-text accepts: no NUL (``\\u0000`` is refused), no lone
    surrogate. An error message from a job body may hold either; one such message must not
    fail its whole batch."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    return value.encode("utf-8", "replace").decode("utf-8")


def keeps_after(slot: dt.datetime, next_slot: dt.datetime) -> bool:
    """Whether a run of ``slot`` will likely keep its job for ``next_slot`` (its finish keeps a
    job whose next slot is within :data:`KEEP_AHEAD`): its start then puts the job's due time
    where that finish would, so the finish's update of the row moves no index entry."""
    return (next_slot - slot).total_seconds() <= KEEP_AHEAD


def start_params(
    planned: Sequence[tuple[Claim, Plan]], *, worker: str, host: str, pid: int
) -> dict[str, Any]:
    """The parameters of ``sched_start`` for a batch of claims and their plans: two JSON
    texts (``plan``: one object per claim; ``skipped``: one per skipped slot)."""
    plans: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for claim, d in planned:
        # A key left out is NULL to json_to_recordset: only what this plan has is sent
        # (encoding the JSON was the largest single cost of a busy worker's loop).
        p: dict[str, Any] = {
            "job_key": claim.job_key,
            "token": claim.token,
            "owner": str(claim.owner),
            "revision": claim.revision,
            "attempt": d.attempt,
            "crash_streak": d.crash_streak,
        }
        if d.run_slot is not None:
            p["run_slot"] = d.run_slot.isoformat()
            p["run_kind"] = d.run_kind
        if d.next_slot is not None:
            p["next_slot"] = d.next_slot.isoformat()
        if d.done_slot is not None:
            p["done_slot"] = d.done_slot.isoformat()
        if d.trigger_at is not None:
            p["trigger_at"] = d.trigger_at.isoformat()
        if d.prior_token is not None:
            p["prior_token"] = d.prior_token
            p["prior_error"] = _text(d.prior_error)
        if d.quarantine is not None:
            p["quarantine"] = _text(d.quarantine)
        if d.backfill_from is not None:
            p["backfill_from"] = d.backfill_from.isoformat()
            if d.backfill_next is not None:
                p["backfill_next"] = d.backfill_next.isoformat()
        if claim.take:
            p["take"] = True
        if d.run_slot is not None and keeps_after(d.run_slot, d.next_slot or claim.state.next_slot):
            p["reserve"] = True
        plans.append(p)
        for s in d.skipped:
            row = {
                "job_key": claim.job_key,
                "slot": s.slot.isoformat(),
                "token": claim.token,
                "kind": s.kind,
                "outcome": s.outcome,
                "error": _text(s.error),
            }
            if s.last is not None:  # a run of missed slots: one row with its count
                row["slots"] = s.count
                row["last_slot"] = s.last.isoformat()
            skipped.append(row)
    return {
        "plan": json.dumps(plans, separators=(",", ":")),
        "count": len(plans),
        "reserve": RESERVE,
        "skipped": json.dumps(skipped, separators=(",", ":")),
        "worker": worker,
        "host": host,
        "pid": pid,
    }


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """Which run this is, built once when its start is recorded and carried by the run, its
    'running' row (``sched_running``) and its end (``sched_finish``): everything its history
    row holds besides how it ended."""

    job_key: str
    token: int
    owner: uuid.UUID
    slot: dt.datetime
    kind: str
    attempt: int
    #: The run's start as recorded (database time).
    started_at: dt.datetime

    def row(self) -> dict[str, Any]:
        """The run as one object of the statements' JSON batch."""
        return {
            "job_key": self.job_key,
            "token": self.token,
            "owner": str(self.owner),
            "slot": self.slot.isoformat(),
            "kind": self.kind,
            "attempt": self.attempt,
            "started_at": self.started_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class Finished:
    """One run's end, as ``sched_finish`` records it."""

    ident: RunIdentity
    done: bool
    outcome: str
    error: str | None
    #: The worker has room for the job's next run: the finish may keep the job for it.
    keep: bool = False


def finish_params(
    finished: Sequence[Finished],
    *,
    channel: str,
    worker: str,
    host: str,
    pid: int,
    retry: bool = False,
) -> dict[str, Any]:
    """The parameters of ``sched_finish`` for a batch of finished runs (one JSON text): each
    run's end and what its history row needs, which the finish writes (migration 12), and
    whether its job may be kept for its next run. ``retry``: the same batch was sent before
    and its answer was lost."""
    runs = []
    for f in finished:
        row = f.ident.row()
        row["done"] = f.done
        row["outcome"] = f.outcome
        row["error"] = _text(f.error)
        if f.keep:
            row["keep"] = True
        runs.append(row)
    return {
        "runs": json.dumps(runs, separators=(",", ":")),
        "count": len(runs),
        "retry": retry,
        "keep_ahead": KEEP_AHEAD,
        "reserve": RESERVE,
        "channel": channel,
        "worker": worker,
        "host": host,
        "pid": pid,
    }


def running_params(
    runs: Sequence[RunIdentity], *, worker: str, host: str, pid: int
) -> dict[str, Any]:
    """The parameters of ``sched_running`` (one JSON text)."""
    return {
        "runs": json.dumps([r.row() for r in runs], separators=(",", ":")),
        "worker": worker,
        "host": host,
        "pid": pid,
    }
