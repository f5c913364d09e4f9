"""Running one claimed slot's job body: async bodies as tasks on the worker's loop (cancelled
when the lease is lost), sync ones in reused daemon threads (``ctx.check()`` raises once the
lease is lost). Daemon threads rather than a ThreadPoolExecutor: a sync job that ignores
cancellation must not keep a stopping worker alive (executor threads are joined at exit).

A body never takes its worker down: whatever it raises, ``BaseException`` included
(``sys.exit()``, ``KeyboardInterrupt``, a ``CancelledError`` of its own), is that run's
failure. asyncio re-raises ``SystemExit`` and ``KeyboardInterrupt`` out of the event loop
from any task that lets them escape, so an async body runs inside :func:`_guarded`, which
turns them into :class:`BodyRaised` before they reach its task. Only tenure's own
cancellation (lost lease, shutdown) stops a body."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import tracing
from ..errors import LeaseLost, StaleTokenError, TenureError
from ..leases._async.lease import AsyncLease
from .bodies import BodyLimit, Slot
from .claim import RunIdentity, run_fields
from .context import JobContext
from .isolation import ChildFailed, run_isolated
from .spec import JobSpec

log = logging.getLogger("tenure.scheduler")

#: The error of a run stopped by its worker's shutdown.
HANDED_OVER = "the worker shut down before the run finished; the slot is handed over"


@dataclass(eq=False)
class Run:
    """A run in flight on this worker."""

    spec: JobSpec
    ident: RunIdentity
    ctx: JobContext
    lease: AsyncLease
    #: When it was launched (monotonic; its recorded start is ``ident.started_at``).
    launched: float
    task: asyncio.Task[None] | None = None
    body: asyncio.Future[Any] | None = None
    shutdown: bool = False
    #: Its history row is written ('running', sched_running), or its end is queued.
    row_written: bool = False
    ended: bool = False
    #: The job's next slot after this run, as planned (the finish may keep its lease for it).
    next_slot: dt.datetime | None = None

    @property
    def threaded(self) -> bool:
        """Its body runs in a thread of this process (a sync function, not isolated)."""
        return self.spec.isolation != "process" and not self.spec.is_async


class BodyRaised(Exception):
    """Carries a ``BaseException`` the body raised (``SystemExit``, ``KeyboardInterrupt``,
    ...) out of its task as an ordinary exception."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(original)
        self.original = original


async def _guarded(fn: Any, ctx: JobContext, cancelled_by_tenure: Any) -> Any:
    try:
        return await fn(ctx)
    except asyncio.CancelledError as exc:
        if cancelled_by_tenure():
            raise
        raise BodyRaised(exc) from exc  # the body's own, not tenure's cancellation
    except Exception:
        raise
    except BaseException as exc:
        raise BodyRaised(exc) from exc


def describe_error(exc: BaseException) -> str:
    """``Type: message`` (just ``Type`` when the message is empty), as run history shows it."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: Told of a run whose body began only after a wait for a body slot, and how many seconds
#: after its launch (see Worker._waited).
Waited = Callable[[Run, float], None]


async def execute(
    run: Run, limit: BodyLimit, waited: Waited | None = None
) -> tuple[str, str | None, float]:
    """Run the job body under its lease (renewed every ttl/3), once ``limit`` has a body slot
    for it; returns its outcome, the error (None on success) and how long the body took.
    Never raises for what the body did. With OpenTelemetry, inside a ``tenure.run`` span
    that the body's own spans nest under."""
    if not tracing.enabled():
        return await _execute(run, limit, waited, traced=False)
    ident = run.ident
    lateness = (ident.started_at - ident.slot).total_seconds()
    with tracing.run_span(
        ident.job_key, ident.token, ident.slot, ident.kind, ident.attempt, lateness
    ) as span:
        outcome, error, took = await _execute(run, limit, waited, traced=True)
        span.outcome(outcome, error)
    return outcome, error, took


