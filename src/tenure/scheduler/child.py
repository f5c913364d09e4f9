"""The child side of ``isolation="process"``: ``python -m tenure.scheduler.child``.

The worker (:mod:`.isolation`) starts this in a new session with the run's description as
JSON on stdin (not in argv or the environment: it carries the connection string) and a
pipe on which the child reports how the body ended, as one JSON line. The child imports the
job's module, calls the function with a :class:`ProcessJobContext` and reports; a crash
(segfault, ``os._exit``, the OOM killer) ends only this process, and the worker records the
run as failed. The worker keeps the lease: when it is lost, or the worker shuts down, the
child gets SIGTERM (``ctx.cancelled``, ``ctx.check()`` raises; an async body is cancelled)
and SIGKILL after a grace.

The report is written as soon as the body has ended, before anything it left running is
wound down: the run's outcome does not wait for this process's exit. An async body's
leftover tasks are cancelled as ``asyncio.run`` does, but waited for at most
:data:`LEFTOVERS` seconds (``asyncio.run`` waits without a bound, and a task that swallows
its cancellation, as psycopg_pool 3.3's connecting task does, held the child for good).
Whatever still holds the process after its report (a thread that never ends), the worker
stops (:mod:`.isolation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import importlib
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from ..leases._sync.client import Client, connect
from ..leases.context import RunContext, SyncStore

log = logging.getLogger("tenure.scheduler")

#: The longest error message reported back (the run history keeps it).
MAX_ERROR = 4000
#: Why ``ctx.check()`` raises after SIGTERM.
STOPPED = "the worker stopped this run"
#: Seconds an async body's leftover tasks get to end once cancelled, after its report.
LEFTOVERS = 1.0


class ProcessJobContext(RunContext):
    """What an isolated job receives: the attributes and methods of
    :class:`~tenure.JobContext` except ``lease`` (the worker holds it); the same run context
    (:mod:`tenure.leases.context`), its results through a client of the child's own."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(
            job_key=request["job_key"],
            token=request["token"],
            schema=request["schema"],
            store=SyncStore(self._connect),
        )
        self.slot = dt.datetime.fromisoformat(request["slot"])
        self.kind: str = request["kind"]
        self.attempt: int = request["attempt"]
        self.worker_id: str = request["worker_id"]
        self.args: dict[str, Any] = request.get("args") or {}
        self.task: str | None = request.get("task")
        self._dsn: str | None = request["dsn"]
        self._client: Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"<ProcessJobContext {self.job_key!r} slot={self.slot.isoformat()} "
            f"token={self.token} {self.kind}{' cancelled' if self.cancelled else ''}>"
        )

    def _connect(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = connect(
                    self._dsn,
                    schema=self._schema,
                    pool_size=2,
                    application_name=f"tenure job {self.job_key}"[:63],
                )
            return self._client


def _function(request: dict[str, Any]) -> Any:
    sys.path[:0] = [p for p in request["path"] if p not in sys.path]
    target: Any = importlib.import_module(request["module"])
    for part in request["qualname"].split("."):
        target = getattr(target, part)
    return target


def _run(fn: Any, ctx: ProcessJobContext, loop: asyncio.AbstractEventLoop | None) -> None:
    if loop is None:
        signal.signal(signal.SIGTERM, lambda *_: ctx._stop(STOPPED))
        fn(ctx)
        return

    async def body() -> None:
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            ctx._stop(STOPPED)
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, stop)
        try:
            await fn(ctx)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    asyncio.set_event_loop(loop)
    loop.run_until_complete(body())


def _close(loop: asyncio.AbstractEventLoop, job_key: str) -> None:
    """What ``asyncio.run`` does after its coroutine, within one deadline: cancel the tasks
    left running and wait for them, finish async generators; then close the loop, unless a
    task is still there (the process exits without it). The default executor's threads are
    joined by the interpreter's exit, as every ThreadPoolExecutor's are."""

    async def wind_down() -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LEFTOVERS):
                if tasks:
                    await asyncio.wait(tasks)
                await loop.shutdown_asyncgens()

    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    loop.run_until_complete(wind_down())
    asyncio.set_event_loop(None)
    if left := [task for task in tasks if not task.done()]:
        # Not closed under them: their coroutines still run their cleanup when destroyed.
        log.warning(
            "job %r: %d task(s) its body left running did not end within %s s of being "
            "cancelled (%s); the job's process exits without them",
            job_key,
            len(left),
            LEFTOVERS,
            ", ".join(task.get_name() for task in left),
        )
        return
    loop.close()


def main() -> None:
    request = json.loads(sys.stdin.read())
    report = os.fdopen(request["report_fd"], "w")
    ctx = ProcessJobContext(request)
    loop = asyncio.new_event_loop() if request["is_async"] else None
    outcome: dict[str, Any] = {"outcome": "succeeded"}
    try:
        _run(_function(request), ctx, loop)
    except BaseException as exc:  # reported, whatever it is: this process ends anyway
        text = str(exc)
        error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        outcome = {"outcome": "failed", "error": error[:MAX_ERROR]}
    # The body has ended: from here a SIGTERM from the worker just ends this process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    outcome["stale"] = ctx._stale
    outcome["cancelled"] = ctx.cancelled
    report.write(json.dumps(outcome) + "\n")
    report.close()  # the worker has the outcome, whatever the rest of this exit does
    try:
        if loop is not None:
            _close(loop, ctx.job_key)
    finally:
        if ctx._client is not None:
            ctx._client.close()


if __name__ == "__main__":
    main()
