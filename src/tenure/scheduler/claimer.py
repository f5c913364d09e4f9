"""The claim loop: ``sched_claim`` for as many due jobs as the worker has room for, each
claim planned (:func:`~.schedules.plan`, from the claim's database times only) and queued
for the :class:`~.starter.Starter` at its fire time. A job whose slot comes within
:data:`FIRE_AHEAD` is claimed ahead of it (fire-ahead), so its start can be recorded at the
slot itself rather than a claim's round trip after it. The claim also says when to look
again (next due slot, or a live lease's expiry), so an idle worker costs one statement per
wake-up, however many jobs there are."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import uuid
from collections.abc import Mapping
from typing import Any

from .. import metrics
from .._acompat import monotonic
from ..errors import InvalidArgument, TenureError
from .attached import OnClient
from .bodies import BodyLimit
from .claim import Claim, claims_from_rows
from .finisher import Finisher
from .rows import ClaimRow
from .saturation import Saturation
from .schedules import Plan, Schedule, plan
from .settings import WorkerSettings
from .spec import JobSpec, TaskSpec
from .starter import Starter, release_claims

log = logging.getLogger("tenure.scheduler")

#: Longest sleep without a notification.
MAX_IDLE = 10.0
#: Pause before claiming again when due jobs were left to a concurrent claimer.
CONTENTION_BACKOFF = 0.02
#: Seconds a quick run may wait for a body slot before the worker stops keeping jobs for
#: their next runs (see Claimer.reserve). As long as a late start (saturation.LAG): shorter
#: waits come and go under load (0.25 s made a loaded 5,000/s row stop keeping, which made
#: each run costlier and the waits longer).
BACKED_UP = 1.0
#: Fire-ahead, seconds: a job whose slot comes within this is claimed and planned before its
#: slot, and its start is recorded at the slot (jobs with a TTL of at least ten times this;
#: docs/safety.md, "Claiming ahead of the slot").
FIRE_AHEAD = 0.2


class Claimer(OnClient):
    """One worker's claim loop. ``wake``: set by anything that may make claiming worth it (a
    notification, a run's end, a body slot or claim room freed, a stop)."""

    def __init__(
        self,
        settings: WorkerSettings,
        specs: Mapping[str, JobSpec],
        *,
        tasks: Mapping[str, TaskSpec] | None = None,
        starter: Starter,
        finisher: Finisher,
        limit: BodyLimit,
        wake: asyncio.Event,
        saturation: Saturation,
    ) -> None:
        self.app_name = settings.app
        self.claim_ahead = settings.claim_ahead
        self.finish_backlog = settings.finish_backlog
        self.specs = specs
        self.tasks: Mapping[str, TaskSpec] = {} if tasks is None else tasks
        self.starter = starter
        self.finisher = finisher
        self.limit = limit
        self._wake = wake
        self.saturation = saturation
        self._stopping = False
        self._exclude: set[str] = set()
        self._compared: set[tuple[str, int]] = set()  # (job, revision) held against the code
        self._schedules: dict[tuple[Any, ...], Schedule] = {}
        # When the claim loop looks again unless woken (monotonic; infinity while it claims).
        self._looks_at = math.inf

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def claim_loop(self) -> None:
        failures = 0
        while not self._stopping:
            self._wake.clear()
            # A job reported due while this pass claims may be after its snapshot: any such
            # report makes the loop pass again (see due()).
            self._looks_at = math.inf
            free = self._room()
            delay = MAX_IDLE
            if free > 0:
                sent = monotonic()  # the lease's local deadline counts from here
                try:
                    rows = await self.client.fetch(
                        "sched_claim",
                        {
                            "limit": free,
                            "exclude": sorted(self._exclude),
                            "app": self.app_name,
                            "ahead": FIRE_AHEAD,
                        },
                        doing="claiming due jobs",
                        wrote=True,
                        row=ClaimRow,
                    )
                except TenureError as exc:
                    failures += 1
                    delay = min(0.25 * 2**failures, MAX_IDLE)
                    log.warning("claiming due jobs failed, retrying in %.1fs: %s", delay, exc)
                    await self._sleep_unless_stopping(delay)
                    continue
                failures = 0
                received = monotonic()
                claims, summary = claims_from_rows(rows)
                now, ready_at = summary.now, summary.ready_at
                self.saturation.started(now)
                if claims:
                    # Started in the background by the starter, each at its slot: the next
                    # claim goes out while start statements are in flight (claims never
                    # overlap: a claimed job's lease is live).
                    self.starter.starting += len(claims)
                    self._plan_claimed(claims, sent, received)
                else:
                    self.saturation.observe(0, [], monotonic())
                if len(claims) == free:
                    continue  # maybe more is due; the next pass claims with what is left
                if ready_at is not None:
                    wait = (ready_at - now).total_seconds()
                    delay = CONTENTION_BACKOFF if wait <= 0 else min(wait + 0.001, MAX_IDLE)
            if self._stopping:
                break
            self._looks_at = monotonic() + delay
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    def _room(self) -> int:
        """How many jobs the next claim may take: none while every body slot is busy or a
        quick run waits for one (more claims would only hold leases that other workers could
        run; a long run waiting for the long bodies' share stops nothing, see bodies.py);
        else claimed runs whose bodies have not begun (claimed ahead of their slots, being
        started, waiting for a body slot) up to ``claim_ahead``, ended runs whose end is not
        recorded up to ``finish_backlog``. Whichever frees room wakes the loop."""
        if not self.limit.room():
            return 0
        unstarted = self.starter.starting + self.limit.waiting
        if unstarted >= self.claim_ahead:
            self.starter.wake_claims = True
        unrecorded = self.finisher.backlog
        if unrecorded >= self.finish_backlog:
            self.finisher.wake_claims = True
        return min(self.claim_ahead - unstarted, self.finish_backlog - unrecorded)

    def reserve(self, wanted: int) -> int:
        """Room for up to ``wanted`` next runs of jobs the finisher keeps for this worker
        (:class:`~.finisher.Keeper`), counted against ``claim_ahead`` at once, as a claim's
        are. None once the worker stops, while a run has waited :data:`BACKED_UP` for a
        body slot (its bodies do not keep up: kept jobs would start on time and queue for a
        slot unseen, the same jobs first; its claims instead wait for a free slot, and their
        late starts show the worker saturated), or while the claim loop has waited as long
        for a free slot (kept runs took each one that freed, and due jobs that need a claim
        never got one: three 0.7 s jobs every second on one slot ran two of them only). Where
        the app has another live worker that is not saturated, none either while this one
        is: its jobs go to the others. A worker alone, or one of a fleet saturated all
        through, keeps them when only saturated (letting them go would add a claim to each
        run of workers already short of time: at 10,000 runs/s asked of two workers, both
        let go, claimed, and fell further behind). Not :meth:`_room`'s free body slot: at a
        few thousand short runs a second a start batch's runs always wait a moment for one,
        so the finish right after would keep nothing."""
        limit = self.limit
        if self._stopping or limit.backed_up(BACKED_UP) or limit.shut_out(BACKED_UP):
            return 0
        if self.saturation.saturated and self.finisher.spare:
            return 0
        room = self.claim_ahead - (self.starter.starting + limit.waiting)
        taken = max(0, min(wanted, room))
        self.starter.starting += taken
        return taken

    def may_keep(self, job_key: str) -> bool:
        """Not a job whose bodies are long here (:mod:`.bodies`): its next run would wait in
        line for a slot the claim loop waits for too, and get it first. Runs of such jobs
        that kept one slot busy each, with one of them always waiting, left the claim loop no
        free slot ever: jobs that needed a claim never ran again. A kept job saves a claim
        per run, which counts for runs of milliseconds, not for bodies of a second."""
        return not self.limit.is_long(job_key)

    def kept(self, rows: list[ClaimRow], reserved: int, received: float) -> None:
        """The jobs a finish kept for this worker, planned and queued as claims are (their
        starts take the leases over: a new owner each), or given back if the worker stopped
        meanwhile; the room reserved for the others is freed."""
        self.starter.starting -= reserved
        claims = [Claim.kept(row, uuid.uuid4()) for row in rows]
        if claims and self._stopping:
            self.starter.background(release_claims(self.client, claims))
        elif claims:
            self.starter.starting += len(claims)
            # No lease is held until the start takes one: its local deadline counts from the
            # start's send time (the starter's), not from here.
            self._plan_claimed(claims, received, received)
        if len(claims) < reserved:
            self._wake.set()

    def due(self, seconds: float) -> None:
        """A job a finish did not keep (a retry, a trigger, a backfill's next slot, a job let
        go) is due in ``seconds``: if the claim loop would look later than its fire-ahead
        before then, it looks now (and then sleeps until the job is due). A run's end does
        not wake it otherwise."""
        if monotonic() + seconds - FIRE_AHEAD < self._looks_at:
            self._wake.set()

    async def _sleep_unless_stopping(self, seconds: float) -> None:
        end = asyncio.get_running_loop().time() + seconds
        while not self._stopping:
            left = end - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()

    def _schedule(self, claim: Claim) -> Schedule:
        key = (claim.job_key, claim.cron, claim.every, claim.timezone, *claim.bounds)
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = claim.schedule()
            self._schedules[key] = schedule
        return schedule

    def _spec(self, claim: Claim) -> JobSpec | None:
        """The coded job, or the task of a runtime schedule, that runs ``claim``."""
        if claim.task is None:
            return self.specs.get(claim.job_key)
        task = self.tasks.get(claim.task)
        if task is None:
            return None
        return task.for_schedule(
            claim.job_key, self._schedule(claim), claim.ttl.total_seconds(), claim.policy()
        )

    def _plan_claimed(self, claims: list[Claim], sent: float, received: float) -> None:
        """Plan a claimed batch and queue each plan for the starter at its fire time: at once
        for a job already due, at its slot for one claimed ahead (:meth:`Starter.queue`)."""
        planned: list[tuple[Claim, JobSpec, Schedule, Plan]] = []
        foreign: list[Claim] = []
        for claim in claims:
            if not claim.take:  # a kept job's lease is taken (and counted) by its start
                metrics.emit(metrics.ACQUIRE, claim.job_key, "acquired")
            prior, slot = claim.state.running_token, claim.state.running_slot
            if (
                prior is not None
                and slot is not None
                and self.finisher.ran(claim.job_key, prior, slot)
            ):
                # This worker ran that slot to its end and the database does not know: the
                # end did not arrive before the lease expired (a stall, a lock) or was lost
                # in a failover, and another claim may have left it unfinished since. The
                # slot ran: it is not retried.
                claim = dataclasses.replace(
                    claim, state=dataclasses.replace(claim.state, prior_ended=True)
                )
            spec = self._spec(claim)
            if spec is None:
                foreign.append(claim)
                continue
            seen = (claim.job_key, claim.revision)
            if claim.task is None and seen not in self._compared:
                # Once per definition the database holds (every claim of it reads the same).
                self._compared.add(seen)
                if claim.differs_from(spec):
                    log.warning(
                        "job %r: the database holds a different definition (revision %d: %s) "
                        "than this worker's code (%s); following the database, where the app's "
                        "newest registration wins. Restart this worker with the current code",
                        claim.job_key,
                        claim.revision,
                        self._schedule(claim).describe(),
                        spec.schedule.describe(),
                        extra={"job": claim.job_key},
                    )
            try:
                decided = plan(
                    self._schedule(claim), claim.policy(), claim.state, claim.at, claim.token
                )
            except (InvalidArgument, ValueError) as exc:
                log.error(
                    "job %r: its stored schedule cannot be used (%s); leaving it alone",
                    claim.job_key,
                    exc,
                    extra={"job": claim.job_key},
                )
                foreign.append(claim)
                continue
            planned.append((claim, spec, self._schedule(claim), decided))
        if foreign:
            self.starter.starting -= len(foreign)
            self._unclaim(foreign)
            self._wake.set()  # capacity the claim reserved and no run took
        self.starter.queue(planned, sent, received)

    def _unclaim(self, claims: list[Claim]) -> None:
        """Leave jobs this worker cannot run to the workers that can: excluded from its
        claims from now on (before the next claim is sent), their claims given back."""
        for claim in claims:
            if claim.job_key not in self._exclude:
                log.warning(
                    "job %r is scheduled in the database but this worker has no %s for "
                    "it; leaving it to workers that do",
                    claim.job_key,
                    "function" if claim.task is None else f"task {claim.task!r}",
                    extra={"job": claim.job_key},
                )
            self._exclude.add(claim.job_key)
            if not claim.take:
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
        self.starter.background(release_claims(self.client, claims))
