"""The child side of ``isolation="process"``: ``python -m tenure.scheduler.child``.

The worker (:mod:`.isolation`) starts this in a new session with the run's description as
JSON on stdin (not in argv or the environment: it carries the connection string) and a
pipe on which the child reports how the body ended, as one JSON line. The child imports the
job's module, calls the function with a :class:`ProcessJobContext` and reports; a crash
(segfault, ``os._exit``, the OOM killer) ends only this process, and the worker records the
run as failed. The worker keeps the lease: when it is lost, or the worker shuts down, the
child gets SIGTERM (``ctx.cancelled``, ``ctx.check()`` raises; an async body is cancelled)
and SIGKILL after a grace.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import json
import os
import signal
import sys
import threading
from typing import Any

from ..leases._sync.client import Client, connect
from ..leases.context import RunContext, SyncStore

#: The longest error message reported back (the run history keeps it).
MAX_ERROR = 4000
#: Why ``ctx.check()`` raises after SIGTERM.
STOPPED = "the worker stopped this run"


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


def _run(fn: Any, ctx: ProcessJobContext, is_async: bool) -> None:
    if not is_async:
        signal.signal(signal.SIGTERM, lambda *_: ctx._stop(STOPPED))
        fn(ctx)
        return

    async def body() -> None:
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            ctx._stop(STOPPED)
            task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        await fn(ctx)

    asyncio.run(body())


def main() -> None:
    request = json.loads(sys.stdin.read())
    report = os.fdopen(request["report_fd"], "w")
    ctx = ProcessJobContext(request)
    outcome: dict[str, Any] = {"outcome": "succeeded"}
    try:
        _run(_function(request), ctx, request["is_async"])
    except BaseException as exc:  # reported, whatever it is: this process ends anyway
        text = str(exc)
        error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        outcome = {"outcome": "failed", "error": error[:MAX_ERROR]}
    outcome["stale"] = ctx._stale
    outcome["cancelled"] = ctx.cancelled
    report.write(json.dumps(outcome) + "\n")
    report.flush()
    if ctx._client is not None:
        ctx._client.close()


if __name__ == "__main__":
    main()
