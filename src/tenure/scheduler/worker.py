"""The scheduler worker: one asyncio event loop that claims due jobs and runs them.

Life of a run (statements in ``db/sql/scheduler.sql``):

1. ``sched_claim`` (one statement per batch): due, unpaused jobs whose lease is free or
   expired are locked with ``FOR UPDATE SKIP LOCKED`` and their leases taken over with
   token + 1, as many as the worker has free capacity. The statement also says when to look
   again (next due slot, or a live lease's expiry), so an idle worker costs one statement
   per wake-up, however many jobs there are. A job whose slot comes within
   :data:`FIRE_AHEAD` is claimed ahead of it (fire-ahead), so its start can be recorded at
   the slot itself rather than a claim's round trip after it.
2. :func:`~.schedules.plan` decides in Python, from the claim's database times only: retry
   an unfinished slot, run the newest/oldest due slot (misfire policy), run a manual
   trigger; and computes the following slot with cronsim.
3. ``sched_start`` (one statement per batch, sent by the starter once the batch's slots
   have come by the database clock) records the plan, fenced on the claim's token:
   ``next_slot`` moves forward only, skipped slots get history rows, the run gets its row.
4. The job runs with its lease renewed every ttl/3 (the core's :class:`AsyncLease`). Async
   functions run as tasks on this loop (cancelled when the lease is lost); sync ones in
   reused daemon threads (``ctx.check()`` raises and ``ctx.cancelled`` is set when it is
   lost). Daemon threads rather than a ThreadPoolExecutor: a sync job that ignores
   cancellation must not keep a stopping worker alive (executor threads are joined at
   interpreter exit). ``concurrency`` bounds runs in flight, sync or async: the claim never
   takes more.
5. ``sched_finish`` records the outcome and releases the lease, for a batch of runs: one
   finisher task sends whatever ended while its previous statement was in flight. A finished
   slot (succeeded or failed with the lease intact) is never run again; a run that lost
   its lease or was cancelled at shutdown leaves the slot to be retried, and peers are
   notified so one of them takes it over at once.

Saturation (:mod:`.saturation`): slots that came due while the worker ran and were skipped,
or started over a second late, make it log a warning and emit the ``worker_saturated`` metric.

Wake-ups: the claim's "look again at" time, a ``LISTEN`` on a dedicated connection (schedule
changes, pause/resume/trigger, handed-over slots), and the end of a local run. The longest
sleep is :data:`MAX_IDLE`, a safety net for a lost notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import heapq
import itertools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .. import metrics
from .._acompat import monotonic
from ..db.channels import channel
from ..db.retention import age_text
from ..errors import DatabaseUnavailable, InvalidArgument, SchemaNotReady, TenureError
from ..leases._async.client import AsyncClient, connect_async, default_margin
from ..leases._async.lease import AsyncLease
from ..leases.models import Grant
from .background import listen, prune
from .claim import (
    Claim,
    Finished,
    InProgress,
    claims_from_rows,
    finish_params,
    run_fields,
    running_params,
    start_params,
)
from .context import JobContext
from .execution import Run, execute
from .registration import register
from .saturation import Saturation
from .schedules import Plan, Schedule, plan, schedule_from_row
from .vacuum import vacuum_forever

if TYPE_CHECKING:
    from .app import Scheduler
    from .spec import JobSpec

log = logging.getLogger("tenure.scheduler")

#: Longest sleep without a notification.
MAX_IDLE = 10.0
#: Pause before claiming again when due jobs were left to a concurrent claimer.
CONTENTION_BACKOFF = 0.02
#: Most runs one finish statement records (a batch is whatever ended while the last was sent).
FINISH_BATCH = 1000
#: Seconds: under load, the finisher sends at most one statement this often.
FINISH_EVERY = 0.05
#: The schema version this worker needs (12: a run's history row written once, at its end).
SCHEMA_VERSION = 12
#: Fire-ahead, seconds: a job whose slot comes within this is claimed and planned before its
#: slot, and its start is recorded at the slot (jobs with a TTL of at least ten times this;
#: docs/safety.md, "Claiming ahead of the slot").
FIRE_AHEAD = 0.2
#: Most claims one start statement records.
START_BATCH = 1000
#: Seconds: a run still going this long after its start gets its history row now (outcome
#: 'running', completed by its finish), so that history and the dashboard show it; a shorter
#: run's row is written once, at its end (migration 12).
RUNNING_ROW_AFTER = 1.0


class _Planned:
    """A claim planned and waiting for its start statement (``sent``: the claim's send time,
    where its lease's local deadline counts from)."""

    __slots__ = ("claim", "decided", "schedule", "sent", "spec")

    def __init__(
        self, claim: Claim, spec: JobSpec, schedule: Schedule, decided: Plan, sent: float
    ) -> None:
        self.claim, self.spec, self.schedule, self.decided = claim, spec, schedule, decided
        self.sent = sent


class Worker:
    """Runs one :class:`~tenure.Scheduler`'s jobs until asked to stop."""

    def __init__(
        self, app: Scheduler, *, concurrency: int, shutdown_grace: float, adopt: bool = False
    ) -> None:
        self.app = app
        self.app_name = app.name
        self.adopt = adopt
        self.concurrency = concurrency
        # Ended runs that make the finisher send at once (see _finish_batches).
        self._full = max(1, concurrency // 4)
        self.shutdown_grace = shutdown_grace
        self.id = uuid.uuid4().hex[:12]
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.channel = channel("jobs", app.schema)
        self._client: AsyncClient | None = None
        # Keyed by (job, token): a run that lost its lease may still be finishing when this
        # same worker claims the job's retry.
        self._running: dict[tuple[str, int], Run] = {}
        # Ended runs waiting for the finisher, and the finisher task while it runs.
        self._finishing: list[tuple[Finished, Run, float]] = []
        self._finisher: asyncio.Task[None] | None = None
        self._finish_wake = asyncio.Event()
        # Planned claims waiting for their start statement (a heap by fire time), the single
        # starter task that sends them, and how many claims are claimed but not yet running.
        self._pending: list[tuple[float, int, _Planned]] = []
        self._order = itertools.count()
        self._starter: asyncio.Task[None] | None = None
        self._start_wake = asyncio.Event()
        self._starting = 0
        # Background tasks of the claim path (the starter, claims given back): drained at stop.
        self._starts: set[asyncio.Task[None]] = set()
        #: Set once the worker has registered its jobs and claims (for embedding and tests).
        self.ready = threading.Event()
        self._wake = asyncio.Event()
        self._stopping = False
        self._cancel_now = False
        self._signals = 0
        self._exclude: set[str] = set()
        self._warned: set[tuple[str, int]] = set()
        self._schedules: dict[tuple[str, str | None, dt.timedelta | None, str], Schedule] = {}
        self.runs = 0
        self.handed_over = 0
        self.saturation = Saturation(self.id, self.app_name)

    @property
    def label(self) -> str:
        return f"worker {self.id} ({self.host} pid {self.pid})"

    @property
    def application_name(self) -> str:
        """What pg_stat_activity shows for this worker's connections."""
        return f"tenure worker {self.id}"

    @property
    def client(self) -> AsyncClient:
        assert self._client is not None, "the worker is not running"
        return self._client

    # -- control ----------------------------------------------------------------------------

    def on_signal(self, signum: int) -> None:
        self._signals += 1
        name = _signal_name(signum)
        if self._signals == 1:
            log.info(
                "%s received: %s claims nothing more and gives %d running jobs up to %.1fs "
                "to finish (send it again to cancel them now)",
                name,
                self.label,
                len(self._running),
                self.shutdown_grace,
            )
            self.request_stop(False)
        else:
            log.warning(
                "%s received again: cancelling %d running jobs and handing their slots over",
                name,
                len(self._running),
            )
            self.request_stop(True)

    def request_stop(self, cancel: bool = False) -> None:
        self._stopping = True
        if cancel:
            self._cancel_now = True
        self._wake.set()
        self._finish_wake.set()
        self._start_wake.set()  # claims taken ahead of their slots are given back

    # -- main -------------------------------------------------------------------------------

    async def run(self) -> None:
        app = self.app
        if not app.jobs:
            raise InvalidArgument("the app defines no jobs: decorate functions with @app.job(...)")
        specs = list(app.jobs.values())
        self._client = await connect_async(
            app.dsn,
            schema=app.schema,
            pool_size=app.pool_size,
            migrate=app.migrate,
            application_name=self.application_name,
        )
        tasks: list[asyncio.Task[None]] = []
        cancelled = False
        try:
            version = await self.client.schema_version()
            if version is None or version < SCHEMA_VERSION:
                raise SchemaNotReady(
                    f"schema {app.schema!r} on {self.client.where} has no scheduler tables "
                    f"(version {version}, need {SCHEMA_VERSION}); run `tenure migrate` or "
                    "start the worker with --migrate"
                )
            await register(
                self.client, specs, defined_by=self.label, app=self.app_name, adopt=self.adopt
            )
            listener = listen(
                self.app.dsn,
                self.channel,
                self._wake,
                application_name=self.application_name,
                safety_net=MAX_IDLE,
            )
            pruner = prune(self.client, self.app.retention)
            tasks.append(asyncio.create_task(listener, name="tenure-listen"))
            tasks.append(asyncio.create_task(pruner, name="tenure-prune"))
            tasks.append(asyncio.create_task(self._rows_in_progress(), name="tenure-running"))
            if app.vacuum_every > 0:
                vacuum = vacuum_forever(self.client, app.vacuum_every, who=self.label)
                tasks.append(asyncio.create_task(vacuum, name="tenure-vacuum"))
            log.info(
                "tenure %s started: %d jobs, concurrency %d, schema %r on %s, app %r, "
                "history kept %s (inbox claims %s)",
                self.label,
                len(specs),
                self.concurrency,
                app.schema,
                self.client.where,
                self.app_name,
                age_text(self.app.retention.history),
                age_text(self.app.retention.inbox),
                extra={"worker": self.id},
            )
            self.ready.set()
            try:
                await self._claim_loop()
            except asyncio.CancelledError:
                # Cancelling run_async() is an immediate stop: hand everything over, then
                # let the cancellation through.
                cancelled = True
                self.request_stop(True)
            await self._drain()
            log.info(
                "tenure %s stopped: %d jobs, %d runs, %d handed over",
                self.label,
                len(specs),
                self.runs,
                self.handed_over,
                extra={"worker": self.id},
            )
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.client.close()
        if cancelled:
            raise asyncio.CancelledError

    async def _claim_loop(self) -> None:
        failures = 0
        while not self._stopping:
            self._wake.clear()
            free = self.concurrency - len(self._running) - self._starting
            delay = MAX_IDLE
            if free > 0:
                sent = monotonic()  # the lease's local deadline counts from here
                try:
                    rows = await self.client._fetch(
                        "sched_claim",
                        {
                            "limit": free,
                            "exclude": sorted(self._exclude),
                            "app": self.app_name,
                            "ahead": FIRE_AHEAD,
                        },
                        doing="claiming due jobs",
                        wrote=True,
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
                now, ready_at = summary[19], summary[20]
                self.saturation.started(now)
                if claims:
                    # Started in the background by the starter, each at its slot: the next
                    # claim goes out while start statements are in flight (claims never
                    # overlap: a claimed job's lease is live).
                    self._starting += len(claims)
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
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

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

    # -- claim → plan → start -----------------------------------------------------------

    def _schedule(self, claim: Claim) -> Schedule:
        key = (claim.job_key, claim.cron, claim.every, claim.timezone)
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = schedule_from_row(claim.job_key, claim.cron, claim.every, claim.timezone)
            self._schedules[key] = schedule
        return schedule

    def _plan_claimed(self, claims: list[Claim], sent: float, received: float) -> None:
        """Plan a claimed batch and queue each plan for the starter at its fire time: at once
        for a job already due, at its slot for one claimed ahead. The slot becomes a local
        time by the claim's database ``now``, counted from when the claim's answer arrived:
        the database read ``now`` before that, so no start is sent before its slot by the
        database clock."""
        planned: list[tuple[Claim, JobSpec, Schedule, Plan]] = []
        foreign: list[Claim] = []
        for claim in claims:
            metrics.emit(metrics.ACQUIRE, claim.job_key, "acquired")
            spec = self.app.jobs.get(claim.job_key)
            if spec is None:
                foreign.append(claim)
                continue
            if claim.differs_from(spec) and (claim.job_key, claim.revision) not in self._warned:
                self._warned.add((claim.job_key, claim.revision))
                log.warning(
                    "job %r: the database holds a different definition (revision %d: %s) "
                    "than this worker's code (%s); following the database, where the app's newest "
                    "registration wins. Restart this worker with the current code",
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
            self._starting -= len(foreign)
            self._unclaim(foreign)
            self._wake.set()  # capacity the claim reserved and no run took
        for claim, spec, schedule, decided in planned:
            # 0.1% later: the local clock may run slower than the database's (NTP holds the
            # error under 500 ppm); over the fire-ahead that is far below a millisecond.
            fire = received + (claim.at - claim.now).total_seconds() * 1.001
            entry = _Planned(claim, spec, schedule, decided, sent)
            heapq.heappush(self._pending, (fire, next(self._order), entry))
        if planned:
            if self._starter is None:
                self._starter = self._background(self._start_due())
            else:
                self._start_wake.set()

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)
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
                rows: list[tuple[Any, ...]] | None = None
                try:
                    rows = await self._send_start(batch)
                finally:
                    # Launched in a callback, after this loop has sent the next start (it
                    # does so before it next yields): the server records the next batch
                    # while this one's runs are set up, instead of waiting for them.
                    loop.call_soon(self._started, batch, rows)
        finally:
            self._starter = None

    def _started(self, batch: list[_Planned], rows: list[tuple[Any, ...]] | None) -> None:
        """Launch the runs of a start batch (``rows``: the statement's answer; None: it was
        not recorded) and give back the capacity of the claims that did not become runs."""
        try:
            if rows is not None:
                self._launch_started(batch, rows)
        finally:
            launched = sum(1 for p in batch if (p.claim.job_key, p.claim.token) in self._running)
            self._starting -= len(batch)
            if launched < len(batch):
                self._wake.set()  # capacity the claim reserved and no run took

    async def _give_back(self, planned: list[_Planned]) -> None:
        """Release claims taken ahead of their slots, unstarted (the worker is stopping): the
        jobs are due for other workers at their slots, as if never claimed."""
        claims = [p.claim for p in planned]
        try:
            await self._release_claims(claims)
        finally:
            self._starting -= len(claims)
            for claim in claims:
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
            self._wake.set()

    async def _send_start(self, batch: list[_Planned]) -> list[tuple[Any, ...]] | None:
        """``sched_start`` for a batch; its rows, or None if it was not recorded (logged)."""
        try:
            rows = await self.client._fetch(
                "sched_start",
                start_params(
                    [(p.claim, p.decided) for p in batch],
                    worker=self.id,
                    host=self.host,
                    pid=self.pid,
                ),
                doing="starting runs",
                wrote=True,
            )
        except TenureError as exc:
            log.warning(
                "recording %d claims failed; their leases expire and the slots are claimed "
                "again: %s",
                len(batch),
                exc,
            )
            for p in batch:
                metrics.emit(metrics.RELEASE, p.claim.job_key, value=0.0)
            return None
        return rows

    def _launch_started(self, batch: list[_Planned], rows: list[tuple[Any, ...]]) -> None:
        # A row per recorded job, with its run's start (NULL: nothing to run).
        started: dict[str, dt.datetime | None] = dict(rows)
        recorded = started.keys()
        skipped, lateness = 0, []
        counts = self.saturation.counts
        for p in batch:
            claim, decided = p.claim, p.decided
            if claim.job_key not in recorded:
                continue
            # Saturation is this worker falling behind: a slot that came due while another
            # holder's lease kept the job (it overran, froze or died) counts from the lease's
            # end, and one skipped then does not count.
            skipped += sum(
                s.outcome == "misfire_skipped"
                and counts(s.slot)
                and not claim.held_elsewhere(s.slot)
                for s in decided.skipped
            )
            slot, at = decided.run_slot, started[claim.job_key]
            if decided.run_kind == "scheduled" and slot is not None and at and counts(slot):
                lateness.append((at - claim.due_here(slot)).total_seconds())
        self.saturation.observe(skipped, lateness, monotonic())
        for p in batch:
            claim, decided = p.claim, p.decided
            extra = {"job": claim.job_key, "token": claim.token}
            if claim.job_key not in recorded:
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
            at = started[claim.job_key]
            if decided.run_slot is None or at is None:
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
                continue
            self._launch(claim, p.spec, p.schedule, decided, at, p.sent)

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
                len(missed),
                claim.misfire,
                ", worker saturated" if quiet else "",
                missed[0].slot.isoformat(),
                missed[-1].slot.isoformat(),
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

    def _unclaim(self, claims: list[Claim]) -> None:
        """Leave jobs this worker cannot run to the workers that can: excluded from its
        claims from now on (before the next claim is sent), their claims given back."""
        for claim in claims:
            if claim.job_key not in self._exclude:
                log.warning(
                    "job %r is scheduled in the database but this worker has no function for "
                    "it; leaving it to workers that do",
                    claim.job_key,
                    extra={"job": claim.job_key},
                )
            self._exclude.add(claim.job_key)
            metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
        self._background(self._release_claims(claims))

    async def _release_claims(self, claims: list[Claim]) -> None:
        """``sched_unclaim``: the leases expire now and the jobs are due as before the claim."""
        try:
            await self.client._fetch(
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

    # -- running ----------------------------------------------------------------------------

    def _launch(
        self,
        claim: Claim,
        spec: JobSpec,
        schedule: Schedule,
        decided: Plan,
        started_at: dt.datetime,
        sent: float,
    ) -> None:
        assert decided.run_slot is not None and decided.run_kind is not None
        ttl = claim.ttl.total_seconds()
        lease = AsyncLease(
            self.client,
            claim.job_key,
            claim.owner,
            Grant(claim.token, claim.lease_until),
            ttl=ttl,
            safety_margin=default_margin(ttl),
            sent_at=sent,
        )
        ctx = JobContext(
            job_key=claim.job_key,
            token=claim.token,
            slot=schedule.local(decided.run_slot),
            kind=decided.run_kind,
            attempt=decided.attempt,
            lease=lease,
            client=self.client,
            worker_id=self.id,
        )
        lease.on_lost(lambda lost: ctx._stop(lost.lost_reason or "the lease is lost"))
        run = Run(
            spec, claim, decided.run_slot, decided.run_kind, ctx, lease, started_at, monotonic()
        )
        if decided.run_kind == "scheduled":
            metrics.emit(
                metrics.JOB_LATENESS,
                claim.job_key,
                "scheduled",
                (started_at - decided.run_slot).total_seconds(),
            )
        self._running[(claim.job_key, claim.token)] = run
        run.task = asyncio.create_task(self._run(run), name=f"tenure-run-{claim.job_key}")

    async def _run(self, run: Run) -> None:
        outcome, error, duration = await execute(run)
        self._finish(run, outcome, error, duration)

    def _finish(self, run: Run, outcome: str, error: str | None, duration: float) -> None:
        """Queue the run's end for the finisher, which ends the run once it is recorded (or
        given up): the run counts against the concurrency until then, and a stopping worker
        waits for the finisher. No future and task step per run wait for it."""
        done = outcome in ("succeeded", "failed")
        item = Finished(
            run.claim.job_key,
            run.claim.token,
            run.claim.owner,
            run.slot,
            run.kind,
            run.ctx.attempt,
            run.started_at,
            done,
            outcome,
            error,
        )
        run.ended = True
        self._finishing.append((item, run, duration))
        if len(self._finishing) >= self._full:
            self._finish_wake.set()
        if self._finisher is None:
            self._finisher = asyncio.create_task(self._finish_batches(), name="tenure-finish")

    async def _finish_batches(self) -> None:
        """The single finisher: one ``sched_finish`` for whatever runs ended while the previous
        batch was in flight. Batches grow with the load and are single runs when idle, so an
        idle worker adds no latency, and finishing takes one pooled connection at a time
        instead of one per run."""
        batch: list[tuple[Finished, Run, float]] = []
        try:
            while self._finishing:
                batch = self._finishing[:FINISH_BATCH]
                del self._finishing[:FINISH_BATCH]
                sent = monotonic()
                try:
                    outcomes = await self._record_finished([item for item, _, _ in batch])
                except Exception:
                    log.exception("recording the end of %d runs failed unexpectedly", len(batch))
                    outcomes = {}
                ended, batch = batch, []
                for item, run, duration in ended:
                    recorded = outcomes.get((item.job_key, item.token), item.outcome)
                    self._ended(run, item.done, recorded, item.error, duration)
                # Under load, at most one finish per FINISH_EVERY, unless a quarter of the
                # concurrency is waiting for it: bigger batches cost the server less per run,
                # and the starts (a run's lateness) meet fewer statements competing for its
                # CPUs. An idle worker's lone finish is sent at once (this loop has ended).
                pause = sent + FINISH_EVERY - monotonic()
                if pause > 0 and not self._stopping and 0 < len(self._finishing) < self._full:
                    self._finish_wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(pause):
                            await self._finish_wake.wait()
        finally:
            self._finisher = None
            # Cancelled while recording (the loop is closing): the runs end with what their
            # bodies did.
            for item, run, duration in batch:
                self._ended(run, item.done, item.outcome, item.error, duration)

    async def _record_finished(self, batch: list[Finished]) -> dict[tuple[str, int], str]:
        """Send one batch (retried on a lost connection); returns each run's recorded outcome."""
        ordered = sorted(batch, key=lambda f: (f.job_key, f.token))  # one lock order
        for attempt in range(3):
            try:
                rows = await self.client._fetch(
                    "sched_finish",
                    finish_params(
                        ordered, channel=self.channel, worker=self.id, host=self.host, pid=self.pid
                    ),
                    doing=f"finishing {len(ordered)} runs",
                    wrote=True,
                )
                break
            except DatabaseUnavailable as exc:
                if attempt == 2:
                    for f in ordered:
                        log.warning(
                            "job %r: recording the end of slot %s failed (%s); its lease "
                            "expires and the slot will be retried",
                            f.job_key,
                            f.slot.isoformat(),
                            exc,
                            extra=run_fields(f.job_key, f.token, f.slot),
                        )
                    return {}
                await asyncio.sleep(0.5)
            except TenureError as exc:
                for f in ordered:
                    log.warning(
                        "job %r: recording the end of a run failed: %s",
                        f.job_key,
                        exc,
                        extra=run_fields(f.job_key, f.token, f.slot),
                    )
                return {}
        recorded: dict[tuple[str, int], str] = {}
        by_key = {(f.job_key, f.token): f for f in ordered}
        for key, token, matched, recorded_outcome, current, _notified in rows:
            f = by_key[(key, token)]
            outcome = recorded_outcome or f.outcome
            recorded[(key, token)] = outcome
            if not matched and f.outcome in ("succeeded", "failed"):
                log.warning(
                    "job %r slot %s finished with token %s after the job was taken over "
                    "(token %s): recorded as %s",
                    key,
                    f.slot.isoformat(),
                    token,
                    current,
                    outcome,
                    extra=run_fields(key, token, f.slot),
                )
        return recorded

    async def _rows_in_progress(self) -> None:
        """Write the 'running' history rows of runs that outlived :data:`RUNNING_ROW_AFTER`,
        one statement for all that came due since the last look (until cancelled)."""
        while True:
            await asyncio.sleep(RUNNING_ROW_AFTER / 2)
            due = monotonic() - RUNNING_ROW_AFTER
            runs = [
                r
                for r in self._running.values()
                if not (r.row_written or r.ended) and r.launched <= due
            ]
            if not runs:
                continue
            try:
                await self.client._fetch(
                    "sched_running",
                    running_params(
                        [
                            InProgress(
                                r.claim.job_key,
                                r.claim.token,
                                r.claim.owner,
                                r.slot,
                                r.kind,
                                r.ctx.attempt,
                                r.started_at,
                            )
                            for r in runs
                        ],
                        worker=self.id,
                        host=self.host,
                        pid=self.pid,
                    ),
                    doing=f"recording {len(runs)} runs in progress",
                    wrote=True,
                )
            except TenureError as exc:
                log.warning("recording %d runs in progress failed (retried): %s", len(runs), exc)
                continue
            for r in runs:
                r.row_written = True

    def _ended(
        self, run: Run, done: bool, recorded: str, error: str | None, duration: float
    ) -> None:
        key, token = run.claim.job_key, run.claim.token
        # A lease marked lost has already been counted out of tenure_leases_held.
        counted_out = run.lease._lost_reason is not None  # without evaluating the deadline
        run.lease.mark_released()
        self.runs += 1
        if not done:
            self.handed_over += 1
        if not counted_out:
            metrics.emit(metrics.RELEASE, key, value=duration)
        metrics.emit(metrics.JOB, key, recorded, duration)
        if recorded in ("lease_lost", "stale_rejected", "cancelled"):
            log.warning(
                "job %r slot %s token %s: %s (%s)",
                key,
                run.slot.isoformat(),
                token,
                recorded,
                error,
                extra=run_fields(key, token, run.slot, outcome=recorded),
            )
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job %r slot %s token %s: %s in %.3fs",
                key,
                run.slot.isoformat(),
                token,
                recorded,
                duration,
                extra=run_fields(key, token, run.slot, outcome=recorded),
            )
        self._running.pop((key, token), None)
        self._wake.set()

    async def _drain(self) -> None:
        """Let running jobs finish within the grace, then cancel them and hand them over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_grace
        if self._starts:  # their runs join the ones below (or their claims are released)
            await asyncio.wait(set(self._starts), timeout=self.shutdown_grace)
        if self._running and not self._cancel_now:
            log.info(
                "waiting up to %.1fs for %d running jobs", self.shutdown_grace, len(self._running)
            )
        while self._running and not self._cancel_now:
            left = deadline - loop.time()
            if left <= 0:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()
        runs = list(self._running.values())
        for run in runs:
            run.shutdown = True
            run.ctx._stop("the worker is shutting down")
            if run.body is not None:
                run.body.cancel()  # a thread cannot be stopped: stop waiting for it
        tasks = [run.task for run in runs if run.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)
        if self._finisher is not None:  # the ends those runs queued, recorded before closing
            await asyncio.wait({self._finisher}, timeout=10.0)
        if self.handed_over:
            with contextlib.suppress(TenureError):
                await self.client._fetch(
                    "sched_notify",
                    {"channel": self.channel, "payload": "stopped"},
                    doing="notifying peers",
                )


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["Worker", "register"]
