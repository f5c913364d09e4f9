"""Slot maths: which instants a schedule fires at, and what a claim does about missed ones.

Everything here is pure (no I/O, no clock): callers pass the database's time in. A slot is an
absolute instant (an aware UTC datetime); the database stores it as ``timestamptz``.

Cron schedules use cronsim (Debian cron semantics) in the job's time zone:

* a job at a fixed local time that falls in the spring-forward gap (02:30 in Europe/Berlin on
  the last Sunday of March) runs once, at the first valid minute after the gap (03:00);
* a fixed-time job in the repeated fall-back hour runs once, at the first occurrence;
* jobs with a wildcard minute or hour (``*/15 * * * *``) follow real time: in the repeated
  hour they run at every real instant that matches, in the gap hour not at all.

cronsim iterates fixed-time jobs on naive local time, which forgets on which side of a
fall-back an instant was: :meth:`Schedule.next_after` therefore only ever returns an instant
strictly after the one it was given, so slots are strictly increasing whatever the zone does.

``every`` schedules fire at ``epoch + phase + n * interval``. The phase is derived from the job
key (stable across processes and restarts), so thousands of jobs with the same interval are
spread over it instead of all firing at the same instant.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cronsim import CronSim, CronSimError

from ..errors import InvalidArgument

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_US = dt.timedelta(microseconds=1)

MISFIRE_POLICIES = ("latest", "all", "skip")
ON_CRASH_POLICIES = ("retry", "skip")

#: ``misfire="skip"`` without a ``misfire_grace`` still runs a slot this late: normal latency.
SKIP_DEFAULT_GRACE = 1.0
#: A claim enumerates at most this many missed slots; the next claim continues.
MAX_MISSED = 1000
#: A slot whose holder died is retried at most this many times in all (a job that kills its
#: worker must not take every worker down in turn); after that it is recorded abandoned.
MAX_ATTEMPTS = 3
#: Default ``quarantine_after``: a job whose runs ended with their worker gone this many times
#: in a row is quarantined (paused with a reason) until ``tenure jobs resume``.
QUARANTINE_AFTER = 3
#: Smallest ``every`` interval.
MIN_EVERY = 1.0
#: The next slot of a schedule that has no more (a one-shot that ran, past its end, out of
#: runs): far enough from PostgreSQL's limits that adding an interval to it stays in range.
NEVER = dt.datetime(9999, 1, 1, tzinfo=UTC)
#: Overlap policies of a runtime schedule (docs/schedules.md): a slot that comes while the
#: previous run still holds the lease is skipped, or run once after it.
OVERLAP_POLICIES = ("skip", "buffer_one")

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def zone(name: str) -> zoneinfo.ZoneInfo:
    """The time zone ``name``, or :class:`InvalidArgument` saying what is wrong."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(
            f"timezone must be an IANA zone name like 'Europe/Berlin', got {name!r}"
        )
    return _zone(name)


@functools.lru_cache(maxsize=512)
def _zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidArgument(
            f"unknown time zone {name!r} ({exc}); use an IANA name like 'Europe/Berlin' or "
            "'UTC' (the tzdata package provides them where the system has none)"
        ) from None


def normalize_cron(expr: str) -> str:
    """Expand ``@daily``-style aliases and collapse whitespace; raise on a bad expression."""
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidArgument(f"cron must be a cron expression like '0 2 * * *', got {expr!r}")
    text = " ".join(expr.split())
    if text.lower() == "@reboot":
        raise InvalidArgument(
            "cron @reboot is not supported: it has no time of its own that workers could "
            "share as a slot; run the work at start-up yourself, or use a time-based schedule"
        )
    text = _ALIASES.get(text.lower(), text)
    fields = len(text.split())
    if fields != 5:
        raise InvalidArgument(
            f"cron expression {expr!r} has {fields} fields; tenure uses the five Debian cron "
            "fields: minute hour day-of-month month day-of-week (e.g. '0 2 * * *'), or "
            "@hourly, @daily, @weekly, @monthly, @yearly. For seconds, use every='10s'"
        )
    try:
        it = CronSim(text, dt.datetime(2000, 1, 1, tzinfo=UTC))
        next(it)
    except CronSimError as exc:
        raise InvalidArgument(f"invalid cron expression {expr!r}: {exc}") from None
    except StopIteration:
        raise InvalidArgument(f"cron expression {expr!r} never fires") from None
    return text


