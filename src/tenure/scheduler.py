"""Scheduled jobs that run once per slot across any number of workers.

::

    app = tenure.Scheduler()            # DSN as in tenure.connect

    @app.job("nightly-report", cron="0 2 * * *", timezone="Europe/Berlin", ttl="2m")
    def nightly_report(ctx: tenure.JobContext) -> None:
        ctx.results.put(build_report(ctx.slot))     # fenced: a stale run cannot overwrite

    # tenure worker myapp:app   (or app.run(), or await app.run_async())

How it works (details in :mod:`tenure.scheduling.worker` and ``sql/scheduler.sql``):

* Each job is one row in ``scheduled_jobs`` holding its definition and its next slot, and
  runs while holding its key's lease in ``job_leases``. A worker claims every due job in one
  statement (``FOR UPDATE SKIP LOCKED``), taking each lease over with token + 1, like
  ``client.acquire``. Due-ness is decided by the database clock only.
* The claiming worker computes the following slot (cronsim, in the job's time zone) from
  database times and stores it fenced on its token; ``next_slot`` only moves forward and a
  finished slot is never claimed again, so a late or clock-skewed worker cannot re-run it.
* A run keeps ``running_slot`` set until it finishes. If its holder dies or loses its lease,
  the lease expires and the next claim retries the slot with a higher token
  (``on_crash="retry"``) or records it abandoned (``"skip"``).
* Sync job functions run in threads (at most ``concurrency`` runs at once), async ones on the
  worker's event loop. The lease is renewed every ttl/3 while the job runs; when it is lost,
  an async job is cancelled and a sync job sees ``ctx.check()`` raise and ``ctx.cancelled``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ._async.fencing import fence_async
from ._sync.fencing import fence
from .errors import InvalidArgument, LeaseLost, StaleTokenError
from .models import Result
from .scheduling.schedules import MISFIRE_POLICIES, ON_CRASH_POLICIES, Policy, Schedule
from .validation import Duration, check_job_key, check_ttl, parse_duration, to_json

if TYPE_CHECKING:
    from ._async.client import AsyncClient
    from ._async.lease import AsyncLease
    from .scheduling.worker import Worker

log = logging.getLogger("tenure.scheduler")

JobFunction = Callable[["JobContext"], Any]
F = TypeVar("F", bound=JobFunction)
T = TypeVar("T")

DEFAULT_TTL = "30s"
DEFAULT_CONCURRENCY = 8
DEFAULT_SHUTDOWN_GRACE = "30s"
DEFAULT_RETENTION = "7d"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One registered job: its key, function, schedule and policies (validated)."""

    key: str
    fn: JobFunction
    schedule: Schedule
    ttl: float
    policy: Policy

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def qualname(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"


class Scheduler:
    """A set of scheduled jobs and the worker that runs them.

    ``dsn``/``schema``: as in :func:`tenure.connect` (the ``tenure worker`` command's
    ``--dsn``/``--schema`` override them). ``concurrency``: most runs in flight per worker.
    ``shutdown_grace``: how long a stopping worker lets running jobs finish.
    ``history_retention``: run history older than this is pruned by the workers.
    ``migrate``: apply pending migrations when a worker starts.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "tenure",
        concurrency: int = DEFAULT_CONCURRENCY,
        shutdown_grace: Duration = DEFAULT_SHUTDOWN_GRACE,
        history_retention: Duration = DEFAULT_RETENTION,
        pool_size: int = 4,
        migrate: bool = False,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.concurrency = _check_concurrency(concurrency)
        self.shutdown_grace = _check_grace(shutdown_grace)
        self.history_retention = parse_duration(history_retention, what="history_retention")
        if self.history_retention <= 0:
            raise InvalidArgument(f"history_retention must be positive, got {history_retention!r}")
        if pool_size < 2:
            raise InvalidArgument(f"pool_size must be at least 2, got {pool_size}")
        self.pool_size = pool_size
        self.migrate = migrate
        self._jobs: dict[str, JobSpec] = {}
        self._worker: Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"<Scheduler schema={self.schema!r} jobs={len(self._jobs)}>"

    @property
    def jobs(self) -> Mapping[str, JobSpec]:
        return MappingProxyType(self._jobs)

    def job(
        self,
        key: str,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        timezone: str | None = None,
        ttl: Duration = DEFAULT_TTL,
        misfire: str = "latest",
        misfire_grace: Duration | None = None,
        on_crash: str = "retry",
    ) -> Callable[[F], F]:
        """Decorator: register ``fn(ctx)`` as job ``key``.

        ``cron`` (five Debian cron fields, or @daily-style aliases) in ``timezone`` (IANA name,
        default UTC), or ``every`` (a duration like "30s"; slots are spread over the interval
        by a phase derived from the key). ``ttl``: the lease TTL (renewed every ttl/3 while
        the job runs). ``misfire``: "latest" (run the newest missed slot), "all" (each missed
        slot, oldest first) or "skip" (only a slot that is on time); ``misfire_grace``: how
        late a slot may start and still run (default: no limit, 1s for "skip"). ``on_crash``:
        "retry" the slot of a run whose holder died, or "skip" it (recorded abandoned).
        """

        def register(fn: F) -> F:
            self.add_job(
                key,
                fn,
                cron=cron,
                every=every,
                timezone=timezone,
                ttl=ttl,
                misfire=misfire,
                misfire_grace=misfire_grace,
                on_crash=on_crash,
            )
            return fn

        return register

    def add_job(
        self,
        key: str,
        fn: JobFunction,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        timezone: str | None = None,
        ttl: Duration = DEFAULT_TTL,
        misfire: str = "latest",
        misfire_grace: Duration | None = None,
        on_crash: str = "retry",
    ) -> JobSpec:
        """Register ``fn`` as job ``key`` (the non-decorator form of :meth:`job`)."""
        check_job_key(key)
        if key in self._jobs:
            raise InvalidArgument(
                f"job key {key!r} is defined twice (by {self._jobs[key].qualname} and "
                f"{getattr(fn, '__qualname__', fn)!r}); job keys must be unique in an app"
            )
        if not callable(fn):
            raise InvalidArgument(f"job {key!r}: {fn!r} is not callable; decorate a function")
        _check_signature(key, fn)
        every_td = None
        if every is not None:
            every_td = dt.timedelta(seconds=parse_duration(every, what=f"job {key!r}: every"))
        schedule = Schedule.build(key, cron=cron, every=every_td, timezone=timezone)
        if misfire not in MISFIRE_POLICIES:
            raise InvalidArgument(
                f"job {key!r}: misfire must be one of {', '.join(MISFIRE_POLICIES)}, "
                f"got {misfire!r}"
            )
        if on_crash not in ON_CRASH_POLICIES:
            raise InvalidArgument(
                f"job {key!r}: on_crash must be one of {', '.join(ON_CRASH_POLICIES)}, "
                f"got {on_crash!r}"
            )
        grace = None
        if misfire_grace is not None:
            grace = parse_duration(misfire_grace, what=f"job {key!r}: misfire_grace")
            if grace < 0:
                raise InvalidArgument(f"job {key!r}: misfire_grace must not be negative")
        spec = JobSpec(key, fn, schedule, check_ttl(ttl), Policy(misfire, grace, on_crash))
        self._jobs[key] = spec
        return spec

    # -- running ----------------------------------------------------------------------------

    def run(
        self, *, concurrency: int | None = None, shutdown_grace: Duration | None = None
    ) -> None:
        """Run a worker until SIGTERM/SIGINT (a second one cancels running jobs)."""
        asyncio.run(self.run_async(concurrency=concurrency, shutdown_grace=shutdown_grace))

    async def run_async(
        self,
        *,
        concurrency: int | None = None,
        shutdown_grace: Duration | None = None,
        handle_signals: bool = True,
    ) -> None:
        """Run a worker on the running event loop until :meth:`stop` or a signal.

        With ``handle_signals`` (and on the main thread) SIGTERM and SIGINT stop it
        gracefully: no new claims, running jobs get ``shutdown_grace`` to finish, then they
        are cancelled and their slots handed over; a second signal cancels them at once.
        Cancelling the task that awaits this stops the worker the same way, at once.
        """
        from .scheduling.worker import Worker

        if self._worker is not None:
            raise InvalidArgument("this Scheduler is already running a worker")
        worker = Worker(
            self,
            concurrency=self.concurrency
            if concurrency is None
            else _check_concurrency(concurrency),
            shutdown_grace=(
                self.shutdown_grace if shutdown_grace is None else _check_grace(shutdown_grace)
            ),
        )
        loop = asyncio.get_running_loop()
        handled: list[signal.Signals] = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.on_signal, sig)
                handled.append(sig)
        self._worker, self._loop = worker, loop
        try:
            await worker.run()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
            self._worker, self._loop = None, None

    def stop(self, *, cancel: bool = False) -> None:
        """Ask the running worker to stop (from any thread), like SIGTERM; ``cancel``: like a
        second SIGTERM (running jobs are cancelled and handed over at once)."""
        worker, loop = self._worker, self._loop
        if worker is None or loop is None:
            return
        loop.call_soon_threadsafe(worker.request_stop, cancel)

    async def register_async(self) -> None:
        """Register (upsert) the job definitions without running a worker, e.g. in a deploy
        step. Workers do this when they start."""
        from . import connect_async
        from .scheduling.worker import register

        async with await connect_async(self.dsn, schema=self.schema, migrate=self.migrate) as c:
            await register(c, list(self._jobs.values()), defined_by="register()")

    def register(self) -> None:
        asyncio.run(self.register_async())


class JobResults:
    """``ctx.results``: the job's fenced result store. ``put`` writes inside a strict fence:
    once another worker has taken the job over, the write is rejected with
    :class:`~tenure.StaleTokenError`, even if the successor has not written yet."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx

    def put(self, payload: Any) -> Result:
        """Store ``payload`` (JSON) as this job's result; from a sync job's thread."""
        return self._ctx._call(self.put_async(payload), "ctx.results.put_async(payload)")

    async def put_async(self, payload: Any) -> Result:
        """Store ``payload`` (JSON) as this job's result; from an async job."""
        ctx = self._ctx
        to_json(payload)  # fail on a bad payload before taking a connection
        client = ctx._client
        try:
            async with client._pool.connection() as conn, conn.transaction():
                await fence_async(conn, ctx.job_key, ctx.token, schema=client.schema)
                return await client.results.put(ctx.job_key, payload, token=ctx.token, conn=conn)
        except StaleTokenError:
            ctx._stale = True
            raise

    def get(self) -> Result | None:
        """The stored result of this job (any token), from a sync job's thread."""
        return self._ctx._call(self.get_async(), "ctx.results.get_async()")

    async def get_async(self) -> Result | None:
        return await self._ctx._client.results.get(self._ctx.job_key)


class JobContext:
    """What a job function receives: which slot it runs, its token and lease, and fenced
    writes bound to that token.

    * ``job_key``, ``token`` (the fencing token of this run), ``slot`` (the scheduled time, in
      the job's time zone; the trigger time for a manual run), ``kind`` ("scheduled",
      "retry" or "manual"), ``attempt``, ``lease`` (renewed in the background), ``worker_id``.
    * ``check()`` raises :class:`~tenure.LeaseLost` once the lease is lost or the worker is
      shutting down; ``cancelled`` is then True. Call it between units of work.
    * ``fence(conn)`` / ``await fence_async(conn)``: fence your own transaction on ``conn``
      with this run's token (see :func:`tenure.fence`).
    * ``results.put(payload)`` / ``await results.put_async(payload)``: the fenced result store.
    """

    def __init__(
        self,
        *,
        job_key: str,
        token: int,
        slot: dt.datetime,
        kind: str,
        attempt: int,
        lease: AsyncLease,
        client: AsyncClient,
        worker_id: str,
    ) -> None:
        self.job_key = job_key
        self.token = token
        self.slot = slot
        self.kind = kind
        self.attempt = attempt
        self.lease = lease
        self.worker_id = worker_id
        self.results = JobResults(self)
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._cancel = threading.Event()
        self._reason: str | None = None
        self._stale = False

    def __repr__(self) -> str:
        return (
            f"<JobContext {self.job_key!r} slot={self.slot.isoformat()} token={self.token} "
            f"{self.kind}{' cancelled' if self.cancelled else ''}>"
        )

    @property
    def cancelled(self) -> bool:
        """True once the lease is lost or the worker is shutting down: stop working."""
        if not self._cancel.is_set() and self.lease.lost:
            self._stop(self.lease.lost_reason or "the lease is lost")
        return self._cancel.is_set()

    def check(self) -> None:
        """Raise :class:`~tenure.LeaseLost` if this run must stop."""
        if self.cancelled:
            raise LeaseLost(self.job_key, self.token, self._reason or "cancelled")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` in a sync job, waking early when cancelled; returns
        ``cancelled``."""
        deadline = seconds
        while deadline > 0 and not self.cancelled:
            step = min(deadline, 0.1)
            self._cancel.wait(step)
            deadline -= step
        return self.cancelled

    def fence(self, conn: psycopg.Connection[Any]) -> None:
        """Fence the current transaction on your ``conn`` with this run's token (strict)."""
        try:
            fence(conn, self.job_key, self.token, schema=self._client.schema)
        except StaleTokenError:
            self._stale = True
            raise

    async def fence_async(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            await fence_async(conn, self.job_key, self.token, schema=self._client.schema)
        except StaleTokenError:
            self._stale = True
            raise

    # -- worker side ------------------------------------------------------------------------

    def _stop(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason
        self._cancel.set()

    def _call(self, coro: Coroutine[Any, Any, T], instead: str) -> T:
        """Run a coroutine on the worker's loop from a sync job's thread and wait for it."""
        if threading.get_ident() == self._loop_thread:
            coro.close()
            raise InvalidArgument(
                f"this is the worker's event loop thread (an async job?): use `await {instead}`"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


def _check_signature(key: str, fn: Callable[..., Any]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C callables: let them fail at run time
    try:
        sig.bind(object())
    except TypeError:
        raise InvalidArgument(
            f"job {key!r}: {getattr(fn, '__qualname__', fn)!r} must accept one argument, the "
            f"JobContext (its signature is {sig})"
        ) from None


def _check_concurrency(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"concurrency must be a positive integer, got {value!r}")
    return value


def _check_grace(value: Duration) -> float:
    grace = parse_duration(value, what="shutdown_grace")
    if grace < 0:
        raise InvalidArgument(f"shutdown_grace must not be negative, got {value!r}")
    return grace


__all__ = ["JobContext", "JobResults", "JobSpec", "Scheduler"]