async def _execute(
    run: Run, limit: BodyLimit, waited: Waited | None, *, traced: bool
) -> tuple[str, str | None, float]:
    loop = asyncio.get_running_loop()
    key, token = run.ident.job_key, run.ident.token
    began = loop.time()
    outcome, error = "succeeded", None
    lease, ctx = run.lease, run.ctx
    keeper: asyncio.TimerHandle | None = None
    holding = released_by_thread = False
    threaded = run.threaded
    if log.isEnabledFor(logging.DEBUG):  # formatting the slot costs a run more than its no-op
        extra = run_fields(key, token, run.ident.slot)
        log.debug("job %r slot %s starts with token %s", key, extra["slot"], token, extra=extra)
    if lease.lost:
        # The claim (or its start) was answered after the lease's local deadline, which
        # counts from when the claim was sent: a request that stalled, e.g. on a primary
        # being failed over. The body must not start on a lost lease: its fenced writes
        # could still commit while the slot is retried as lost (two runs of one slot).
        await lease.stop_keeping()
        return "lease_lost", f"answered after the lease's local deadline: {lease.lost_reason}", 0.0
    slot: Slot | None = None
    try:
        kept = False
        slot = limit.take(key, id(run.spec.fn))
        if slot is None:
            kept, slot = await _wait_for_slot(run, limit)
            began = loop.time()
            if waited is not None:
                waited(run, began - run.launched)
        holding = True
        if lease.deadline_in < lease.ttl / 3:
            # Less than a third of the lease left as the body is about to begin: the claim (or
            # start) was answered late, or the renewals failed while the run waited for its
            # slot. Renewed first, or the body never begins. Begun on what was left (9.7 ms
            # once, after a failover), the lease was lost locally while the body ran and
            # committed its fenced writes (the database's lease was live), and the slot ran
            # again (docs/safety.md, "A claim answered late").
            await _renew_before_body(lease)
        if run.spec.isolation == "process":
            # The body runs in a child process; cancelling this future stops the child.
            info = ctx._client.conninfo  # as connected (else: the same resolution)
            body: asyncio.Future[Any] = asyncio.ensure_future(run_isolated(run.spec, ctx, info))
        elif run.spec.is_async:
            body = asyncio.ensure_future(
                _guarded(run.spec.fn, ctx, lambda: run.shutdown or lease.lost)
            )
        else:
            release = partial(limit.release, slot)
            body = in_thread(run.spec.fn, ctx, f"tenure-job-{key}", release, traced=traced)
            released_by_thread = True
        # Renew every ttl/3 and mark the lease lost at its local deadline (cancelling an
        # async or isolated body then), from ttl/3 on: nothing can be due before, and most
        # runs end sooner, so they never pay for the keeper's two tasks (bench/README.md).
        if not kept:
            due = lease.deadline_in - lease.ttl * 2 / 3 + lease.safety_margin  # acquire + ttl/3
            keeper = loop.call_later(max(0.0, due), _keep, lease, body, not threaded)
        elif not threaded:  # kept since its wait: a lost lease cancels the body from now on
            lease.on_lost(lambda _lease: body.cancel())
        run.body = body
        await body
        if ctx._stale:
            outcome, error = "stale_rejected", "a fenced write was rejected (caught by the job)"
        elif lease.lost and threaded and not ctx._told:
            # A sync body that never looked at its context returned after the lease was lost
            # here: it did its work whole, and every fenced write it made was accepted (a
            # refused one would have raised). Sent as ended, the finish's fence decides: if
            # nobody took the job over, no other run of the slot began and the run's end
            # stands; if somebody did, it is recorded lease_lost (sched_finish). Before, such
            # a run was lease_lost in any case, and its own worker ran the slot again.
            outcome = "succeeded"
            error = f"the lease was lost here while the body ran ({lease.lost_reason})"
            log.warning(
                "job %r token %s: the body returned after its lease was lost here without "
                "looking at its context; recorded as ended unless another worker took the job "
                'over (docs/safety.md, "A body that was never told")',
                key,
                token,
                extra=run_fields(key, token, run.ident.slot),
            )
        elif lease.lost:
            outcome, error = "lease_lost", lease.lost_reason
        elif threaded and run.shutdown:
            # Returned after the worker told it to stop (ctx.wait() returned True): stopped,
            # not done, as when the worker stopped waiting for its thread at once.
            outcome = "cancelled"
            error = HANDED_OVER
    except StaleTokenError as exc:
        outcome, error = "stale_rejected", str(exc)
    except LeaseLost as exc:
        outcome = "cancelled" if run.shutdown and not lease.lost else "lease_lost"
        error = str(exc)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this run task itself was cancelled: not expected, do not swallow
        if lease.lost:
            outcome, error = "lease_lost", f"cancelled: {lease.lost_reason}"
        elif run.shutdown:
            outcome = "cancelled"
            error = HANDED_OVER
        else:
            # A sync body raised CancelledError itself: its failure, not a cancellation.
            outcome, error = "failed", describe_error(exc)
            _log_failure(run, error, exc)
    except BaseException as exc:
        if isinstance(exc, BodyRaised):
            exc = exc.original
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
                raise exc from None  # this run task itself was cancelled (see above)
        if isinstance(exc, ChildFailed) and exc.stale:
            ctx._stale = True
        if ctx._stale:
            outcome = "stale_rejected"
        elif lease.lost:
            outcome = "lease_lost"
        else:
            outcome = "failed"
        error = exc.error if isinstance(exc, ChildFailed) else describe_error(exc)
        if outcome == "failed":
            _log_failure(run, error, exc)
    finally:
        if keeper is not None:
            keeper.cancel()
        if holding and slot is not None:
            if not released_by_thread:
                limit.release(slot)
            limit.grant()
        await lease.stop_keeping()
    return outcome, error, loop.time() - began


