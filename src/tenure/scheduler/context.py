"""What a job function receives: :class:`JobContext` (slot, token, lease, cancellation) and
``ctx.results``, the fenced result store bound to the run's token."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ..errors import InvalidArgument, LeaseLost, StaleTokenError
from ..leases._async.fencing import fence_async
from ..leases._sync.fencing import fence
from ..leases.models import Result
from ..validation import Duration, parse_duration

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient
    from ..leases._async.lease import AsyncLease

T = TypeVar("T")

#: Guards the contexts' stop flags and their Events (made on first use, see _event).
_EVENTS = threading.Lock()


class JobResults:
    """``ctx.results``: the job's fenced result store. ``put`` is strict
    (``results.put(..., strict=True)``, the rule of :func:`~tenure.fence`): once the lease
    has expired or another worker has taken the job over, the write is rejected with
    :class:`~tenure.StaleTokenError`, even if the successor has not written yet."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx

    def put(self, payload: Any) -> Result:
        """Store ``payload`` (JSON) as this job's result; from a sync job's thread."""
        return self._ctx._call(self.put_async(payload), "ctx.results.put_async(payload)")

    async def put_async(self, payload: Any) -> Result:
        """Store ``payload`` (JSON) as this job's result; from an async job."""
        ctx = self._ctx
        try:
            # Strict: the worker holds this run's lease, so fence()'s rule applies, in one
            # statement (no transaction round trips).
            return await ctx._client.results.put(ctx.job_key, payload, token=ctx.token, strict=True)
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

    * ``args``: a runtime schedule's JSON arguments (a dict; ``{}`` for a coded job) and
      ``task``: its task's name (None for a coded job).
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
        args: dict[str, Any] | None = None,
        task: str | None = None,
    ) -> None:
        self.job_key = job_key
        #: A runtime schedule's JSON arguments ({} for a coded job) and its task's name.
        self.args: dict[str, Any] = {} if args is None else args
        self.task = task
        self.token = token
        self.slot = slot
        self.kind = kind
        self.attempt = attempt
        self.lease = lease
        self.worker_id = worker_id
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # A flag, and an Event made only for a body that waits on it (ctx.wait): one Event
        # per run (a Condition and two locks) was a few percent of a busy worker's CPU.
        self._stopped = False
        self._cancel: threading.Event | None = None
        self._reason: str | None = None
        self._stale = False

    def __repr__(self) -> str:
        return (
            f"<JobContext {self.job_key!r} slot={self.slot.isoformat()} token={self.token} "
            f"{self.kind}{' cancelled' if self.cancelled else ''}>"
        )

    @property
    def results(self) -> JobResults:
        """The job's fenced result store (``ctx.results.put(payload)``)."""
        # Made on access, not kept: a context and a store pointing at each other would be
        # a reference cycle per run, left for the garbage collector (a tenth of a busy
        # worker's CPU went to collecting them, bench/README.md).
        return JobResults(self)

    @property
    def cancelled(self) -> bool:
        """True once the lease is lost or the worker is shutting down: stop working."""
        if not self._stopped and self.lease.lost:
            self._stop(self.lease.lost_reason or "the lease is lost")
        return self._stopped

    def check(self) -> None:
        """Raise :class:`~tenure.LeaseLost` if this run must stop."""
        if self.cancelled:
            raise LeaseLost(self.job_key, self.token, self._reason or "cancelled")

    def wait(self, seconds: Duration) -> bool:
        """Sleep up to ``seconds`` in a sync job, waking early when cancelled; returns
        ``cancelled``."""
        deadline = parse_duration(seconds, what="ctx.wait() seconds")
        while deadline > 0 and not self.cancelled:
            step = min(deadline, 0.1)
            self._event().wait(step)
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
        with _EVENTS:
            if self._reason is None:
                self._reason = reason
            self._stopped = True
            if self._cancel is not None:
                self._cancel.set()

    def _event(self) -> threading.Event:
        """The Event that ``_stop`` sets (made on first use, set if already stopped)."""
        with _EVENTS:
            if self._cancel is None:
                self._cancel = threading.Event()
                if self._stopped:
                    self._cancel.set()
            return self._cancel

    def _call(self, coro: Coroutine[Any, Any, T], instead: str) -> T:
        """Run a coroutine on the worker's loop from a sync job's thread and wait for it."""
        if threading.get_ident() == self._loop_thread:
            coro.close()
            raise InvalidArgument(
                f"this is the worker's event loop thread (an async job?): use `await {instead}`"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()
