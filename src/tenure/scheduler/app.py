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
* Sync job functions run in threads (at most ``concurrency`` bodies at once), async ones on the
  worker's event loop. The lease is renewed every ttl/3 while the job runs; when it is lost,
  an async job is cancelled and a sync job sees ``ctx.check()`` raise and ``ctx.cancelled``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from ..db.retention import DEFAULT_INBOX_RETENTION, DEFAULT_RETENTION, Retention
from ..errors import InvalidArgument
from ..validation import (
    MAX_CONCURRENCY,
    MAX_QUEUE,
    Duration,
    check_dsn,
    check_int,
    check_job_key,
    check_schema,
    check_ttl,
    parse_duration,
)
from .definitions import check_task
from .isolation import importable
from .registration import register_tasks
from .schedules import MISFIRE_POLICIES, ON_CRASH_POLICIES, QUARANTINE_AFTER, Policy, Schedule
from .settings import WorkerSettings
from .spec import JobFunction, JobSpec, TaskSpec
from .vacuum import DEFAULT_EVERY as DEFAULT_VACUUM_EVERY
from .worker import Worker, register

log = logging.getLogger("tenure.scheduler")

F = TypeVar("F", bound=JobFunction)

DEFAULT_TTL = "30s"
DEFAULT_CONCURRENCY = 8
#: Claimed runs whose bodies have not begun, per worker (claimed ahead of their slots, kept
#: for their next slots by the finish, being started, waiting for a body slot): room for
#: every-second jobs kept a second ahead at 10,000 runs/s, or 0.2 s of fire-ahead at 50,000.
DEFAULT_CLAIM_AHEAD = 10_000
#: Ended runs whose end the batching finisher has not recorded yet, per worker.
DEFAULT_FINISH_BACKLOG = 1000
DEFAULT_SHUTDOWN_GRACE = "30s"
#: Where a job body runs: in the worker ("none") or in a child process ("process").
ISOLATIONS = ("none", "process")


