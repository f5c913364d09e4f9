"""The start of a run: ``sched_start`` for every claim whose fire time has come (at once for a
job already due, at its slot for one claimed ahead), one statement in flight at a time, in
batches of up to :data:`START_BATCH`; then the recorded runs are launched, their skipped slots
reported and the worker's saturation fed. A stopping worker gives back the claims it took
ahead of their slots instead of starting them."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import heapq
import itertools
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from .. import metrics
from .._acompat import monotonic
from ..errors import TenureError
from ..leases._async.client import AsyncClient
from ..leases.models import Grant
from .attached import OnClient
from .claim import Claim, start_params
from .identity import WorkerIdentity
from .rows import StartedRow
from .saturation import Saturation
from .schedules import Plan, Schedule
from .spec import JobSpec

log = logging.getLogger("tenure.scheduler")

#: Most claims one start statement records.
START_BATCH = 1000

#: Launches a recorded run: (claim, spec, schedule, plan, its recorded start, when its lease's
#: request was sent, and the lease a kept job's start took over: None for the claim's own).
Launch = Callable[[Claim, JobSpec, Schedule, Plan, dt.datetime, float, Grant | None], None]


class _Planned:
    """A claim planned and waiting for its start statement (``sent``: the claim's send time,
    where its lease's local deadline counts from)."""

    __slots__ = ("claim", "decided", "schedule", "sent", "spec")

    def __init__(
        self, claim: Claim, spec: JobSpec, schedule: Schedule, decided: Plan, sent: float
    ) -> None:
        self.claim, self.spec, self.schedule, self.decided = claim, spec, schedule, decided
        self.sent = sent


class Starter(OnClient):
    """One worker's starter: planned claims wait in a heap by fire time for the single task
    that records their starts. ``starting``: claims taken and not yet running or given back
    (the claim loop counts them against ``claim_ahead``); ``wake``: the claim loop's."""

    def __init__(
        self,
        who: WorkerIdentity,
        *,
        launch: Launch,
        wake: asyncio.Event,
        saturation: Saturation,
    ) -> None:
        self.who = who
        self._launch = launch
        self._wake = wake
        self.saturation = saturation
        self._stopping = False
        # Planned claims waiting for their start statement (a heap by fire time), the single
        # starter task that sends them, and how many claims are claimed but not yet running.
        self._pending: list[tuple[float, int, _Planned]] = []
        self._order = itertools.count()
        self._starter: asyncio.Task[None] | None = None
        self._start_wake = asyncio.Event()
        self.starting = 0
        #: Set by the claim loop when ``claim_ahead`` left it no room: the next launch wakes it.
        self.wake_claims = False
        # Background tasks of the claim path (the starter, claims given back): drained at stop.
        self.tasks: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Claims taken ahead of their slots are given back."""
        self._stopping = True
        self._start_wake.set()

    def queue(
        self, planned: Sequence[tuple[Claim, JobSpec, Schedule, Plan]], sent: float, received: float
    ) -> None:
        """Queue each plan for the starter at its fire time. The slot becomes a local time by
        the claim's database ``now``, counted from when the claim's answer arrived: the
        database read ``now`` before that, so no start is sent before its slot by the
        database clock (``sent``: the claim's send time, where its lease's deadline counts
        from)."""
        for claim, spec, schedule, decided in planned:
            # 0.1% later: the local clock may run slower than the database's (NTP holds the
            # error under 500 ppm); over the fire-ahead that is far below a millisecond.
            fire = received + (claim.at - claim.now).total_seconds() * 1.001
            entry = _Planned(claim, spec, schedule, decided, sent)
            heapq.heappush(self._pending, (fire, next(self._order), entry))
        if planned:
            if self._starter is None:
                self._starter = self.background(self._start_due())
            else:
                self._start_wake.set()

    def background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _start_due(self) -> None:
        """The single starter: one ``sched_start`` at a time (with the claim and the finisher,
        three pooled connections at most, so renewals still find one) for every queued plan
        whose fire time has come. A stopping worker gives back the claims it took ahead of
        their slots instead of starting them."""
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                now = monotonic()
                ahead = [p for fire, _n, p in self._pending if fire > now] if self._stopping else []
                if ahead:
                    self._pending = [e for e in self._pending if e[0] <= now]
                    heapq.heapify(self._pending)
                    await self._give_back(ahead)
                    continue
                wait = self._pending[0][0] - now
                if wait > 0:
                    self._start_wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._start_wake.wait()
                    continue
                batch: list[_Planned] = []
                keys: set[str] = set()
                later: list[tuple[float, int, _Planned]] = []
                now = monotonic()
                while self._pending and self._pending[0][0] <= now and len(batch) < START_BATCH:
                    entry = heapq.heappop(self._pending)
                    if entry[2].claim.job_key in keys:
                        # Its older claim (lease expired while it waited) is in this batch: a
                        # start row is matched to its plan by job key, so one per statement.
                        later.append(entry)
                        continue
                    keys.add(entry[2].claim.job_key)
                    batch.append(entry[2])
                for entry in later:
                    heapq.heappush(self._pending, entry)
                rows: list[StartedRow] | None = None
                sent = monotonic()  # a lease the start takes over counts from here
                try:
                    rows = await self._send_start(batch)
                finally:
                    # Launched in a callback, after this loop has sent the next start (it
                    # does so before it next yields): the server records the next batch
                    # while this one's runs are set up, instead of waiting for them.
                    loop.call_soon(self._started, batch, rows, sent)
        finally:
            self._starter = None

    def _started(self, batch: list[_Planned], rows: list[StartedRow] | None, sent: float) -> None:
        """Launch the runs of a start batch (``rows``: the statement's answer; None: it was
        not recorded; ``sent``: when it was sent) and give back the capacity of the claims
        that did not become runs."""
        launched = 0
        try:
            if rows is not None:
                launched = self._launch_started(batch, rows, sent)
        finally:
            self.starting -= len(batch)
            if launched < len(batch) or self.wake_claims:
                self.wake_claims = False
                self._wake.set()  # capacity the claim reserved and no run took

    async def _give_back(self, planned: list[_Planned]) -> None:
        """Release claims taken ahead of their slots, unstarted (the worker is stopping): the
        jobs are due for other workers at their slots, as if never claimed."""
        claims = [p.claim for p in planned]
        try:
            await release_claims(self.client, claims)
        finally:
            self.starting -= len(claims)
            for claim in claims:
                if not claim.take:  # a kept job's claim holds no lease before its start
                    metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
            self._wake.set()

    async def _send_start(self, batch: list[_Planned]) -> list[StartedRow] | None:
        """``sched_start`` for a batch; its rows, or None if it was not recorded (logged)."""
        try:
            rows = await self.client.fetch(
                "sched_start",
                start_params(
                    [(p.claim, p.decided) for p in batch],
                    worker=self.who.id,
                    host=self.who.host,
                    pid=self.who.pid,
                ),
                doing="starting runs",
                wrote=True,
                row=StartedRow,
            )
        except TenureError as exc:
            log.warning(
                "recording %d claims failed; their leases expire and the slots are claimed "
                "again: %s",
                len(batch),
                exc,
            )
            for p in batch:
                if not p.claim.take:
                    metrics.emit(metrics.RELEASE, p.claim.job_key, value=0.0)
            return None
        return rows

    def _launch_started(self, batch: list[_Planned], rows: list[StartedRow], sent: float) -> int:
        """Launch the recorded runs of a batch; how many were launched."""
        # A row per recorded job, with its run's start (NULL: nothing to run) and the lease a
        # kept job's start took over.
        answered = {row.job_key: row for row in rows}
        skipped, lateness = 0, []
        counts = self.saturation.counts
        for p in batch:
            claim, decided = p.claim, p.decided
            row = answered.get(claim.job_key)
            if row is None:
                continue
            # Saturation is this worker falling behind: a slot that came due while another
            # holder's lease kept the job (it overran, froze or died) counts from the lease's
            # end, and one skipped then does not count.
            skipped += sum(
                s.count  # a run of missed slots counts as its first slot does
                for s in decided.skipped
                if s.outcome == "misfire_skipped"
                and counts(s.slot)
                and not claim.held_elsewhere(s.slot)
            )
            slot, at = decided.run_slot, row.started_at
            if decided.run_kind == "scheduled" and slot is not None and at and counts(slot):
                lateness.append((at - claim.due_here(slot)).total_seconds())
        self.saturation.observe(skipped, lateness, monotonic())
        launched = 0
        for p in batch:
            claim, decided = p.claim, p.decided
            extra = {"job": claim.job_key, "token": claim.token}
            row = answered.get(claim.job_key)
            if row is None:
                if claim.take:
                    # Kept for this worker, but its start came after another worker's claim
                    # (the reserve had passed: a saturated worker, which says so) or after a
                    # pause, a new definition or a fenced transaction still open.
                    log.debug(
                        "job %r: kept for this worker, but not started: claimed by another "
                        "worker, changed, paused or its fence row busy",
                        claim.job_key,
                        extra=extra,
                    )
                    continue
                log.warning(
                    "job %r: claim with token %s was superseded before it started",
                    claim.job_key,
                    claim.token,
                    extra=extra,
                )
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
                continue
            if decided.quarantine is not None:
                log.error(
                    "job %r %s",
                    claim.job_key,
                    decided.quarantine,
                    extra={**extra, "quarantined": True},
                )
            self._report_skipped(claim, decided)
            at = row.started_at
            if decided.run_slot is None or at is None:
                if not claim.take:  # a kept job's start with nothing to run took no lease
                    metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
                continue
            if claim.take:  # its lease, taken over by this start, counts from its send
                assert row.token is not None and row.lease_until is not None
                metrics.emit(metrics.ACQUIRE, claim.job_key, "acquired")
                grant = Grant(row.token, row.lease_until)
                self._launch(claim, p.spec, p.schedule, decided, at, sent, grant)
            else:
                self._launch(claim, p.spec, p.schedule, decided, at, p.sent, None)
            launched += 1
        return launched

    def _report_skipped(self, claim: Claim, decided: Plan) -> None:
        if not decided.skipped:
            return
        for s in decided.skipped:
            metrics.emit(metrics.JOB, claim.job_key, s.outcome)
        missed = [s for s in decided.skipped if s.outcome == "misfire_skipped"]
        abandoned = [s for s in decided.skipped if s.outcome == "abandoned"]
        extra = {"job": claim.job_key, "token": claim.token}
        # A saturated worker reports its skipped slots in its saturation line (counted; each
        # has its history row): a warning per job would spend the CPU it lacks on logging.
        quiet = self.saturation.saturated and all(self.saturation.counts(s.slot) for s in missed)
        level = logging.DEBUG if quiet else logging.WARNING
        if missed and log.isEnabledFor(level):
            log.log(
                level,
                "job %r: %d missed slot(s) skipped (misfire=%r%s), %s .. %s",
                claim.job_key,
                sum(s.count for s in missed),
                claim.misfire,
                ", worker saturated" if quiet else "",
                missed[0].slot.isoformat(),
                (missed[-1].last or missed[-1].slot).isoformat(),
                extra=extra,
            )
        for s in abandoned:
            if decided.quarantine is not None:
                continue  # logged as the quarantine
            log.warning(
                "job %r: slot %s abandoned: %s",
                claim.job_key,
                s.slot.isoformat(),
                s.error,
                extra=extra,
            )


async def release_claims(client: AsyncClient, claims: list[Claim]) -> None:
    """``sched_unclaim``: the leases expire now and the jobs are due as before the claim."""
    try:
        await client.fetch(
            "sched_unclaim",
            {
                "keys": [c.job_key for c in claims],
                "tokens": [c.token for c in claims],
                "owners": [c.owner for c in claims],
            },
            doing="giving back claims",
            wrote=True,
        )
    except TenureError as exc:
        log.warning(
            "giving back %d claims failed (they expire by themselves): %s", len(claims), exc
        )