def phase_of(job_key: str, interval_us: int) -> int:
    """A stable offset in [0, interval) for an ``every`` job, whole milliseconds."""
    digest = hashlib.sha256(job_key.encode("utf-8")).digest()
    steps = max(1, interval_us // 1000)
    return (int.from_bytes(digest[:8], "big") % steps) * 1000


@dataclass(frozen=True, slots=True)
class Schedule:
    """When one job fires. Exactly one of ``cron`` (in ``timezone``), ``every_us`` and
    ``run_at`` (a one-shot: runtime schedules only). Bounds (runtime schedules): no slot
    before ``starts_at`` nor after ``ends_at``; each slot is moved later by a stable offset in
    [0, ``jitter_us``) derived from key and slot (shorter than the gap between slots, so the
    slots stay in order). A schedule with no more slots yields :data:`NEVER`."""

    job_key: str
    cron: str | None = None
    every_us: int | None = None
    timezone: str = "UTC"
    phase_us: int = field(default=0, compare=False)
    run_at: dt.datetime | None = None
    starts_at: dt.datetime | None = None
    ends_at: dt.datetime | None = None
    jitter_us: int = 0

    @classmethod
    def build(
        cls,
        job_key: str,
        *,
        cron: str | None = None,
        every: dt.timedelta | None = None,
        timezone: str | None = None,
    ) -> Schedule:
        if (cron is None) == (every is None):
            raise InvalidArgument(
                f"job {job_key!r}: give exactly one of cron='0 2 * * *' or every='30s'"
            )
        if every is not None:
            if timezone not in (None, "UTC"):
                raise InvalidArgument(
                    f"job {job_key!r}: timezone applies to cron schedules only; an every= "
                    "schedule counts real elapsed time"
                )
            if every.total_seconds() < MIN_EVERY:
                raise InvalidArgument(
                    f"job {job_key!r}: every={every.total_seconds()}s is too short; the "
                    f"smallest interval is {MIN_EVERY:g}s"
                )
            interval = every // _US
            return cls(job_key, every_us=interval, phase_us=phase_of(job_key, interval))
        assert cron is not None
        tz = timezone or "UTC"
        try:
            zone(tz)
            return cls(job_key, cron=normalize_cron(cron), timezone=tz)
        except InvalidArgument as exc:
            raise InvalidArgument(f"job {job_key!r}: {exc}") from None

    @property
    def every(self) -> dt.timedelta | None:
        return None if self.every_us is None else dt.timedelta(microseconds=self.every_us)

    def describe(self) -> str:
        if self.run_at is not None:
            text = f"at {self.run_at.isoformat()}"
        elif self.every_us is not None:
            text = f"every {self.every_us / 1e6:g}s"
        elif self.cron is None:
            text = "one-shot"  # a reader that did not read run_at (the dashboard's job list)
        else:
            text = f"cron {self.cron!r} {self.timezone}"
        if self.starts_at is not None:
            text += f" from {self.starts_at.isoformat()}"
        if self.ends_at is not None:
            text += f" until {self.ends_at.isoformat()}"
        if self.jitter_us:
            text += f" jitter {self.jitter_us / 1e6:g}s"
        return text

    @property
    def bounded(self) -> bool:
        """Whether slots are moved, bounded or single (a runtime schedule's options)."""
        return bool(self.run_at is not None or self.starts_at or self.ends_at or self.jitter_us)

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        """The first slot strictly after ``instant`` (aware), as an aware UTC datetime."""
        return next(self.iter_after(instant))

    def iter_after(self, instant: dt.datetime) -> Iterator[dt.datetime]:
        """Slots strictly after ``instant``, strictly increasing, as aware UTC datetimes;
        :data:`NEVER` for ever once a bounded schedule has no more."""
        if instant.tzinfo is None:
            raise ValueError("slot maths needs an aware datetime")
        if not self.bounded:
            yield from self._slots_after(instant)
            return
        jitter = dt.timedelta(microseconds=self.jitter_us)
        # The nominal slots from jitter before the instant: a jittered slot after the
        # instant may have a nominal one before it.
        since = instant - jitter
        if self.starts_at is not None and since < self.starts_at:
            since = self.starts_at - _US
        nominal = iter((self.run_at,)) if self.run_at is not None else self._slots_after(since)
        for slot in nominal:
            if slot <= since:
                continue
            if self.ends_at is not None and slot > self.ends_at:
                break
            moved = slot + self.offset(slot)
            if moved > instant:
                yield moved
        while True:
            yield NEVER

    def offset(self, slot: dt.datetime) -> dt.timedelta:
        """The jitter of ``slot``: stable across processes, in [0, jitter)."""
        if not self.jitter_us:
            return dt.timedelta(0)
        text = f"{self.job_key}\x00{(slot - EPOCH) // _US}".encode()
        digest = hashlib.sha256(text).digest()
        return dt.timedelta(microseconds=int.from_bytes(digest[:8], "big") % self.jitter_us)

    def _slots_after(self, instant: dt.datetime) -> Iterator[dt.datetime]:
        if self.every_us is not None:
            step = self.every_us
            since = (instant - EPOCH) // _US - self.phase_us
            n = since // step + 1
            while True:
                yield EPOCH + dt.timedelta(microseconds=self.phase_us + n * step)
                n += 1
        assert self.cron is not None
        last = instant.astimezone(UTC)
        for local in CronSim(self.cron, instant.astimezone(zone(self.timezone))):
            slot = local.astimezone(UTC)
            # Fixed-time jobs iterate on naive local time: after a fall-back the iterator can
            # hand back an instant we have already passed. Never go backwards.
            if slot > last:
                last = slot
                yield slot

    def min_gap(self, after: dt.datetime, samples: int = 64) -> dt.timedelta | None:
        """The shortest gap between the next ``samples`` nominal slots (None: one-shot)."""
        if self.run_at is not None:
            return None
        if self.every_us is not None:
            return dt.timedelta(microseconds=self.every_us)
        slots = self._slots_after(after)
        prev = next(slots)
        gap: dt.timedelta | None = None
        for _ in range(samples):
            slot = next(slots)
            gap = slot - prev if gap is None else min(gap, slot - prev)
            prev = slot
        return gap

    def local(self, slot: dt.datetime) -> dt.datetime:
        """``slot`` in the job's time zone (what a job sees as ``ctx.slot``)."""
        return slot.astimezone(zone(self.timezone))


def schedule_of(
    job_key: str,
    cron: str | None,
    every: dt.timedelta | None,
    timezone: str,
    *,
    run_at: dt.datetime | None = None,
    starts_at: dt.datetime | None = None,
    ends_at: dt.datetime | None = None,
    jitter: dt.timedelta | None = None,
) -> Schedule:
    """The schedule a stored row describes (already validated when it was stored)."""
    jitter_us = 0 if jitter is None else jitter // _US
    if every is not None:
        interval = every // _US
        return Schedule(
            job_key,
            every_us=interval,
            phase_us=phase_of(job_key, interval),
            starts_at=starts_at,
            ends_at=ends_at,
            jitter_us=jitter_us,
        )
    return Schedule(
        job_key,
        cron=cron,
        timezone=timezone,
        run_at=run_at,
        starts_at=starts_at,
        ends_at=ends_at,
        jitter_us=jitter_us,
    )


@dataclass(frozen=True, slots=True)
class Policy:
    """What to do about missed slots and about runs whose holder died."""

    misfire: str = "latest"
    misfire_grace: float | None = None
    on_crash: str = "retry"
    quarantine_after: int | None = QUARANTINE_AFTER  # None: never quarantine
    #: A runtime schedule's: what a slot that came while the previous run held the lease
    #: does (None: as any missed slot, the misfire policy decides), and its most runs.
    overlap: str | None = None
    max_runs: int | None = None

    def grace(self) -> float:
        if self.misfire_grace is not None:
            return self.misfire_grace
        return SKIP_DEFAULT_GRACE if self.misfire == "skip" else float("inf")


@dataclass(frozen=True, slots=True)
class JobState:
    """The schedule state of one job, as the claim statement read it (database times)."""

    next_slot: dt.datetime
    done_slot: dt.datetime | None = None
    running_slot: dt.datetime | None = None
    running_kind: str | None = None
    running_token: int | None = None
    running_attempt: int | None = None
    trigger_at: dt.datetime | None = None
    #: The unfinished run has no finish record: its worker was gone when its lease expired
    #: (a worker that lost the lease or shut down records its end).
    prior_gone: bool = False
    #: Consecutive runs that ended with their worker gone, before this claim.
    crash_streak: int = 0
    #: Scheduled runs started so far (counted against ``Policy.max_runs``).
    runs_started: int = 0
    #: A backfill in progress: its next slot to run, and its last.
    backfill_next: dt.datetime | None = None
    backfill_to: dt.datetime | None = None
    #: When the lease before this claim ended: with ``Policy.overlap``, slots up to it came
    #: while the previous run still held the job.
    freed_at: dt.datetime | None = None
    #: The claiming worker ran the unfinished run's slot to its end, and the database does
    #: not know (the end was late or lost; another claim may have left the slot unfinished
    #: since). The slot has run: it is not run again.
    prior_ended: bool = False


@dataclass(frozen=True, slots=True)
class Skipped:
    """A slot recorded without running: ``misfire_skipped`` or ``abandoned``. A run of
    consecutive missed slots is one record: ``count`` slots from ``slot`` to ``last``."""

    slot: dt.datetime
    kind: str
    outcome: str
    error: str
    count: int = 1
    last: dt.datetime | None = None  # the run's last slot (None: a single slot)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a claim does: run one slot (or none), move the schedule, record skipped slots."""

    run_slot: dt.datetime | None = None
    run_kind: str | None = None
    attempt: int = 1
    next_slot: dt.datetime | None = None  # None: leave next_slot as it is
    done_slot: dt.datetime | None = None  # newest slot consumed without running
    trigger_at: dt.datetime | None = None  # the pending trigger this plan consumes
    skipped: tuple[Skipped, ...] = ()
    prior_token: int | None = None  # the unfinished run being resolved
    prior_error: str | None = None
    crash_streak: int = 0  # the job's streak of runs whose worker was gone, after this claim
    quarantine: str | None = None  # quarantine the job (pause it) with this reason
    #: This plan runs the backfill slot ``backfill_from``; the backfill continues at
    #: ``backfill_next`` (None: it is over).
    backfill_from: dt.datetime | None = None
    backfill_next: dt.datetime | None = None


class Due:
    """The due slots of one claim, ``count`` of them from ``first`` (``slot(i)``: the i-th):
    an ``every`` schedule's by arithmetic, however many (a week of an every-1s job's missed
    slots is one record, computed at once), a cron schedule's listed by cronsim, at most
    :data:`MAX_MISSED` per claim (``capped``: the next claim continues)."""

    __slots__ = ("_listed", "capped", "count", "first", "following", "step")

    def __init__(self, schedule: Schedule, first: dt.datetime, now: dt.datetime) -> None:
        self.first = first
        # Arithmetic only for a plain every schedule: a runtime schedule's jitter, end or
        # one-shot moves or ends its slots.
        self.step: dt.timedelta | None = None if schedule.bounded else schedule.every
        self._listed: list[dt.datetime] = []
        if self.step is not None:
            self.count = (now - first) // self.step + 1
            self.following = first + self.count * self.step
            self.capped = False
        else:
            self._listed, self.following, self.capped = due_slots(schedule, first, now)
            self.count = len(self._listed)

    def slot(self, i: int) -> dt.datetime:
        return self._listed[i] if self.step is None else self.first + i * self.step

    def count_until(self, instant: dt.datetime) -> int:
        """How many of the due slots are at or before ``instant``."""
        if instant < self.first:
            return 0
        if self.step is not None:
            return min(self.count, (instant - self.first) // self.step + 1)
        return sum(1 for slot in self._listed if slot <= instant)

    def first_within(self, now: dt.datetime, grace: float) -> int:
        """The index of the oldest slot at most ``grace`` seconds late (``count``: none)."""
        if self.step is not None:
            late = (now - self.first).total_seconds() - grace
            if late <= 0:
                return 0
            return min(self.count, -(-dt.timedelta(seconds=late) // self.step))
        for i, slot in enumerate(self._listed):
            if (now - slot).total_seconds() <= grace:
                return i
        return self.count


def due_slots(
    schedule: Schedule, first: dt.datetime, now: dt.datetime, cap: int = MAX_MISSED
) -> tuple[list[dt.datetime], dt.datetime, bool]:
    """Slots from ``first`` (itself a slot, <= now) up to ``now``: (due, following, capped).

    ``following`` is the slot after the last one returned; ``capped`` is True when more than
    ``cap`` slots were due and the rest were left for the next claim.
    """
    due = [first]
    slots = schedule.iter_after(first)
    for slot in slots:
        if slot > now:
            return due, slot, False
        if len(due) >= cap:
            return due, slot, True
        due.append(slot)
    raise AssertionError("a schedule's slots never end")  # pragma: no cover


def plan(schedule: Schedule, policy: Policy, state: JobState, now: dt.datetime, token: int) -> Plan:
    """Decide what the claim with ``token`` at database time ``now`` does.

    Order: a run left unfinished by a dead holder first (retry or abandon; quarantine the job
    when too many runs in a row ended with their worker gone), then due scheduled slots
    (overlap, then misfire policy), then the next slot of a backfill, then a pending manual
    trigger. At most one slot runs per claim; anything left over keeps the job due, so the
    next claim continues.
    """
    skipped: list[Skipped] = []
    done: dt.datetime | None = None
    prior_token: int | None = None
    prior_error: str | None = None
    streak = state.crash_streak
    unscheduled = ("manual", "backfill")  # kinds whose slot is not one the schedule moves past

    if state.running_slot is not None and state.prior_ended:
        # Its body ran; only the record of its end is missing or late: the slot is past, as
        # after any run (the start writes its history row if its own finish has not).
        prior_token = state.running_token
        prior_error = (
            f"slot {state.running_slot.isoformat()} already ran to its end on the claiming "
            "worker, whose record of it did not reach the database in time (slow or "
            f"unreachable, or lost in a failover); not run again (token {prior_token})"
        )
        if state.running_kind not in unscheduled:
            done = state.running_slot
    elif state.running_slot is not None:
        prior_token = state.running_token
        attempt = (state.running_attempt or 1) + 1
        if state.prior_gone:
            streak += 1
            ended = (
                f"the run with token {prior_token} ended with its worker gone (no finish "
                "record before its lease expired: killed, crashed or out of memory?), or "
                "did not stop when its worker shut down (recorded abandoned)"
            )
        else:
            ended = (
                f"the run with token {prior_token} did not finish (its holder stopped or lost "
                "its lease)"
            )
        if (
            state.prior_gone
            and policy.quarantine_after is not None
            and streak >= policy.quarantine_after
        ):
            reason = (
                f"quarantined: {streak} consecutive runs ended with their worker gone (the "
                f"last: slot {state.running_slot.isoformat()}, token {prior_token}); "
                "`tenure jobs resume` lifts it"
            )
            prior_error = f"{ended}; not retried: the job is {reason}"
            slot_kind = state.running_kind or "scheduled"
            return Plan(
                done_slot=None if state.running_kind in unscheduled else state.running_slot,
                skipped=(Skipped(state.running_slot, slot_kind, "abandoned", reason),),
                prior_token=prior_token,
                prior_error=prior_error,
                crash_streak=streak,
                quarantine=reason,
            )
        if policy.on_crash == "retry" and attempt <= MAX_ATTEMPTS:
            return Plan(
                run_slot=state.running_slot,
                # A manual run stays manual (its slot is the trigger time, not a schedule
                # slot), a backfill run stays a backfill run.
                run_kind=state.running_kind if state.running_kind in unscheduled else "retry",
                attempt=attempt,
                prior_token=prior_token,
                prior_error=f"{ended}; retried with token {token}",
                crash_streak=streak,
            )
        why = (
            "on_crash='skip'"
            if policy.on_crash == "skip"
            else f"it already ran {attempt - 1} times without finishing"
        )
        prior_error = f"{ended}; not retried: {why}"
        skipped.append(
            Skipped(state.running_slot, state.running_kind or "scheduled", "abandoned", prior_error)
        )
        if state.running_kind not in unscheduled:
            done = state.running_slot

    def made(**decided: Any) -> Plan:
        """The plan, with what every plan of this claim carries (read when it is made)."""
        return Plan(
            done_slot=done,
            skipped=tuple(skipped),
            prior_token=prior_token,
            prior_error=prior_error,
            crash_streak=streak,
            **decided,
        )

    run_slot: dt.datetime | None = None
    next_slot: dt.datetime | None = None
    first = state.next_slot
    floor = max((s for s in (state.done_slot, done) if s is not None), default=None)
    if floor is not None and first <= floor:
        # A slot at or before done_slot has run or was skipped: it never runs again.
        first = schedule.next_after(floor)
        next_slot = first
    if first <= now:
        missed = 0
        due: Due | None = Due(schedule, first, now)
        assert due is not None
        grace = policy.grace()
        if policy.overlap is not None and state.freed_at is not None:
            # Slots that came while the previous run held the lease: skipped, or the newest
            # of them run once after it (buffer_one) when no slot after it is due.
            held = due.count_until(state.freed_at)
            if held:
                if held == due.count and policy.overlap == "buffer_one" and not due.capped:
                    run_slot = due.slot(held - 1)
                    held -= 1
                if held:
                    last = due.slot(held - 1)
                    skipped.append(
                        Skipped(
                            due.slot(0),
                            "scheduled",
                            "misfire_skipped",
                            f"{held} slot(s) came while the previous run held the job "
                            f"(overlap={policy.overlap!r})",
                            held,
                            None if held == 1 else last,
                        )
                    )
                    done = max(last, done) if done is not None else last
                next_slot = due.following
                due = (
                    Due(schedule, due.slot(held), now)
                    if run_slot is None and held < due.count
                    else None
                )
        if due is None:
            pass
        elif policy.misfire == "all":
            # The oldest slot within the grace runs; the ones before it are missed.
            missed = due.first_within(now, grace)
            if missed < due.count:
                run_slot = due.slot(missed)
                next_slot = due.slot(missed + 1) if missed + 1 < due.count else due.following
            else:
                next_slot = due.following
        else:
            newest = due.slot(due.count - 1)
            if not due.capped and (now - newest).total_seconds() <= grace:
                run_slot = newest
            missed = due.count if run_slot is None else due.count - 1
            next_slot = due.following
        if due is not None and missed:
            # One record for the whole run of missed slots (issue 31: a row per slot was
            # 3,600 rows for an hour of an every-1s job's downtime).
            oldest, last = due.slot(0), due.slot(missed - 1)
            late = (now - last).total_seconds()
            what = (
                f"missed by {late:.3f}s"
                if missed == 1
                else f"{missed} slots missed, by {(now - oldest).total_seconds():.3f}s to "
                f"{late:.3f}s"
            )
            skipped.append(
                Skipped(
                    oldest,
                    "scheduled",
                    "misfire_skipped",
                    f"{what} (misfire={policy.misfire!r}, misfire_grace={_grace_text(policy)})",
                    missed,
                    None if missed == 1 else last,
                )
            )
            done = max(last, done) if done is not None else last
        if run_slot is not None and policy.max_runs is not None:
            if state.runs_started >= policy.max_runs:
                skipped.append(
                    Skipped(
                        run_slot,
                        "scheduled",
                        "misfire_skipped",
                        f"not run: max_runs={policy.max_runs} already started",
                    )
                )
                done = run_slot if done is None else max(done, run_slot)
                run_slot, next_slot = None, NEVER
            elif state.runs_started + 1 >= policy.max_runs:
                next_slot = NEVER  # this is the last run
        if run_slot is not None:
            return made(
                run_slot=run_slot,
                run_kind="scheduled",
                next_slot=next_slot,
            )

    if state.backfill_next is not None:
        after = schedule.next_after(state.backfill_next)
        to = state.backfill_to
        return made(
            run_slot=state.backfill_next,
            run_kind="backfill",
            next_slot=next_slot,
            backfill_from=state.backfill_next,
            backfill_next=after if to is not None and after <= to else None,
        )

    if state.trigger_at is not None:
        return made(
            run_slot=state.trigger_at,
            run_kind="manual",
            next_slot=next_slot,
            trigger_at=state.trigger_at,
        )
    return made(next_slot=next_slot)


def _grace_text(policy: Policy) -> str:
    if policy.misfire_grace is None:
        return "none" if policy.misfire != "skip" else f"{SKIP_DEFAULT_GRACE:g}s (default)"
    return f"{policy.misfire_grace:g}s"


def schedule_from_row(
    job_key: str,
    cron: str | None,
    every: dt.timedelta | None,
    timezone: str,
    **bounds: Any,
) -> Schedule:
    """The schedule stored in the database (already validated when it was registered): the
    worker, the dashboard and the exporter read it from ``jobs`` rows; ``bounds``: a runtime
    schedule's ``run_at``, ``starts_at``, ``ends_at``, ``jitter``."""
    return schedule_of(job_key, cron, every, timezone, **bounds)
