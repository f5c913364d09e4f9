"""The one run context: what code running under a lease's token receives.

Three faces share it: :class:`tenure.JobContext` (a scheduled run in the worker),
the process-isolation context (``scheduler/child.py``: the same run in a child process) and
:class:`tenure.OnceContext` (``@tenure.once``). Each adds what its run knows (the slot, the
attempt, the lease); :class:`RunContext` holds what they all do, once:

* ``job_key`` and ``token``;
* cancellation: ``cancelled``, ``check()`` (raises :class:`~tenure.LeaseLost`), ``wait()``.
  A run stops when its lease is lost (if the context has the lease) or when its owner says
  so (``_stop(reason)``: the worker shutting down, SIGTERM in the child);
* ``fence(conn)`` / ``await fence_async(conn)``: fence the caller's own transaction with the
  token (strict, :func:`tenure.fence`);
* ``results``: the fenced result store, written one way everywhere: the strict conditional
  upsert (``results.put(..., strict=True)``, one statement: the rule of the fence, without a
  transaction's round trips).

A refused write (a fence or a result) marks the context ``_stale``, so the runner records the
run as stale even if the body caught the error.

How the store reaches the database depends on where the body runs: :class:`SyncStore` (a
blocking client: the child, ``@tenure.once``) or :class:`LoopStore` (the worker's asyncio
client, called from a sync job's thread or awaited by an async job).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import InvalidArgument, LeaseLost, StaleTokenError
from ..validation import Duration, parse_duration
from ._async.fencing import fence_async
from ._sync.fencing import fence
from .models import Result

if TYPE_CHECKING:
    import psycopg

    from ._async.client import AsyncClient
    from ._sync.client import Client

T = TypeVar("T")

#: Guards the contexts' stop flags and their Events (made on first use, see _event). Reentrant:
#: the child's SIGTERM handler stops its context in the thread that may hold it.
_EVENTS = threading.RLock()


class Lost(Protocol):
    """What a context asks of a lease (sync or asyncio): whether it is lost, and why."""

    @property
    def lost(self) -> bool: ...

    @property
    def lost_reason(self) -> str | None: ...


class Store(Protocol):
    """Where a context's results go: the same statements, blocking or awaited."""

    def put(self, job_key: str, payload: Any, token: int) -> Result: ...

    async def put_async(self, job_key: str, payload: Any, token: int) -> Result: ...

    def get(self, job_key: str) -> Result | None: ...

    async def get_async(self, job_key: str) -> Result | None: ...


class SyncStore:
    """Results through a blocking client (``client()`` opens it on first use, if need be);
    the ``_async`` methods run it in a thread."""

    __slots__ = ("_client",)

    def __init__(self, client: Callable[[], Client]) -> None:
        self._client = client

    def put(self, job_key: str, payload: Any, token: int) -> Result:
        return self._client().results.put(job_key, payload, token=token, strict=True)

    async def put_async(self, job_key: str, payload: Any, token: int) -> Result:
        return await asyncio.to_thread(self.put, job_key, payload, token)

    def get(self, job_key: str) -> Result | None:
        return self._client().results.get(job_key)

    async def get_async(self, job_key: str) -> Result | None:
        return await asyncio.to_thread(self.get, job_key)


