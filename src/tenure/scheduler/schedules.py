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
    """When one job fires. Exactly one of ``cron`` (in ``timezone``) and ``every_us``."""

    job_key: str
    cron: str | None = None
    every_us: int | None = None
    timezone: str = "UTC"
    phase_us: int = field(default=0, compare=False)

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
        if self.every_us is not None:
            return f"every {self.every_us / 1e6:g}s"
        return f"cron {self.cron!r} {self.timezone}"

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        """The first slot strictly after ``instant`` (aware), as an aware UTC datetime."""
        return next(self.iter_after(instant))

    def iter_after(self, instant: dt.datetime) -> Iterator[dt.datetime]:
        """Slots strictly after ``instant``, strictly increasing, as aware UTC datetimes."""
        if instant.tzinfo is None:
            raise ValueError("slot maths needs an aware datetime")
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

    def local(self, slot: dt.datetime) -> dt.datetime:
        """``slot`` in the job's time zone (what a job sees as ``ctx.slot``)."""
        return slot.astimezone(zone(self.timezone))


@dataclass(frozen=True, slots=True)
class Policy:
    """What to do about missed slots and about runs whose holder died."""

    misfire: str = "latest"
    misfire_grace: float | None = None
    on_crash: str = "retry"
    quarantine_after: int | None = QUARANTINE_AFTER  # None: never quarantine

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


class Due:
    """The due slots of one claim, ``count`` of them from ``first`` (``slot(i)``: the i-th):
    an ``every`` schedule's by arithmetic, however many (a week of an every-1s job's missed
    slots is one record, computed at once), a cron schedule's listed by cronsim, at most
    :data:`MAX_MISSED` per claim (``capped``: the next claim continues)."""

    __slots__ = ("_listed", "capped", "count", "first", "following", "step")

    def __init__(self, schedule: Schedule, first: dt.datetime, now: dt.datetime) -> None:
        self.first = first
        self.step: dt.timedelta | None = schedule.every
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
    (misfire policy), then a pending manual trigger. At most one slot runs per claim;
    anything left over keeps the job due, so the next claim continues.
    """
    skipped: list[Skipped] = []
    done: dt.datetime | None = None
    prior_token: int | None = None
    prior_error: str | None = None
    streak = state.crash_streak

    if state.running_slot is not None:
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
                done_slot=None if state.running_kind == "manual" else state.running_slot,
                skipped=(Skipped(state.running_slot, slot_kind, "abandoned", reason),),
                prior_token=prior_token,
                prior_error=prior_error,
                crash_streak=streak,
                quarantine=reason,
            )
        if policy.on_crash == "retry" and attempt <= MAX_ATTEMPTS:
            return Plan(
                run_slot=state.running_slot,
                # A manual run stays manual: its slot is the trigger time, not a schedule slot.
                run_kind="manual" if state.running_kind == "manual" else "retry",
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
        if state.running_kind != "manual":
            done = state.running_slot

    run_slot: dt.datetime | None = None
    next_slot: dt.datetime | None = None
    first = state.next_slot
    floor = max((s for s in (state.done_slot, done) if s is not None), default=None)
    if floor is not None and first <= floor:
        # A slot at or before done_slot has run or was skipped: it never runs again.
        first = schedule.next_after(floor)
        next_slot = first
    if first <= now:
        due = Due(schedule, first, now)
        grace = policy.grace()
        if policy.misfire == "all":
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
        if missed:
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
        if run_slot is not None:
            return Plan(
                run_slot=run_slot,
                run_kind="scheduled",
                next_slot=next_slot,
                done_slot=done,
                skipped=tuple(skipped),
                prior_token=prior_token,
                prior_error=prior_error,
                crash_streak=streak,
            )

    if state.trigger_at is not None:
        return Plan(
            run_slot=state.trigger_at,
            run_kind="manual",
            next_slot=next_slot,
            done_slot=done,
            trigger_at=state.trigger_at,
            skipped=tuple(skipped),
            prior_token=prior_token,
            prior_error=prior_error,
            crash_streak=streak,
        )
    return Plan(
        next_slot=next_slot,
        done_slot=done,
        skipped=tuple(skipped),
        prior_token=prior_token,
        prior_error=prior_error,
        crash_streak=streak,
    )


def _grace_text(policy: Policy) -> str:
    if policy.misfire_grace is None:
        return "none" if policy.misfire != "skip" else f"{SKIP_DEFAULT_GRACE:g}s (default)"
    return f"{policy.misfire_grace:g}s"


def schedule_from_row(
    job_key: str, cron: str | None, every: dt.timedelta | None, timezone: str
) -> Schedule:
    """The schedule stored in the database (already validated when it was registered): the
    worker, the dashboard and the exporter read it from ``jobs`` rows."""
    if every is not None:
        interval = every // _US
        return Schedule(job_key, every_us=interval, phase_us=phase_of(job_key, interval))
    return Schedule(job_key, cron=cron, timezone=timezone)