async def _wait_for_slot(run: Run, limit: BodyLimit) -> tuple[bool, Slot]:
    """Wait in line for a body slot (every one was busy when the run's slot came, or its
    job's long bodies had their share), the lease renewed meanwhile from ttl/3 on as for a
    body; returns whether its keeper started, and the slot. A lost lease or a stop ends the
    wait by raising CancelledError: the body never runs."""
    loop = asyncio.get_running_loop()
    lease = run.lease
    waiting = limit.wait(run.ident.job_key, id(run.spec.fn))
    run.body = waiting  # a stopping worker cancels it as it would a body
    lease.on_lost(lambda _lease: waiting.cancel())
    kept: list[bool] = []

    def keep() -> None:
        kept.append(True)
        lease.keep()

    due = lease.deadline_in - lease.ttl * 2 / 3 + lease.safety_margin  # acquire + ttl/3
    keeper = loop.call_later(max(0.0, due), keep)
    try:
        slot = await waiting
    except asyncio.CancelledError:
        limit.forget(waiting)
        if limit.closed:
            run.shutdown = True  # the worker stops: the run is handed over, not failed
        raise
    finally:
        keeper.cancel()
    if lease.lost or run.shutdown:  # lost as the slot came: the slot goes on to the next
        limit.release(slot, learn=False)
        limit.grant()
        raise asyncio.CancelledError
    return bool(kept), slot


async def _renew_before_body(lease: AsyncLease) -> None:
    """Renew ``lease`` before a body begins on it; :class:`LeaseLost` if refused, or if the
    database cannot be asked (the little that is left of the lease is no time to run in)."""
    try:
        await lease.renew()
    except LeaseLost:
        raise
    except TenureError as exc:
        raise LeaseLost(
            lease.job_key, lease.token, f"its renewal before the body began failed: {exc}"
        ) from exc


def _keep(lease: AsyncLease, body: asyncio.Future[Any], cancel_body: bool) -> None:
    if not body.done():
        lease.keep(body if cancel_body else None)


def _log_failure(run: Run, error: str, exc: BaseException) -> None:
    ident = run.ident
    extra = run_fields(ident.job_key, ident.token, ident.slot)
    # ERROR, with the traceback: the level at which error trackers (Sentry's logging
    # integration, for one) make an event of a line. A failed body is the team's to look at.
    log.error(
        "job %r slot %s failed: %s",
        ident.job_key,
        ident.slot.isoformat(),
        error,
        # An isolated body's traceback went to the child's stderr; the worker's says nothing.
        exc_info=None if isinstance(exc, ChildFailed) else exc,
        extra=extra,
    )