class LoopStore:
    """Results through an asyncio client on the running loop; the blocking methods are for
    other threads (a sync job's) and wait for the loop to do it."""

    __slots__ = ("_client", "_loop", "_loop_thread")

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def put(self, job_key: str, payload: Any, token: int) -> Result:
        return self._call(self.put_async(job_key, payload, token), "ctx.results.put_async(payload)")

    async def put_async(self, job_key: str, payload: Any, token: int) -> Result:
        return await self._client.results.put(job_key, payload, token=token, strict=True)

    def get(self, job_key: str) -> Result | None:
        return self._call(self.get_async(job_key), "ctx.results.get_async()")

    async def get_async(self, job_key: str) -> Result | None:
        return await self._client.results.get(job_key)

    def _call(self, coro: Coroutine[Any, Any, T], instead: str) -> T:
        """Run a coroutine on the loop from another thread and wait for it."""
        if threading.get_ident() == self._loop_thread:
            coro.close()
            raise InvalidArgument(
                f"this is the worker's event loop thread (an async job?): use `await {instead}`"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


class RunResults:
    """``ctx.results``: the run's fenced result store. ``put`` is strict (the rule of
    :func:`~tenure.fence`): once the lease has expired or another process has taken the job
    over, the write is rejected with :class:`~tenure.StaleTokenError`, even if the successor
    has not written yet."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx

    def put(self, payload: Any) -> Result:
        """Store ``payload`` (JSON) as this job's result (blocking)."""
        ctx = self._ctx
        try:
            return ctx._store.put(ctx.job_key, payload, ctx.token)
        except StaleTokenError:
            ctx._stale = True
            raise

    async def put_async(self, payload: Any) -> Result:
        """Store ``payload`` (JSON) as this job's result; from a coroutine."""
        ctx = self._ctx
        try:
            return await ctx._store.put_async(ctx.job_key, payload, ctx.token)
        except StaleTokenError:
            ctx._stale = True
            raise

    def get(self) -> Result | None:
        """The stored result of this job (any token)."""
        return self._ctx._store.get(self._ctx.job_key)

    async def get_async(self) -> Result | None:
        return await self._ctx._store.get_async(self._ctx.job_key)


class RunContext:
    """What runs under ``(job_key, token)`` receives (see the module's text)."""

    def __init__(
        self, *, job_key: str, token: int, schema: str, store: Store, lease: Lost | None = None
    ) -> None:
        self.job_key = job_key
        self.token = token
        self._schema = schema
        self._store = store
        self._lease = lease
        # A flag, and an Event made only for a body that waits on it (ctx.wait): one Event
        # per run (a Condition and two locks) was a few percent of a busy worker's CPU.
        self._stopped = False
        self._cancel: threading.Event | None = None
        self._reason: str | None = None
        self._stale = False

    @property
    def results(self) -> RunResults:
        """The fenced result store (``ctx.results.put(payload)``)."""
        # Made on access, not kept: a context and a store pointing at each other would be
        # a reference cycle per run, left for the garbage collector (a tenth of a busy
        # worker's CPU went to collecting them, bench/README.md).
        return RunResults(self)

    @property
    def cancelled(self) -> bool:
        """True once the lease is lost or the run was stopped: stop working."""
        lease = self._lease
        if not self._stopped and lease is not None and lease.lost:
            self._stop(lease.lost_reason or "the lease is lost")
        return self._stopped

    def check(self) -> None:
        """Raise :class:`~tenure.LeaseLost` if this run must stop."""
        if self.cancelled:
            raise LeaseLost(self.job_key, self.token, self._reason or "cancelled")

    def wait(self, seconds: Duration) -> bool:
        """Sleep up to ``seconds`` (blocking), waking early when cancelled; returns
        ``cancelled``."""
        deadline = parse_duration(seconds, what="ctx.wait() seconds")
        while deadline > 0 and not self.cancelled:
            step = min(deadline, 0.1)  # the lease's loss is looked at, not pushed
            self._event().wait(step)
            deadline -= step
        return self.cancelled

    def fence(self, conn: psycopg.Connection[Any]) -> None:
        """Fence the current transaction on your ``conn`` with this run's token (strict).
        Raises :class:`~tenure.LeaseLost` once this run must stop, as :meth:`check`: the
        database may still hold the lease (a renewal's answer came late), but the run is
        given up and its slot retried, so its writes must not commit."""
        self.check()
        try:
            fence(conn, self.job_key, self.token, schema=self._schema)
        except StaleTokenError:
            self._stale = True
            raise

    async def fence_async(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """:meth:`fence` for an asyncio connection."""
        self.check()
        try:
            await fence_async(conn, self.job_key, self.token, schema=self._schema)
        except StaleTokenError:
            self._stale = True
            raise

    # -- the owner's side --------------------------------------------------------------------

    def _stop(self, reason: str) -> None:
        """Stop this run (from any thread): ``cancelled`` turns True, ``wait`` returns."""
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
