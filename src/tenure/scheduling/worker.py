"""The scheduler worker: one asyncio event loop that claims due jobs and runs them.

Life of a run (statements in ``sql/scheduler.sql``):

1. ``sched_claim`` (one statement per batch): due, unpaused jobs whose lease is free or
   expired are locked with ``FOR UPDATE SKIP LOCKED`` and their leases taken over with
   token + 1, as many as the worker has free capacity. The statement also says when to look
   again (next due slot, or a live lease's expiry), so an idle worker costs one statement
   per wake-up, however many jobs there are.
2. :func:`~.schedules.plan` decides in Python, from the claim's database times only: retry
   an unfinished slot, run the newest/oldest due slot (misfire policy), run a manual
   trigger; and computes the following slot with cronsim.
3. ``sched_start`` (one statement per batch) records the plan, fenced on the claim's token:
   ``next_slot`` moves forward only, skipped slots get history rows, the run gets its row.
4. The job runs with its lease renewed every ttl/3 (the core's :class:`AsyncLease`). Async
   functions run as tasks on this loop (cancelled when the lease is lost); sync ones in a
   daemon thread each (``ctx.check()`` raises and ``ctx.cancelled`` is set when it is lost).
   Daemon threads rather than a ThreadPoolExecutor: a sync job that ignores cancellation
   must not keep a stopping worker alive (executor threads are joined at interpreter exit).
   ``concurrency`` bounds runs in flight, sync or async: the claim never takes more.
5. ``sched_finish`` (one statement) records the outcome and releases the lease. A finished
   slot (succeeded or failed with the lease intact) is never run again; a run that lost
   its lease or was cancelled at shutdown leaves the slot to be retried, and peers are
   notified so one of them takes it over at once.

Wake-ups: the claim's "look again at" time, a ``LISTEN`` on a dedicated connection (schedule
changes, pause/resume/trigger, handed-over slots), and the end of a local run. The longest
sleep is :data:`MAX_IDLE`, a safety net for a lost notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import random
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from .. import metrics
from .._acompat import monotonic
from .._async.client import AsyncClient, connect_async, default_margin
from .._async.lease import AsyncLease
from ..dsn import resolve
from ..errors import (
    DatabaseUnavailable,
    InvalidArgument,
    LeaseLost,
    SchemaNotReady,
    StaleTokenError,
    TenureError,
)
from ..models import Grant
from ..timeouts import CONNECTION_KWARGS
from .ops import channel_name, schedule_from_row
from .schedules import JobState, Plan, Policy, Schedule, plan

if TYPE_CHECKING:
    from ..scheduler import JobContext, JobSpec, Scheduler

log = logging.getLogger("tenure.scheduler")

#: Longest sleep without a notification.
MAX_IDLE = 10.0
#: Pause before claiming again when due jobs were left to a concurrent claimer.
CONTENTION_BACKOFF = 0.02
#: How often each worker prunes run history (jittered).
PRUNE_EVERY = 600.0
PRUNE_BATCH = 5000
#: The schema version that has the scheduler's tables.
SCHEMA_VERSION = 3
#: Up to this many newly registered jobs are logged one line each, more as one summary.
NEW_JOBS_LOGGED = 20
#: The array parameters of sched_start, one element per claimed job or skipped slot.
_START_ARRAYS = (
    *("keys", "tokens", "owners", "revisions", "run_slots", "run_kinds", "attempts"),
    *("next_slots", "done_slots", "triggers", "prior_tokens", "prior_errors"),
    *("skip_keys", "skip_slots", "skip_tokens", "skip_kinds", "skip_outcomes", "skip_errors"),
)


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

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Claim:
        (
            key,
            owner,
            token,
            until,
            cron,
            every,
            tz,
            ttl,
            misfire,
            grace,
            on_crash,
            revision,
            next_slot,
            done_slot,
            running_slot,
            running_kind,
            running_token,
            running_attempt,
            trigger_at,
            now,
            _ready,
        ) = row
        state = JobState(
            next_slot,
            done_slot,
            running_slot,
            running_kind,
            running_token,
            running_attempt,
            trigger_at,
        )
        return cls(
            key,
            owner,
            token,
            until,
            cron,
            every,
            tz,
            ttl,
            misfire,
            grace,
            on_crash,
            revision,
            state,
            now,
        )

    def policy(self) -> Policy:
        grace = None if self.misfire_grace is None else self.misfire_grace.total_seconds()
        return Policy(self.misfire, grace, self.on_crash)

    def differs_from(self, spec: JobSpec) -> bool:
        mine = (
            spec.schedule.cron,
            spec.schedule.every,
            spec.schedule.timezone,
            spec.ttl,
            spec.policy.misfire,
            spec.policy.misfire_grace,
            spec.policy.on_crash,
        )
        theirs = (
            self.cron,
            self.every,
            self.timezone,
            self.ttl.total_seconds(),
            self.misfire,
            None if self.misfire_grace is None else self.misfire_grace.total_seconds(),
            self.on_crash,
        )
        return mine != theirs


@dataclass(eq=False)
class Run:
    """A run in flight on this worker."""

    spec: JobSpec
    claim: Claim
    slot: dt.datetime
    kind: str
    ctx: JobContext
    lease: AsyncLease
    task: asyncio.Task[None] | None = None
    body: asyncio.Future[Any] | None = None
    shutdown: bool = False


class Worker:
    """Runs one :class:`~tenure.Scheduler`'s jobs until asked to stop."""

    def __init__(self, app: Scheduler, *, concurrency: int, shutdown_grace: float) -> None:
        self.app = app
        self.concurrency = concurrency
        self.shutdown_grace = shutdown_grace
        self.id = uuid.uuid4().hex[:12]
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.channel = channel_name(app.schema)
        self._client: AsyncClient | None = None
        # Keyed by (job, token): a run that lost its lease may still be finishing when this
        # same worker claims the job's retry.
        self._running: dict[tuple[str, int], Run] = {}
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
            await register(self.client, specs, defined_by=self.label)
            tasks.append(asyncio.create_task(self._listen(), name="tenure-listen"))
            tasks.append(asyncio.create_task(self._prune_loop(), name="tenure-prune"))
            log.info(
                "tenure %s started: %d jobs, concurrency %d, schema %r on %s",
                self.label,
                len(specs),
                self.concurrency,
                app.schema,
                self.client.where,
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
            free = self.concurrency - len(self._running)
            delay = MAX_IDLE
            if free > 0:
                sent = monotonic()  # the lease's local deadline counts from here
                try:
                    rows = await self.client._fetch(
                        "sched_claim",
                        {"limit": free, "exclude": sorted(self._exclude)},
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
                claims = [Claim.from_row(row) for row in rows if row[0] is not None]
                summary = next(row for row in rows if row[0] is None)
                now, ready_at = summary[19], summary[20]
                if claims:
                    await self._start(claims, sent)
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

    async def _start(self, claims: list[Claim], sent: float) -> None:
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
                    "than this worker's code (%s); following the database, where the newest "
                    "registration wins. Restart this worker with the current code",
                    claim.job_key,
                    claim.revision,
                    self._schedule(claim).describe(),
                    spec.schedule.describe(),
                    extra={"job": claim.job_key},
                )
            try:
                decided = plan(
                    self._schedule(claim), claim.policy(), claim.state, claim.now, claim.token
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
            await self._unclaim(foreign)
            for claim in foreign:
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
        if not planned:
            return
        try:
            rows = await self.client._fetch(
                "sched_start", self._start_params(planned), doing="starting runs", wrote=True
            )
        except TenureError as exc:
            log.warning(
                "recording %d claims failed; their leases expire and the slots are claimed "
                "again: %s",
                len(planned),
                exc,
            )
            for claim, *_ in planned:
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
            return
        started = {key: at for key, at in rows}
        for claim, spec, schedule, decided in planned:
            extra = {"job": claim.job_key, "token": claim.token}
            if claim.job_key not in started:
                log.warning(
                    "job %r: claim with token %s was superseded before it started",
                    claim.job_key,
                    claim.token,
                    extra=extra,
                )
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
                continue
            self._report_skipped(claim, decided)
            if decided.run_slot is None:
                metrics.emit(metrics.RELEASE, claim.job_key, value=0.0)
                continue
            self._launch(claim, spec, schedule, decided, started[claim.job_key], sent)

    def _start_params(self, planned: list[tuple[Claim, JobSpec, Schedule, Plan]]) -> dict[str, Any]:
        p: dict[str, list[Any]] = {name: [] for name in _START_ARRAYS}
        for claim, _spec, _schedule, d in planned:
            p["keys"].append(claim.job_key)
            p["tokens"].append(claim.token)
            p["owners"].append(claim.owner)
            p["revisions"].append(claim.revision)
            p["run_slots"].append(d.run_slot)
            p["run_kinds"].append(d.run_kind)
            p["attempts"].append(d.attempt)
            p["next_slots"].append(d.next_slot)
            p["done_slots"].append(d.done_slot)
            p["triggers"].append(d.trigger_at)
            p["prior_tokens"].append(d.prior_token)
            p["prior_errors"].append(d.prior_error)
            for s in d.skipped:
                p["skip_keys"].append(claim.job_key)
                p["skip_slots"].append(s.slot)
                p["skip_tokens"].append(claim.token)
                p["skip_kinds"].append(s.kind)
                p["skip_outcomes"].append(s.outcome)
                p["skip_errors"].append(s.error)
        params: dict[str, Any] = dict(p)
        params.update(worker=self.id, host=self.host, pid=self.pid)
        return params

    def _report_skipped(self, claim: Claim, decided: Plan) -> None:
        if not decided.skipped:
            return
        for s in decided.skipped:
            metrics.emit(metrics.JOB, claim.job_key, s.outcome)
        missed = [s for s in decided.skipped if s.outcome == "misfire_skipped"]
        abandoned = [s for s in decided.skipped if s.outcome == "abandoned"]
        extra = {"job": claim.job_key, "token": claim.token}
        if missed:
            log.warning(
                "job %r: %d missed slot(s) skipped (misfire=%r), %s .. %s",
                claim.job_key,
                len(missed),
                claim.misfire,
                missed[0].slot.isoformat(),
                missed[-1].slot.isoformat(),
                extra=extra,
            )
        for s in abandoned:
            log.warning(
                "job %r: slot %s abandoned: %s",
                claim.job_key,
                s.slot.isoformat(),
                s.error,
                extra=extra,
            )

    async def _unclaim(self, claims: list[Claim]) -> None:
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
        from ..scheduler import JobContext

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
        run = Run(spec, claim, decided.run_slot, decided.run_kind, ctx, lease)
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
        loop = asyncio.get_running_loop()
        key, token = run.claim.job_key, run.claim.token
        extra = {"job": key, "token": token, "slot": run.slot.isoformat()}
        began = loop.time()
        outcome, error = "succeeded", None
        lease, ctx = run.lease, run.ctx
        log.debug(
            "job %r slot %s starts with token %s", key, run.slot.isoformat(), token, extra=extra
        )
        try:
            if run.spec.is_async:
                body: asyncio.Future[Any] = asyncio.ensure_future(run.spec.fn(ctx))
                lease.keep(body)  # renew every ttl/3; cancel the body when the lease is lost
            else:
                lease.keep()  # renew every ttl/3; mark lost at the local deadline
                body = _in_thread(run.spec.fn, ctx, f"tenure-job-{key}")
            run.body = body
            await body
            if ctx._stale:
                outcome, error = "stale_rejected", "a fenced write was rejected (caught by the job)"
            elif lease.lost:
                outcome, error = "lease_lost", lease.lost_reason
        except StaleTokenError as exc:
            outcome, error = "stale_rejected", str(exc)
        except LeaseLost as exc:
            outcome = "cancelled" if run.shutdown and not lease.lost else "lease_lost"
            error = str(exc)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this run task itself was cancelled: not expected, do not swallow
            if lease.lost:
                outcome, error = "lease_lost", f"cancelled: {lease.lost_reason}"
            else:
                outcome = "cancelled"
                error = "the worker shut down before the run finished; the slot is handed over"
        except Exception as exc:
            if ctx._stale:
                outcome = "stale_rejected"
            elif lease.lost:
                outcome = "lease_lost"
            else:
                outcome = "failed"
            error = f"{type(exc).__name__}: {exc}"
            if outcome == "failed":
                log.warning(
                    "job %r slot %s failed: %s",
                    key,
                    run.slot.isoformat(),
                    error,
                    exc_info=exc,
                    extra=extra,
                )
        finally:
            await lease.stop_keeping()
        duration = loop.time() - began
        await self._finish(run, outcome, error, duration)

    async def _finish(self, run: Run, outcome: str, error: str | None, duration: float) -> None:
        key, token = run.claim.job_key, run.claim.token
        extra = {"job": key, "token": token, "slot": run.slot.isoformat()}
        done = outcome in ("succeeded", "failed")
        params = {
            "job_key": key,
            "token": token,
            "owner": run.claim.owner,
            "slot": run.slot,
            "kind": run.kind,
            "done": done,
            "outcome": outcome,
            "error": error,
            "channel": self.channel,
        }
        recorded = outcome
        for attempt in range(3):
            try:
                rows = await self.client._fetch(
                    "sched_finish", params, doing=f"finishing {key!r}", wrote=True
                )
                matched, _released, recorded_outcome, current, _ = rows[0]
                recorded = recorded_outcome or outcome
                if not matched and outcome in ("succeeded", "failed"):
                    log.warning(
                        "job %r slot %s finished with token %s after the job was taken over "
                        "(token %s): recorded as %s",
                        key,
                        run.slot.isoformat(),
                        token,
                        current,
                        recorded,
                        extra=extra,
                    )
                break
            except DatabaseUnavailable as exc:
                if attempt == 2:
                    log.warning(
                        "job %r: recording the end of slot %s failed (%s); its lease expires "
                        "and the slot will be retried",
                        key,
                        run.slot.isoformat(),
                        exc,
                        extra=extra,
                    )
                else:
                    await asyncio.sleep(0.5)
            except TenureError as exc:
                log.warning("job %r: recording the end of a run failed: %s", key, exc, extra=extra)
                break
        # A lease marked lost has already been counted out of tenure_leases_held.
        counted_out = run.lease._lost_reason is not None  # without evaluating the deadline
        run.lease.mark_released()
        self.runs += 1
        if not done:
            self.handed_over += 1
        if not counted_out:
            metrics.emit(metrics.RELEASE, key, value=duration)
        metrics.emit(metrics.JOB, key, recorded, duration)
        extra["outcome"] = recorded
        if recorded in ("lease_lost", "stale_rejected", "cancelled"):
            log.warning(
                "job %r slot %s token %s: %s (%s)",
                key,
                run.slot.isoformat(),
                token,
                recorded,
                error,
                extra=extra,
            )
        else:
            log.debug(
                "job %r slot %s token %s: %s in %.3fs",
                key,
                run.slot.isoformat(),
                token,
                recorded,
                duration,
                extra=extra,
            )
        self._running.pop((key, token), None)
        self._wake.set()

    async def _drain(self) -> None:
        """Let running jobs finish within the grace, then cancel them and hand them over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_grace
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
        if self.handed_over:
            with contextlib.suppress(TenureError):
                await self.client._fetch(
                    "sched_notify",
                    {"channel": self.channel, "payload": "stopped"},
                    doing="notifying peers",
                )

    # -- background tasks ------------------------------------------------------------------

    async def _listen(self) -> None:
        """Wake the claim loop on every notification, on a dedicated connection."""
        conninfo, _source = resolve(self.app.dsn)
        delay = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    conninfo, **{**CONNECTION_KWARGS, "application_name": self.application_name}
                )
                try:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self._wake.set()  # catch up with anything missed while not listening
                    delay = 0.5
                    async for _note in conn.notifies():
                        self._wake.set()
                finally:
                    await conn.close()
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "listening for schedule changes failed (%s); retrying in %.1fs, meanwhile "
                    "looking for due jobs at least every %.0fs",
                    exc,
                    delay,
                    MAX_IDLE,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_IDLE)

    async def _prune_loop(self) -> None:
        retention = dt.timedelta(seconds=self.app.history_retention)
        await asyncio.sleep(random.uniform(1.0, 30.0))
        while True:
            try:
                rows = await self.client._fetch(
                    "sched_prune",
                    {"retention": retention, "batch": PRUNE_BATCH},
                    doing="pruning run history",
                    wrote=True,
                )
                if rows and rows[0][0]:
                    log.info("pruned %d run history rows older than %s", rows[0][0], retention)
            except TenureError as exc:
                log.warning("pruning run history failed: %s", exc)
            await asyncio.sleep(PRUNE_EVERY * random.uniform(0.9, 1.1))


async def register(client: AsyncClient, specs: list[JobSpec], *, defined_by: str) -> None:
    """Upsert job definitions; log new ones and changed ones (the newest registration wins)."""
    if not specs:
        return
    now = await client.now()
    ordered = sorted(specs, key=lambda s: s.key)
    params = {
        "keys": [s.key for s in ordered],
        "crons": [s.schedule.cron for s in ordered],
        "everys": [s.schedule.every for s in ordered],
        "timezones": [s.schedule.timezone for s in ordered],
        "ttls": [dt.timedelta(seconds=s.ttl) for s in ordered],
        "misfires": [s.policy.misfire for s in ordered],
        "graces": [
            None if s.policy.misfire_grace is None else dt.timedelta(seconds=s.policy.misfire_grace)
            for s in ordered
        ],
        "on_crashes": [s.policy.on_crash for s in ordered],
        "next_slots": [s.schedule.next_after(now) for s in ordered],
        "defined_by": defined_by,
        "channel": channel_name(client.schema),
    }
    rows = await client._fetch(
        "sched_register", params, doing="registering job definitions", wrote=True
    )
    by_key = {s.key: s for s in ordered}
    new = [row[0] for row in rows if row[10] is None]
    if len(new) > NEW_JOBS_LOGGED:
        # Thousands of "registered" lines would drown the startup line.
        log.info("%d new jobs registered (%s, ...)", len(new), ", ".join(map(repr, new[:3])))
    for row in rows:
        key, revision, next_slot, old_cron, old_every, old_tz = row[:6]
        old_defined_by = row[10]
        spec = by_key[key]
        if old_defined_by is None:
            if len(new) > NEW_JOBS_LOGGED:
                continue
            log.info(
                "job %r registered: %s, first slot %s",
                key,
                spec.schedule.describe(),
                next_slot.isoformat(),
                extra={"job": key},
            )
        else:
            before = schedule_from_row(key, old_cron, old_every, old_tz).describe()
            log.warning(
                "job %r definition changed by this deploy (revision %d, was defined by %s): "
                "%s -> %s, ttl %gs, misfire %s, on_crash %s; next slot %s",
                key,
                revision,
                old_defined_by,
                before,
                spec.schedule.describe(),
                spec.ttl,
                spec.policy.misfire,
                spec.policy.on_crash,
                next_slot.isoformat(),
                extra={"job": key},
            )


def _in_thread(fn: Any, ctx: JobContext, name: str) -> asyncio.Future[Any]:
    """Run ``fn(ctx)`` in a new daemon thread; the returned future gets its outcome."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if future.done():
            return  # cancelled at shutdown: nobody waits any more
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            value = fn(ctx)
        except BaseException as exc:
            outcome: tuple[bool, Any] = (False, exc)
        else:
            outcome = (True, value)
        with contextlib.suppress(RuntimeError):  # the loop is gone: the worker has exited
            loop.call_soon_threadsafe(deliver, *outcome)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