class Scheduler:
    """A set of scheduled jobs and the worker that runs them.

    ``dsn``/``schema``: as in :func:`tenure.connect` (the ``tenure worker`` command's
    ``--dsn``/``--schema`` override them). ``concurrency``: most job bodies running at once
    per worker (a run whose slot comes while all are busy waits for one, its lease renewed).
    ``claim_ahead``: most claimed runs per worker whose bodies have not begun (claimed ahead
    of their slots, being started, waiting for a body); ``finish_backlog``: most ended runs
    per worker whose end is not recorded yet (the finisher records them in batches). Neither
    counts against ``concurrency``; a full one makes the worker claim nothing more until
    there is room.
    ``shutdown_grace``: how long a stopping worker lets running jobs finish.
    ``history_retention``: history older than this is pruned by the workers: run histories
    (the scheduler's and ``tenure exec``'s), completed slots no run can name again and
    delivered outbox messages of the schema. ``inbox_retention``: the inbox's claims older
    than this (at least 1d) are pruned too (docs/retention.md says why both are safe).
    ``vacuum_every``: how often a worker looks whether the scheduler's own tables (one row
    per job, updated on every run) need a vacuum, and vacuums them if so; 0 leaves them to
    autovacuum (:mod:`tenure.scheduler.vacuum` says why a busy scheduler wants it).
    ``migrate``: apply pending migrations when a worker starts.
    ``name``: the app its job definitions belong to (default: ``MODULE:ATTR`` as given to
    ``tenure worker``, else the module and variable this Scheduler is bound to). A worker of
    another app that defines one of its job keys refuses to start unless it adopts the job.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        name: str | None = None,
        schema: str = "tenure",
        concurrency: int = DEFAULT_CONCURRENCY,
        claim_ahead: int = DEFAULT_CLAIM_AHEAD,
        finish_backlog: int = DEFAULT_FINISH_BACKLOG,
        shutdown_grace: Duration = DEFAULT_SHUTDOWN_GRACE,
        history_retention: Duration = DEFAULT_RETENTION,
        inbox_retention: Duration = DEFAULT_INBOX_RETENTION,
        pool_size: int = 4,
        vacuum_every: Duration = DEFAULT_VACUUM_EVERY,
        migrate: bool = False,
    ) -> None:
        self.dsn = check_dsn(dsn)
        self.schema = check_schema(schema)
        self.concurrency = _check_concurrency(concurrency)
        self.claim_ahead = check_int(claim_ahead, what="claim_ahead", minimum=1, maximum=MAX_QUEUE)
        self.finish_backlog = check_int(
            finish_backlog, what="finish_backlog", minimum=1, maximum=MAX_QUEUE
        )
        self.shutdown_grace = _check_grace(shutdown_grace)
        self.retention = Retention.of(history_retention, inbox_retention, what="history_retention")
        self.pool_size = check_int(pool_size, what="pool_size", minimum=2, maximum=1000)
        self.vacuum_every = parse_duration(vacuum_every, what="vacuum_every")
        self.migrate = migrate
        self._name = None if name is None else _check_name(name)
        #: Set by ``tenure worker MODULE:ATTR`` (the path as given) when ``name`` is not.
        self.default_name: str | None = None
        # Where the Scheduler was created: its default name is found there.
        self._module = sys._getframe(1).f_globals.get("__name__", "?")
        self._jobs: dict[str, JobSpec] = {}
        self._tasks: dict[str, TaskSpec] = {}
        self._worker: Worker | None = None
        #: Runs the last worker stopped without, because their bodies did not stop.
        self.left_behind = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"<Scheduler schema={self.schema!r} jobs={len(self._jobs)} tasks={len(self._tasks)}>"

    @property
    def name(self) -> str:
        """The app that owns this Scheduler's job definitions in the database."""
        if self._name is not None:
            return self._name
        if self.default_name is not None:
            return self.default_name
        return _guess_name(self, self._module)

    @property
    def jobs(self) -> Mapping[str, JobSpec]:
        return MappingProxyType(self._jobs)

    @property
    def tasks(self) -> Mapping[str, TaskSpec]:
        return MappingProxyType(self._tasks)

    def task(self, name: str, *, isolation: str = "none") -> Callable[[F], F]:
        """Decorator: register ``fn(ctx)`` as task ``name``, which runtime schedules name
        (``tenure.add_schedule(..., task=name)``, ``tenure schedules add KEY --task NAME``).
        Each run gets the schedule's JSON arguments as ``ctx.args`` (a dict) and its key as
        ``ctx.job_key``; it is claimed, fenced and recorded like a coded job. ``isolation``:
        as in :meth:`job`."""

        def register(fn: F) -> F:
            self.add_task(name, fn, isolation=isolation)
            return fn

        return register

    def add_task(self, name: str, fn: JobFunction, *, isolation: str = "none") -> TaskSpec:
        """Register ``fn`` as task ``name`` (the non-decorator form of :meth:`task`)."""
        check_task(name)
        if name in self._tasks:
            raise InvalidArgument(
                f"task {name!r} is defined twice (by {self._tasks[name].qualname} and "
                f"{getattr(fn, '__qualname__', fn)!r}); task names must be unique in an app"
            )
        if not callable(fn):
            raise InvalidArgument(f"task {name!r}: {fn!r} is not callable; decorate a function")
        _check_signature(name, fn)
        _check_isolation(f"task {name!r}", fn, isolation)
        spec = TaskSpec(name, fn, isolation)
        self._tasks[name] = spec
        return spec

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
        quarantine_after: int | None = QUARANTINE_AFTER,
        isolation: str = "none",
    ) -> Callable[[F], F]:
        """Decorator: register ``fn(ctx)`` as job ``key``.

        ``cron`` (five Debian cron fields, or @daily-style aliases) in ``timezone`` (IANA name,
        default UTC), or ``every`` (a duration like "30s"; slots are spread over the interval
        by a phase derived from the key). ``ttl``: the lease TTL (renewed every ttl/3 while
        the job runs). ``misfire``: "latest" (run the newest missed slot), "all" (each missed
        slot, oldest first) or "skip" (only a slot that is on time); ``misfire_grace``: how
        late a slot may start and still run (default: no limit, 1s for "skip"). ``on_crash``:
        "retry" the slot of a run whose holder died, or "skip" it (recorded abandoned).
        ``quarantine_after``: after this many consecutive runs that ended with their worker
        gone (the process died mid-run: ``os._exit``, a segfault, the OOM killer), the job is
        quarantined: paused with the reason, until ``tenure jobs resume``; None: never.
        ``isolation``: "none" (default: in the worker, sync bodies in a thread) or "process"
        (in a child process, so that a crash or a leak stays there and fails only the run;
        the function must be importable by module and name; ``ctx.lease`` is not available
        there, ``ctx.check()``/``ctx.cancelled`` are, via SIGTERM).
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
                quarantine_after=quarantine_after,
                isolation=isolation,
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
        quarantine_after: int | None = QUARANTINE_AFTER,
        isolation: str = "none",
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
            if grace < 0:
                raise InvalidArgument(f"job {key!r}: misfire_grace must not be negative")
        if quarantine_after is not None and (
            isinstance(quarantine_after, bool)
            or not isinstance(quarantine_after, int)
            or quarantine_after < 1
        ):
            raise InvalidArgument(
                f"job {key!r}: quarantine_after must be a positive integer (runs in a row that "
                f"ended with their worker gone) or None for never, got {quarantine_after!r}"
            )
        _check_isolation(f"job {key!r}", fn, isolation)
        policy = Policy(misfire, grace, on_crash, quarantine_after)
        spec = JobSpec(
            key, fn, schedule, check_ttl(ttl, what=f"job {key!r}: ttl"), policy, isolation
        )
        self._jobs[key] = spec
        return spec

    # -- running ----------------------------------------------------------------------------

    def run(
        self,
        *,
        concurrency: int | None = None,
        shutdown_grace: Duration | None = None,
        adopt: bool = False,
    ) -> None:
        """Run a worker until SIGTERM/SIGINT (a second one cancels running jobs) on an event
        loop of its own. Unlike ``asyncio.run``, it returns once the worker has stopped even if
        a job body refused to (an async body that swallows CancelledError): such a run is
        recorded 'abandoned' and its task left behind (:attr:`left_behind` counts them)."""
        _run_loop(
            self.run_async(concurrency=concurrency, shutdown_grace=shutdown_grace, adopt=adopt)
        )

    async def run_async(
        self,
        *,
        concurrency: int | None = None,
        shutdown_grace: Duration | None = None,
        handle_signals: bool = True,
        adopt: bool = False,
    ) -> None:
        """Run a worker on the running event loop until :meth:`stop` or a signal.

        ``adopt``: take over job keys that another app (another :attr:`name`) registered;
        without it the worker refuses to start (:class:`~tenure.JobOwnedByAnotherApp`).

        With ``handle_signals`` (and on the main thread) SIGTERM and SIGINT stop it
        gracefully: no new claims, running jobs get ``shutdown_grace`` to finish, then they
        are cancelled and their slots handed over; a second signal cancels them at once.
        Cancelling the task that awaits this stops the worker the same way, at once.
        """
        if self._worker is not None:
            raise InvalidArgument("this Scheduler is already running a worker")
        worker = Worker(
            self.settings(concurrency=concurrency, shutdown_grace=shutdown_grace, adopt=adopt),
            self.jobs,
            self.tasks,
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
            self.left_behind = worker.left_behind

    def settings(
        self,
        *,
        concurrency: int | None = None,
        shutdown_grace: Duration | None = None,
        adopt: bool = False,
    ) -> WorkerSettings:
        """What a worker of this Scheduler runs with: its settings, with those given here
        (checked) instead of its own."""
        return WorkerSettings(
            app=self.name,
            dsn=self.dsn,
            schema=self.schema,
            pool_size=self.pool_size,
            migrate=self.migrate,
            retention=self.retention,
            vacuum_every=self.vacuum_every,
            concurrency=self.concurrency
            if concurrency is None
            else _check_concurrency(concurrency),
            shutdown_grace=(
                self.shutdown_grace if shutdown_grace is None else _check_grace(shutdown_grace)
            ),
            adopt=adopt,
            claim_ahead=self.claim_ahead,
            finish_backlog=self.finish_backlog,
        )

    @property
    def history_retention(self) -> float:
        """Seconds history is kept (``retention.history``); setting it checks the value."""
        return self.retention.history

    @history_retention.setter
    def history_retention(self, value: Duration) -> None:
        self.retention = Retention.of(value, self.retention.inbox, what="history_retention")

    @property
    def ready(self) -> bool:
        """True while a worker of this Scheduler runs and has registered its jobs, so it
        claims; False before it starts, while it connects, and after it stopped. For
        readiness probes and for code that runs the worker in a background task."""
        worker = self._worker
        return worker is not None and worker.ready.is_set()

    def stop(self, *, cancel: bool = False) -> None:
        """Ask the running worker to stop (from any thread), like SIGTERM; ``cancel``: like a
        second SIGTERM (running jobs are cancelled and handed over at once)."""
        worker, loop = self._worker, self._loop
        if worker is None or loop is None:
            return
        loop.call_soon_threadsafe(worker.request_stop, cancel)

    async def register_async(self, *, adopt: bool = False) -> None:
        """Register (upsert) the job definitions and the task names without running a
        worker, e.g. in a deploy step. Workers do this when they start. ``adopt``: as in
        :meth:`run_async`."""
        from ..leases._async.client import connect_async

        async with await connect_async(self.dsn, schema=self.schema, migrate=self.migrate) as c:
            await register(
                c,
                list(self._jobs.values()),
                defined_by="register()",
                app=self.name,
                adopt=adopt,
            )
            await register_tasks(c, list(self._tasks), app=self.name, registered_by="register()")

    def register(self, *, adopt: bool = False) -> None:
        asyncio.run(self.register_async(adopt=adopt))


#: Seconds tasks still pending when a worker has stopped get after their cancellation.
LEFTOVER_WAIT = 1.0


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``, except that tasks still pending when ``main`` returns get
    :data:`LEFTOVER_WAIT` after their cancellation instead of forever (asyncio.run waits for
    each: one job body that swallows CancelledError kept a stopped worker alive), and the
    default executor's threads are not waited for (one blocked there would do the same)."""
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main)
    finally:
        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=LEFTOVER_WAIT))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


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