class DaemonThreads:
    """Reusable daemon threads for sync job bodies. Starting a thread per run cost the event
    loop about a millisecond (a sixth of its time at 1,500 runs/s, bench/README.md). A thread
    that finishes a body waits up to ``idle`` seconds for the next one, then exits; a body
    finds an idle thread or starts a new one, so the threads never queue bodies behind each
    other (the worker's concurrency bounds how many run). Daemon threads, unlike a
    ThreadPoolExecutor's, are not joined at interpreter exit: a body that ignores
    cancellation cannot keep a stopping worker alive."""

    def __init__(self, idle: float = 30.0) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        self._waiting = 0  # threads blocked in get(): each will take one queued body
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            if self._waiting:
                self._waiting -= 1
                self._queue.put(work)
                return
        threading.Thread(target=self._serve, args=(work,), name="tenure-job", daemon=True).start()

    def _serve(self, work: Callable[[], None]) -> None:
        while True:
            work()
            del work  # nothing of the last run stays reachable while the thread idles
            with self._lock:
                self._waiting += 1
            try:
                work = self._queue.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    try:  # a body queued for this thread between the timeout and the lock
                        work = self._queue.get_nowait()
                    except queue.Empty:
                        self._waiting -= 1
                        return

    def _after_fork(self) -> None:
        # The child has none of the parent's threads: none is waiting for work.
        self._lock = threading.Lock()
        self._waiting = 0
        self._queue = queue.SimpleQueue()


_threads = DaemonThreads()
os.register_at_fork(after_in_child=_threads._after_fork)


class _Deliveries:
    """Outcomes of sync bodies on their way back to one event loop. Every
    ``call_soon_threadsafe`` writes a byte to the loop's self-pipe, which is also its signal
    wake-up fd: a thousand bodies ending at once filled it, and a SIGTERM arriving then was
    lost ("Exception ignored when trying to write to the signal wakeup fd"), so the worker
    never stopped. Here only the first outcome of a batch wakes the loop; the callback
    delivers every outcome queued by then."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._queued: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def put(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._queued.append((fn, args))
            if len(self._queued) > 1:
                return  # a wake-up is already on its way
        with contextlib.suppress(RuntimeError):  # the loop is gone: the worker has exited
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            queued, self._queued = self._queued, []
        for fn, args in queued:
            fn(*args)


_deliveries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deliveries] = (
    weakref.WeakKeyDictionary()
)


def in_thread(
    fn: Any,
    ctx: JobContext,
    name: str,
    release: Callable[[float], None],
    *,
    traced: bool | None = None,
) -> asyncio.Future[Any]:
    """Run ``fn(ctx)`` in a daemon thread (named ``name`` while it runs); the returned future
    gets its outcome. ``release`` is called in the thread as soon as ``fn`` returns, with the
    CPU seconds the thread spent in it (its body slot is free before the outcome reaches the
    event loop). ``traced``: whether spans are recorded, as the caller found (None: asked
    here; the OpenTelemetry API reads the environment each time)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    deliveries = _deliveries.get(loop)
    if deliveries is None:
        deliveries = _deliveries[loop] = _Deliveries(loop)

    def deliver(ok: bool, value: Any) -> None:
        if future.done():
            return  # cancelled at shutdown: nobody waits any more
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    # The caller's context (its current span, with OpenTelemetry) for the body: a reused
    # thread would otherwise run it in whatever context the thread started with.
    if traced is None:
        traced = tracing.enabled()
    context = contextvars.copy_context() if traced else None

    def target() -> None:
        thread = threading.current_thread()
        thread.name = name
        cpu = time.thread_time()
        try:
            value = fn(ctx) if context is None else context.run(fn, ctx)
        except BaseException as exc:
            outcome: tuple[bool, Any] = (False, exc)
        else:
            outcome = (True, value)
        finally:
            thread.name = "tenure-job"
            release(time.thread_time() - cpu)
        deliveries.put(deliver, *outcome)

    _threads.submit(target)
    return future
