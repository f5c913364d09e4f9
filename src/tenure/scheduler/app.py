"""Scheduled jobs that run once per slot across any number of workers.

::

    app = tenure.Scheduler()            # DSN as in tenure.connect

    @app.job("nightly-report", cron="0 2 * * *", timezone="Europe/Berlin", ttl="2m")
    def nightly_report(ctx: tenure.JobContext) -> None:
        ctx.results.put(build_report(ctx.slot))     # fenced: a stale run cannot overwrite

    # tenure worker myapp:app   (or app.run(), or await app.run_async())

How it works (details in :mod:`tenure.scheduler.worker` and ``db/sql/scheduler.sql``):

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
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from ..errors import InvalidArgument
from ..validation import (
    MAX_CONCURRENCY,
    Duration,
    check_dsn,
    check_int,
    check_job_key,
    check_schema,
    check_ttl,
    parse_duration,
)
from .schedules import MISFIRE_POLICIES, ON_CRASH_POLICIES, Policy, Schedule
from .spec import JobFunction, JobSpec
from .worker import Worker, register

log = logging.getLogger("tenure.scheduler")

F = TypeVar("F", bound=JobFunction)

DEFAULT_TTL = "30s"
DEFAULT_CONCURRENCY = 8
DEFAULT_SHUTDOWN_GRACE = "30s"
DEFAULT_RETENTION = "7d"


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
        self.dsn = check_dsn(dsn)
        self.schema = check_schema(schema)
        self.concurrency = _check_concurrency(concurrency)
        self.shutdown_grace = _check_grace(shutdown_grace)
        self.history_retention = parse_duration(history_retention, what="history_retention")
        if self.history_retention <= 0:
            raise InvalidArgument(f"history_retention must be positive, got {history_retention!r}")
        self.pool_size = check_int(pool_size, what="pool_size", minimum=2, maximum=1000)
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
        if not isinstance(misfire, str) or misfire not in MISFIRE_POLICIES:
            raise InvalidArgument(
                f"job {key!r}: misfire must be one of {', '.join(MISFIRE_POLICIES)}, "
                f"got {misfire!r}"
            )
        if not isinstance(on_crash, str) or on_crash not in ON_CRASH_POLICIES:
            raise InvalidArgument(
                f"job {key!r}: on_crash must be one of {', '.join(ON_CRASH_POLICIES)}, "
                f"got {on_crash!r}"
            )
        grace = None
        if misfire_grace is not None:
            grace = parse_duration(misfire_grace, what=f"job {key!r}: misfire_grace")
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
        from ..leases._async.client import connect_async

        async with await connect_async(self.dsn, schema=self.schema, migrate=self.migrate) as c:
            await register(c, list(self._jobs.values()), defined_by="register()")

    def register(self) -> None:
        asyncio.run(self.register_async())


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
    return check_int(value, what="concurrency", minimum=1, maximum=MAX_CONCURRENCY)


def _check_grace(value: Duration) -> float:
    return parse_duration(value, what="shutdown_grace")
