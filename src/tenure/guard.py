"""``@tenure.once``: guard a function that a scheduler you keep (APScheduler, Celery beat, a
cron-like loop in every web worker) calls in several processes, so it runs at most once per
slot across all of them.

::

    @tenure.once("sync-invoices", every="5m", ttl="30s")
    def sync_invoices() -> None: ...

    scheduler.add_job(sync_invoices, "interval", minutes=5)   # in each of 4 processes

Each call: (1) names its slot by the database clock (``every``: the multiple of the period
the clock is in; ``cron``: the latest tick; either from ``early``, 2 s, before its time),
the same rules as ``tenure exec --every``/``--slot``, and returns at once if that slot
already completed; (2) takes the job's lease, or returns at once if another process holds
it; (3) checks the slot again under the lease, runs the function while the lease is renewed
in the background, and marks the slot done in a transaction fenced by the token. A call that
does not run returns ``None`` and emits a ``job_run`` metric event with outcome ``busy`` or
``already_done``.

A function that fails leaves its slot open: the next call in the same slot runs it again.
If the lease is lost while the function runs, the call raises :class:`~tenure.LeaseLost`
(the slot is not marked done). With ``pass_context=True`` the function receives a
:class:`OnceContext` first: its token, ``check()``, ``fence(conn)`` and the fenced
``results.put``. A coroutine function stays one: it runs on the caller's event loop, the
database steps in a worker thread (the lease core is synchronous here; its renewals run in a
thread of their own either way).

(This module was ``tenure.contrib.once``, which remains as a deprecated alias: it needs no
extra, so it is not an integration.)
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime as dt
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, cast

from cronsim import CronSim

from . import metrics
from .errors import InvalidArgument, LeaseBusy, StaleTokenError, TenureError
from .exec.slots import EARLY_TOLERANCE, check_period, format_slot, record_slot, slot_state
from .leases.context import RunContext, RunResults, SyncStore
from .validation import Duration, check_job_key, check_schema, check_ttl, parse_duration

if TYPE_CHECKING:
    from .leases._sync.client import Client
    from .leases._sync.lease import Lease
    from .scheduler.schedules import Schedule

log = logging.getLogger("tenure.once")

R = TypeVar("R")

DEFAULT_TTL = "30s"


#: ``ctx.results`` of a guarded run (the name it had before the one run context).
OnceResults = RunResults


class OnceContext(RunContext):
    """What a ``pass_context=True`` function receives: ``job_key``, ``token`` (this run's
    fencing token), ``slot`` (its name, e.g. ``"2026-12-01T14:05:00Z"``), ``lease`` (renewed in
    the background), ``client``, ``check()`` and ``cancelled`` (once the lease is lost),
    ``wait(seconds)``, ``fence(conn)`` (fence your transaction with the token) and the fenced
    ``results``: the one run context of :mod:`tenure.leases.context`."""

    def __init__(self, *, job_key: str, token: int, slot: str, lease: Lease, client: Client):
        super().__init__(
            job_key=job_key,
            token=token,
            schema=client.schema,
            store=SyncStore(lambda: client),
            lease=lease,
        )
        self.slot = slot
        self.lease = lease
        self.client = client

    def __repr__(self) -> str:
        return f"<OnceContext {self.job_key!r} slot={self.slot} token={self.token}>"


@dataclass(frozen=True, slots=True)
class Attempt(Generic[R]):
    """What one guarded call did: ``outcome`` is "succeeded", "busy" or "already_done";
    ``result`` is the function's return value when it ran."""

    outcome: str
    slot: str | None
    token: int | None = None
    result: R | None = None


