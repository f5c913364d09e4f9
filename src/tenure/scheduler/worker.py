"""The scheduler worker: one asyncio event loop that claims due jobs and runs them.

Life of a run (statements in ``db/sql/scheduler.sql``), each step in a module of its own that
this one wires together (the :class:`~.claimer.Claimer`, the :class:`~.starter.Starter`, the
:class:`~.finisher.Finisher`; a run's identity, :class:`~.claim.RunIdentity`, is built once
here when its start is recorded, and carried to its 'running' row and its end):

1. ``sched_claim`` (one statement per batch): due, unpaused jobs whose lease is free or
   expired are locked with ``FOR UPDATE SKIP LOCKED`` and their leases taken over with
   token + 1, as many as the worker has free capacity. The statement also says when to look
   again (next due slot, or a live lease's expiry), so an idle worker costs one statement
   per wake-up, however many jobs there are. A job whose slot comes within
   :data:`~.claimer.FIRE_AHEAD` is claimed ahead of it (fire-ahead), so its start can be recorded at
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
   interpreter exit). ``concurrency`` bounds job bodies running at once, sync or async,
   and only that (:mod:`.bodies`): a run whose slot came while every body slot is busy
   waits for one, its lease renewed. Claimed runs whose bodies have not begun are bounded
   by ``claim_ahead``, ended runs whose end is not recorded by ``finish_backlog``.
5. ``sched_finish`` records the outcome and releases the lease, for a batch of runs: one
   finisher task sends whatever ended while its previous statement was in flight. A finished
   slot (succeeded or failed with the lease intact) is never run again; a run that lost
   its lease or was cancelled at shutdown leaves the slot to be retried, and peers are
   notified so one of them takes it over at once.

Saturation (:mod:`.saturation`): slots that came due while the worker ran and were skipped,
or started over a second late, make it log a warning and emit the ``worker_saturated`` metric.

Loop lag (:mod:`.looplag`): a job that blocks this loop (sync code inside ``async def``) is
named in a warning and the ``worker_loop_lag`` metric; the lease it loses under a live worker
does not count toward quarantine (``sched_claim``'s ``prior_gone``).

Wake-ups: the claim's "look again at" time, a ``LISTEN`` on a dedicated connection (schedule
changes, pause/resume/trigger, handed-over slots), and room for more claims (a body slot, a
start, a recorded end where the claim loop found none). The longest sleep is
:data:`~.claimer.MAX_IDLE`, a safety net for a lost notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import threading
from collections.abc import Mapping

from .. import metrics
from .._acompat import monotonic
from ..db.channels import channel
from ..db.retention import age_text
from ..errors import InvalidArgument, SchemaNotReady, TenureError
from ..leases._async.client import AsyncClient, connect_async, default_margin
from ..leases._async.lease import AsyncLease
from ..leases.context import LoopStore
from ..leases.models import Grant
from .background import listen, prune
from .bodies import BodyLimit
from .claim import Claim, RunIdentity, run_fields
from .claimer import MAX_IDLE, Claimer
from .context import JobContext
from .execution import Run, execute
from .finisher import Finisher
from .identity import WorkerIdentity
from .isolation import GRACE as CHILD_GRACE
from .looplag import LoopLag, threshold
from .presence import Presence
from .registration import register, register_tasks
from .rows import BodyLengthRow
from .saturation import LAG as SATURATION_LAG
from .saturation import Saturation
from .schedules import Plan, Schedule
from .settings import WorkerSettings
from .spec import JobSpec, TaskSpec
from .starter import Starter
from .vacuum import vacuum_forever

log = logging.getLogger("tenure.scheduler")

#: Seconds a run's body gets to stop after its cancellation at shutdown before the worker
#: stops without it (an isolated body: also its child's SIGTERM and SIGKILL graces).
STOP_WAIT = 1.0
#: The schema version this worker needs (18: it prunes lease_events; 17: the presence beat
#: writes the loop lag and the saturation; 14: runtime schedules, read by the claim).
SCHEMA_VERSION = 18


class Worker:
    """Runs one app's jobs (``specs``, by key) with ``settings`` until asked to stop."""

    def __init__(
        self,
        settings: WorkerSettings,
        specs: Mapping[str, JobSpec],
        tasks: Mapping[str, TaskSpec] | None = None,
    ) -> None:
        self.settings = settings
        self.specs = specs
        #: The app's tasks (``@app.task``), which its runtime schedules name.
        self.tasks: Mapping[str, TaskSpec] = {} if tasks is None else tasks
        self.who = WorkerIdentity()
        self.id = self.who.id
        self.shutdown_grace = settings.shutdown_grace
        self.channel = channel("jobs", settings.schema)
        self._client: AsyncClient | None = None
        self._store: LoopStore | None = None
        # Keyed by (job, token): a run that lost its lease may still be finishing when this
        # same worker claims the job's retry.
        self._running: dict[tuple[str, int], Run] = {}
        # The claim loop's wake-up: a notification, a run's end, capacity given back, a stop.
        self._wake = asyncio.Event()
        self.saturation = Saturation(self.id, settings.app)
        self.limit = BodyLimit(settings.concurrency, self._wake)
        # How long a job blocked this loop (looplag.py): logged, exported (issue 29).
        limit = threshold(spec.ttl for spec in specs.values())
        self.loop_lag = LoopLag(self.id, settings.app, self._running, limit)
        self.starter = Starter(
            self.who,
            launch=self._launch,
            wake=self._wake,
            saturation=self.saturation,
        )
        self.finisher = Finisher(
            self.who,
            channel=self.channel,
            backlog=settings.finish_backlog,
            running=self._running,
            wake=self._wake,
        )
        self.claimer = Claimer(
            settings,
            specs,
            tasks=self.tasks,
            starter=self.starter,
            finisher=self.finisher,
            limit=self.limit,
            wake=self._wake,
            saturation=self.saturation,
        )
        # Leases of runs that end done are kept for their jobs' next slots where the claim
        # loop has room (finisher.py): their claims go to it.
        self.finisher.keeper = self.claimer
        # Its row of the job keys it defines (scheduler/presence.py); beats add to the exclude
        # and report the loop lag and saturation (the dashboard's workers page).
        self.presence = Presence(
            self.who,
            settings.app,
            specs,
            self.claimer._exclude,
            loop_lag=self.loop_lag,
            saturation=self.saturation,
            fleet=self.finisher.fleet,
        )
        #: Set once the worker has registered its jobs and claims (for embedding and tests).
        self.ready = threading.Event()
        self._stopping = False
        self._cancel_now = False
        self._signals = 0
        #: Runs whose bodies did not stop at the worker's shutdown (recorded 'abandoned').
        self.left_behind = 0

    @property
    def label(self) -> str:
        return self.who.label

    @property
    def client(self) -> AsyncClient:
        assert self._client is not None, "the worker is not running"
        return self._client

    @property
    def runs(self) -> int:
        return self.finisher.runs

    @property
    def handed_over(self) -> int:
        return self.finisher.handed_over

    # -- control ----------------------------------------------------------------------------

    def on_signal(self, signum: int) -> None:
        self._signals += 1
        name = _signal_name(signum)
        if self._signals == 1:
            log.info(
                "%s received: %s claims nothing more and gives %s up to %.1fs "
                "to finish (send it again to cancel them now)",
                name,
                self.label,
                _jobs(len(self._running)),
                self.shutdown_grace,
            )
            self.request_stop(False)
        else:
            log.warning(
                "%s received again: cancelling %s and handing their slots over",
                name,
                _jobs(len(self._running)),
            )
            self.request_stop(True)

    def request_stop(self, cancel: bool = False) -> None:
        self._stopping = True
        if cancel:
            self._cancel_now = True
        self.claimer.stop()
        self.finisher.stop()
        self.starter.stop()  # claims taken ahead of their slots are given back
        if cancel:
            self.limit.close()  # runs waiting for a body slot are handed over at once

    # -- main -------------------------------------------------------------------------------

    async def run(self) -> None:
        settings, specs = self.settings, list(self.specs.values())
        if not specs and not self.tasks:
            raise InvalidArgument(
                "the app defines no jobs and no tasks: decorate functions with @app.job(...) "
                "or @app.task(...)"
            )
        self._client = await connect_async(
            settings.dsn,
            schema=settings.schema,
            pool_size=settings.pool_size,
            migrate=settings.migrate,
            application_name=self.who.application_name,
        )
        for part in (self.claimer, self.starter, self.finisher):
            part.attach(self._client)
        self._store = LoopStore(self._client)  # the runs' ctx.results, on this loop
        tasks: list[asyncio.Task[None]] = []
        cancelled = False
        try:
            version = await self.client.schema_version()
            if version is None or version < SCHEMA_VERSION:
                raise SchemaNotReady(
                    f"schema {settings.schema!r} on {self.client.where} has no scheduler tables "
                    f"(version {version}, need {SCHEMA_VERSION}); run `tenure migrate`, or "
                    "start the worker with --migrate (in your own process: "
                    "Scheduler(migrate=True))"
                )
            await self.presence.enter(self.client)  # before registering: see Presence.enter
            await register(
                self.client, specs, defined_by=self.label, app=settings.app, adopt=settings.adopt
            )
            await register_tasks(
                self.client, list(self.tasks), app=settings.app, registered_by=self.label
            )
            await self.presence.beat(self.client)  # counts the jobs just registered
            await self._learn_body_lengths()
            # The worker's background tasks, cancelled when it stops.
            listener = listen(
                settings.dsn,
                self.channel,
                self._wake,
                application_name=self.who.application_name,
                safety_net=MAX_IDLE,
            )
            pruner = prune(self.client, settings.retention)
            tasks.append(asyncio.create_task(listener, name="tenure-listen"))
            tasks.append(asyncio.create_task(pruner, name="tenure-prune"))
            running_rows = self.finisher.rows_in_progress()
            tasks.append(asyncio.create_task(running_rows, name="tenure-running"))
            lag = self.loop_lag.watch_forever()
            tasks.append(asyncio.create_task(lag, name="tenure-loop-lag"))
            beats = self.presence.beat_forever(self.client)
            tasks.append(asyncio.create_task(beats, name="tenure-presence"))
            if settings.vacuum_every > 0:
                vacuum = vacuum_forever(self.client, settings.vacuum_every, who=self.label)
                tasks.append(asyncio.create_task(vacuum, name="tenure-vacuum"))
            log.info(
                "tenure %s started: %d jobs, concurrency %d, schema %r on %s, app %r, "
                "history kept %s (inbox claims %s)",
                self.label,
                len(specs),
                settings.concurrency,
                settings.schema,
                self.client.where,
                settings.app,
                age_text(settings.retention.history),
                age_text(settings.retention.inbox),
                extra={"worker": self.id},
            )
            self.ready.set()
            try:
                await self.claimer.claim_loop()
            except asyncio.CancelledError:
                # Cancelling run_async() is an immediate stop: hand everything over, then
                # let the cancellation through.
                cancelled = True
                self.request_stop(True)
            await self._drain()
            log.info(
                "tenure %s stopped: %d jobs, %d runs (%d of them kept from the run before), "
                "%d handed over%s",
                self.label,
                len(specs),
                self.runs,
                self.finisher.kept,
                self.handed_over,
                f", {self.left_behind} left behind (did not stop)" if self.left_behind else "",
                extra={"worker": self.id},
            )
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.presence.leave(self.client)
            await self.client.close()
        if cancelled:
            raise asyncio.CancelledError

    async def _learn_body_lengths(self) -> None:
        """Which of its jobs are slow or quick, from their history (:meth:`BodyLimit.seed`);
        a worker that cannot read it learns from its own runs, as before."""
        try:
            rows = await self.client.fetch(
                "sched_body_lengths",
                {"keys": sorted(self.specs)},
                doing="reading how long the jobs ran lately",
                row=BodyLengthRow,
            )
        except TenureError as exc:
            log.warning("reading how long the jobs ran lately failed (learned from runs): %s", exc)
            return
        families = {key: id(spec.fn) for key, spec in self.specs.items()}
        self.limit.seed({row.job_key: row.took for row in rows}, families)

    # -- running ----------------------------------------------------------------------------

    def _launch(
        self,
        claim: Claim,
        spec: JobSpec,
        schedule: Schedule,
        decided: Plan,
        started_at: dt.datetime,
        sent: float,
        grant: Grant | None,
    ) -> None:
        assert decided.run_slot is not None and decided.run_kind is not None
        ttl = claim.ttl.total_seconds()
        if grant is None:  # the claim's own lease (a kept job's start took one: ``grant``)
            grant = Grant(claim.token, claim.lease_until)
        token = grant.token
        lease = AsyncLease(
            self.client,
            claim.job_key,
            claim.owner,
            grant,
            ttl=ttl,
            safety_margin=default_margin(ttl),
            sent_at=sent,
        )
        ctx = JobContext(
            job_key=claim.job_key,
            token=token,
            slot=schedule.local(decided.run_slot),
            kind=decided.run_kind,
            attempt=decided.attempt,
            lease=lease,
            client=self.client,
            worker_id=self.id,
            args=claim.args,
            task=claim.task,
            store=self._store,
        )
        lease.on_lost(lambda lost: ctx._stop(lost.lost_reason or "the lease is lost"))
        ident = RunIdentity(
            claim.job_key,
            token,
            claim.owner,
            decided.run_slot,
            decided.run_kind,
            decided.attempt,
            started_at,
        )
        following = decided.next_slot or claim.state.next_slot
        run = Run(spec, ident, ctx, lease, monotonic(), next_slot=following)
        if decided.run_kind == "scheduled":
            metrics.emit(
                metrics.JOB_LATENESS,
                claim.job_key,
                "scheduled",
                (started_at - decided.run_slot).total_seconds(),
            )
        self._running[(claim.job_key, token)] = run
        run.task = asyncio.create_task(self._run(run), name=f"tenure-run-{claim.job_key}")

    async def _run(self, run: Run) -> None:
        outcome, error, duration = await execute(run, self.limit, self._waited)
        if not run.ended:  # (a run left behind at a stop is recorded already)
            self.finisher.finish(run, outcome, error, duration)

    def _waited(self, run: Run, seconds: float) -> None:
        """A run whose body began ``seconds`` after its start was recorded (every body slot
        was busy) is as late as a start that much later would have been: a worker whose
        bodies fall behind is saturated, whether or not its starts are on time (a kept job's
        start is at its slot)."""
        ident = run.ident
        late = (ident.started_at - ident.slot).total_seconds() + seconds
        if (
            late > SATURATION_LAG
            and ident.kind == "scheduled"
            and self.saturation.counts(ident.slot)
        ):
            self.saturation.observe(0, [late], monotonic())

    async def _drain(self) -> None:
        """Let running jobs finish within the grace, then cancel them and hand them over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_grace
        if self.starter.tasks:  # their runs join the ones below (or their claims are released)
            await asyncio.wait(set(self.starter.tasks), timeout=self.shutdown_grace)
        if self._running and not self._cancel_now:
            log.info("waiting up to %.1fs for %s", self.shutdown_grace, _jobs(len(self._running)))
        while self._running and not self._cancel_now:
            left = deadline - loop.time()
            if left <= 0:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()
        # Runs still waiting for a body slot are handed over, their bodies never run; the
        # others are told to stop.
        self.limit.close()
        runs = list(self._running.values())
        for run in runs:
            run.shutdown = True
            run.ctx._stop("the worker is shutting down")  # ctx.check() raises, ctx.wait() returns
            if run.body is not None and not run.threaded:
                run.body.cancel()
        tasks = {run.task for run in runs if run.task is not None and not run.task.done()}
        if tasks:
            isolated = any(run.spec.isolation == "process" for run in runs)
            await asyncio.wait(tasks, timeout=STOP_WAIT + (2 * CHILD_GRACE if isolated else 0))
        self._leave_behind([run for run in runs if run.task is not None and not run.task.done()])
        finisher = self.finisher.task
        if finisher is not None:  # the ends those runs queued, recorded before closing
            await asyncio.wait({finisher}, timeout=10.0)
        if self.starter.tasks:  # leases a last finish kept, given back
            await asyncio.wait(set(self.starter.tasks), timeout=self.shutdown_grace)
        if self.handed_over:
            with contextlib.suppress(TenureError):
                await self.client.fetch(
                    "sched_notify",
                    {"channel": self.channel, "payload": "stopped"},
                    doing="notifying peers",
                )

    def _leave_behind(self, runs: list[Run]) -> None:
        """Runs whose bodies did not stop within :data:`STOP_WAIT` of their cancellation (a
        sync body that never looks at ``ctx``, an async one that swallows CancelledError):
        recorded 'abandoned' now, their slots handed over, and the worker stops without them
        (``tenure worker`` then exits; the next claim of such a slot counts it toward
        quarantine as it counts a run whose worker died)."""
        for run in runs:
            ident = run.ident
            error = (
                f"the job did not stop within {STOP_WAIT:.1f}s of its cancellation at the "
                f"worker's shutdown (after a {self.shutdown_grace:.1f}s grace); the worker "
                "stopped without it and its slot is handed over"
            )
            log.error(
                "job %r slot %s token %s: %s",
                ident.job_key,
                ident.slot.isoformat(),
                ident.token,
                error,
                extra=run_fields(ident.job_key, ident.token, ident.slot, outcome="abandoned"),
            )
            self.left_behind += 1
            if run.body is not None:
                run.body.cancel()  # a thread cannot be stopped: stop waiting for it
            if not run.ended:
                self.finisher.finish(run, "abandoned", error, monotonic() - run.launched)


def _jobs(n: int) -> str:
    """``1 running job``, ``3 running jobs``: the shutdown lines count them."""
    return f"{n} running job" if n == 1 else f"{n} running jobs"


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["SCHEMA_VERSION", "Worker", "register"]