def _check_isolation(what: str, fn: Callable[..., Any], isolation: str) -> None:
    if isolation not in ISOLATIONS:
        raise InvalidArgument(
            f"{what}: isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}"
        )
    why = importable(fn) if isolation == "process" else None
    if why is not None:
        raise InvalidArgument(
            f"{what}: isolation='process' imports the function in a child process, but {why}"
        )


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 500:
        raise InvalidArgument(
            f"name must be a non-empty string of at most 500 characters (the app that owns "
            f"the job definitions, e.g. 'billing'), got {name!r}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidArgument(f"name must not contain control characters, got {name!r}")
    return name


def _guess_name(app: Scheduler, module: str) -> str:
    """``MODULE:ATTR`` of the variable ``app`` is bound to in the module that created it, as
    ``tenure worker MODULE:ATTR`` would name it (a script run as ``__main__`` by its file's
    or its ``-m`` module's name); just ``MODULE`` if it is bound to no module variable."""
    loaded = sys.modules.get(module)
    attrs = sorted(k for k, v in vars(loaded).items() if v is app) if loaded is not None else []
    if module == "__main__" and loaded is not None:
        spec = getattr(loaded, "__spec__", None)
        path = getattr(loaded, "__file__", None)
        if spec is not None and spec.name:
            module = spec.name
        elif path:
            module = os.path.splitext(os.path.basename(path))[0]
    return f"{module}:{attrs[0]}" if attrs else module


def _check_concurrency(value: int) -> int:
    return check_int(value, what="concurrency", minimum=1, maximum=MAX_CONCURRENCY)


def _check_grace(value: Duration) -> float:
    return parse_duration(value, what="shutdown_grace")