class Guard:
    """Run functions under one job's lease, at most once per slot when a slot rule is set.

    The building block of :func:`once` (and of ``manage.py tenure_exec``). Slot rule: a
    period in seconds (``every``), a cron ``schedule``, a fixed ``slot`` name (with
    ``every`` too: ``slot@time``), or none (then it only keeps calls from overlapping).
    """

    def __init__(
        self,
        key: str,
        *,
        every: int | None = None,
        schedule: Schedule | None = None,
        slot: str | None = None,
        ttl: float,
        dsn: str | None = None,
        schema: str = "tenure",
        client: Client | None = None,
        early: float = EARLY_TOLERANCE,
    ) -> None:
        self.key = key
        self.early = early
        self.every = every
        self.schedule = schedule
        self.slot = slot
        self.ttl = ttl
        self.dsn = dsn
        self.schema = schema
        self.client = client

    def _client(self) -> Client:
        return self.client if self.client is not None else _shared_client(self.dsn, self.schema)

    @property
    def has_slots(self) -> bool:
        return self.every is not None or self.schedule is not None or self.slot is not None

    def call(self, fn: Callable[..., R], pass_context: bool, args: Any, kwargs: Any) -> R | None:
        return self.attempt(fn, pass_context, args, kwargs).result

    def attempt(
        self, fn: Callable[..., R], pass_context: bool, args: Any, kwargs: Any
    ) -> Attempt[R]:
        """Run ``fn(*args, **kwargs)`` if this call wins its slot (see :func:`once`)."""
        stack = contextlib.ExitStack()
        try:
            held = self._begin(stack)
            if isinstance(held, Attempt):
                return held
            args = self._with_context(held, pass_context, args)
            started = time.monotonic()
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                self._failed(held, started)
                raise
            return self._succeeded(held, started, result)
        finally:
            stack.close()  # releases the lease

    async def attempt_async(
        self, fn: Callable[..., Awaitable[R]], pass_context: bool, args: Any, kwargs: Any
    ) -> Attempt[R]:
        """:meth:`attempt` for a coroutine function: it runs on the caller's event loop; the
        database steps (few, short) run in a worker thread, the lease renews in its own."""
        stack = contextlib.ExitStack()
        try:
            held = await asyncio.to_thread(self._begin, stack)
            if isinstance(held, Attempt):
                return held
            args = self._with_context(held, pass_context, args)
            started = time.monotonic()
            try:
                result = await fn(*args, **kwargs)
            except BaseException:
                self._failed(held, started)
                raise
            return await asyncio.to_thread(self._succeeded, held, started, result)
        finally:
            await asyncio.to_thread(stack.close)

    def _begin(self, stack: contextlib.ExitStack) -> _Held | Attempt[Any]:
        """Name the slot, skip it if done, take the lease (released when ``stack`` closes)
        and check the slot again under it; an :class:`Attempt` when this call must not run."""
        client = self._client()
        slot: str | None = None
        open_until: dt.datetime | None = None
        if self.schedule is not None:
            tick, open_until = slot_tick(self.schedule, client.now(), self.early)
            slot = format_slot(tick)
        if self.has_slots:
            state = slot_state(client, self.key, slot or self.slot, self.every, self.early)
            slot = state.slot
            open_until = open_until or state.open_until
            if state.done:
                return self._skip("already_done", slot, None, f"slot {slot} already done")
        try:
            lease = stack.enter_context(client.lease(self.key, ttl=self.ttl))
        except LeaseBusy as busy:
            return self._skip("busy", slot, None, f"held by another process ({busy})")
        # Again under the lease, in a new statement: a run that completed the slot while our
        # takeover waited for its fenced transaction is visible now.
        if slot is not None and slot_state(client, self.key, slot, None).done:
            return self._skip("already_done", slot, lease.token, "already done")
        return _Held(client, lease, slot, open_until)

    def _with_context(self, held: _Held, pass_context: bool, args: Any) -> Any:
        if not pass_context:
            return args
        ctx = OnceContext(
            job_key=self.key,
            token=held.lease.token,
            slot=held.slot or "",
            lease=held.lease,
            client=held.client,
        )
        return (ctx, *args)

    def _skip(self, outcome: str, slot: str | None, token: int | None, why: str) -> Attempt[Any]:
        metrics.emit(metrics.JOB, self.key, outcome)
        extra = {"job": self.key, "slot": slot, "token": token}
        log.debug("%r not run (slot %s): %s", self.key, slot, why, extra=extra)
        return Attempt(outcome, slot, token)

    def _failed(self, held: _Held, started: float) -> None:
        outcome = "lease_lost" if held.lease.lost else "failed"
        metrics.emit(metrics.JOB, self.key, outcome, time.monotonic() - started)

    def _succeeded(self, held: _Held, started: float, result: R) -> Attempt[R]:
        """The function returned: mark the slot done (fenced), unless the lease was lost."""
        client, lease, slot, open_until = held
        extra = {"job": self.key, "slot": slot, "token": lease.token}
        if lease.lost:
            metrics.emit(metrics.JOB, self.key, "lease_lost", time.monotonic() - started)
            log.warning(
                "%r lost its lease (token %s) while running slot %s; the slot is not marked "
                "done and may run again",
                self.key,
                lease.token,
                slot,
                extra=extra,
            )
            lease.check()  # raises LeaseLost
        try:
            if slot is not None:
                record_slot(client, lease, slot, open_until=open_until)
        except StaleTokenError:
            log.warning(
                "%r ran slot %s but lost its lease (token %s) before marking it done; the "
                "slot may run again",
                self.key,
                slot,
                lease.token,
                extra=extra,
            )
        except TenureError as exc:
            log.warning("%r ran slot %s but could not mark it done: %s", self.key, slot, exc)
        metrics.emit(metrics.JOB, self.key, "succeeded", time.monotonic() - started)
        log.info("%r ran (slot %s) with token %s", self.key, slot or "-", lease.token, extra=extra)
        return Attempt("succeeded", slot, lease.token, result)


class _Held(NamedTuple):
    """A call that won: the client, its lease and its slot (None without a slot rule), and
    the end of the slot's window (None for a slot named by the caller: kept for good)."""

    client: Client
    lease: Lease
    slot: str | None
    open_until: dt.datetime | None = None


