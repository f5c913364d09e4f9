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

import psycopg

from ..errors import LeaseLost, StaleTokenError
from ..leases._sync.client import Client, connect
from ..leases._sync.fencing import fence
from ..leases.models import Result

#: The longest error message reported back (the run history keeps it).
MAX_ERROR = 4000


class ProcessResults:
    """``ctx.results`` in an isolated run: the same strict fence as in the worker."""

    def __init__(self, ctx: ProcessJobContext) -> None:
        self._ctx = ctx

    def put(self, payload: Any) -> Result:
        ctx = self._ctx
        client = ctx._connect()
        try:
            with client.fenced(ctx.job_key, ctx.token) as conn:
                return client.results.put(ctx.job_key, payload, token=ctx.token, conn=conn)
        except StaleTokenError:
            ctx._stale = True
            raise

    async def put_async(self, payload: Any) -> Result:
        return await asyncio.to_thread(self.put, payload)

    def get(self) -> Result | None:
        return self._ctx._connect().results.get(self._ctx.job_key)

    async def get_async(self) -> Result | None:
        return await asyncio.to_thread(self.get)


class ProcessJobContext:
    """What an isolated job receives: the attributes and methods of
    :class:`~tenure.JobContext` except ``lease`` (the worker holds it)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.job_key: str = request["job_key"]
        self.token: int = request["token"]
        self.slot = dt.datetime.fromisoformat(request["slot"])
        self.kind: str = request["kind"]
        self.attempt: int = request["attempt"]
        self.worker_id: str = request["worker_id"]
        self.results = ProcessResults(self)
        self._dsn: str | None = request["dsn"]
        self._schema: str = request["schema"]
        self._client: Client | None = None
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._stale = False

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

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        if self.cancelled:
            raise LeaseLost(self.job_key, self.token, "the worker stopped this run")

    def wait(self, seconds: float) -> bool:
        self._cancel.wait(max(0.0, seconds))
        return self.cancelled

    def fence(self, conn: psycopg.Connection[Any]) -> None:
        try:
            fence(conn, self.job_key, self.token, schema=self._schema)
        except StaleTokenError:
            self._stale = True
            raise

    async def fence_async(self, conn: psycopg.AsyncConnection[Any]) -> None:
        from ..leases._async.fencing import fence_async

        try:
            await fence_async(conn, self.job_key, self.token, schema=self._schema)
        except StaleTokenError:
            self._stale = True
            raise


def _function(request: dict[str, Any]) -> Any:
    sys.path[:0] = [p for p in request["path"] if p not in sys.path]
    target: Any = importlib.import_module(request["module"])
    for part in request["qualname"].split("."):
        target = getattr(target, part)
    return target


def _run(fn: Any, ctx: ProcessJobContext, is_async: bool) -> None:
    if not is_async:
        signal.signal(signal.SIGTERM, lambda *_: ctx._cancel.set())
        fn(ctx)
        return

    async def body() -> None:
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            ctx._cancel.set()
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