def once(
    key: str,
    *,
    every: Duration | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    ttl: Duration = DEFAULT_TTL,
    dsn: str | None = None,
    schema: str = "tenure",
    client: Client | None = None,
    pass_context: bool = False,
    early: Duration = EARLY_TOLERANCE,
) -> Callable[[Callable[..., R]], Callable[..., R | None]]:
    """Decorator: run the function at most once per slot across every process calling it.

    ``every`` (a whole number of seconds, at least 1s: "5m") or ``cron`` (five fields, in
    ``timezone``, default UTC) names the slot; give exactly one. ``ttl``: the lease TTL,
    renewed every ttl/3 while the function runs. ``dsn``/``schema``: as in
    :func:`tenure.connect` (each process opens one small pool on first call); or pass your
    own ``client``. Coroutine functions are awaited on the caller's loop. A call that does not
    run (slot done, or another process is running it) returns ``None``. ``pass_context``:
    pass an :class:`OnceContext` as first argument. ``early`` (default 2s, at most half the
    period): a call this long before a slot's time already runs that slot, so schedulers
    firing a moment early share it; no slot ever runs earlier than that.
    """
    check_job_key(key)
    check_schema(schema)
    ttl_s = check_ttl(ttl)
    if (every is None) == (cron is None):
        raise InvalidArgument(f"once {key!r}: give exactly one of every='5m' or cron='*/5 * * * *'")
    period: int | None = None
    schedule: Schedule | None = None
    if every is not None:
        if timezone is not None:
            raise InvalidArgument(f"once {key!r}: timezone applies to cron= only")
        period = check_period(parse_duration(every, what=f"once {key!r}: every"))
    else:
        from .scheduler.schedules import Schedule

        schedule = Schedule.build(key, cron=cron, timezone=timezone)
    early_s = parse_duration(early, what=f"once {key!r}: early")
    if early_s < 0:
        raise InvalidArgument(f"once {key!r}: early must not be negative, got {early!r}")
    guard = Guard(
        key,
        every=period,
        schedule=schedule,
        ttl=ttl_s,
        dsn=dsn,
        schema=schema,
        client=client,
        early=early_s,
    )

    def decorate(fn: Callable[..., R]) -> Callable[..., R | None]:
        if not callable(fn):
            raise InvalidArgument(f"once {key!r}: {fn!r} is not callable; decorate a function")
        guarded: Any
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                return (await guard.attempt_async(fn, pass_context, args, kwargs)).result

            guarded = guarded_async
        else:

            @functools.wraps(fn)
            def guarded_sync(*args: Any, **kwargs: Any) -> R | None:
                return guard.call(fn, pass_context, args, kwargs)

            guarded = guarded_sync
        if pass_context:
            # Frameworks that check call arguments (Celery) must not expect the context.
            sig = inspect.signature(fn)
            params = list(sig.parameters.values())[1:]
            guarded.__signature__ = sig.replace(parameters=params)
        guarded.tenure_once = guard
        return cast("Callable[..., R | None]", guarded)

    return decorate


def slot_tick(
    schedule: Schedule, now: dt.datetime, early: float
) -> tuple[dt.datetime, dt.datetime]:
    """The cron tick a call at ``now`` runs, and until when calls name it: the latest tick at
    or before ``now`` plus the early tolerance (capped at half the gap between the ticks),
    the ``every`` rule of ``tenure exec`` for cron schedules. No tick runs more than
    ``early`` seconds before its time."""
    assert schedule.cron is not None, "slot_tick is for cron schedules"

    def named_from(tick: dt.datetime, before: dt.datetime) -> dt.datetime:
        # A tick is named from `early` before it on, but never in the first half of its gap.
        return tick - min(dt.timedelta(seconds=early), (tick - before) / 2)

    ahead = schedule.next_after(now)  # strictly after now
    local = (now + dt.timedelta(microseconds=1)).astimezone(schedule.local(now).tzinfo)
    previous = next(CronSim(schedule.cron, local, reverse=True)).astimezone(dt.UTC)  # <= now
    if now >= named_from(ahead, previous):
        return ahead, named_from(schedule.next_after(ahead), ahead)
    return previous, named_from(ahead, previous)


# -- one client per process ------------------------------------------------------------------

_clients: dict[tuple[int, str | None, str], Client] = {}
_clients_lock = threading.Lock()


def _shared_client(dsn: str | None, schema: str) -> Client:
    """This process' client for ``(dsn, schema)``, opened on first use.

    Keyed by pid as well: a pool opened before a fork (Celery's prefork pool, gunicorn's
    preload) must not be used by the children, which open their own.
    """
    key = (os.getpid(), dsn, schema)
    with _clients_lock:
        found = _clients.get(key)
        if found is None:
            from .leases._sync.client import connect

            found = _clients[key] = connect(dsn, schema=schema, pool_size=2)
        return found


def _close_clients() -> None:
    with _clients_lock:
        mine = [k for k in _clients if k[0] == os.getpid()]
        for k in mine:
            _clients.pop(k).close()


atexit.register(_close_clients)


__all__ = ["Attempt", "Guard", "OnceContext", "OnceResults", "once"]
