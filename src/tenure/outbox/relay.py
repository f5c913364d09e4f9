"""The outbox relay: delivers committed outbox messages to handlers, at least once.

Protocol (every time is the database clock; see db/sql/outbox.sql):

1. **Claim.** A relay claims up to ``concurrency`` deliverable messages of the topics it
   has handlers for, in one statement (``FOR UPDATE SKIP LOCKED``): it sets ``claimed_by``
   (its id), ``claimed_until`` (now + ``visibility``) and counts the attempt. Other relays
   skip claimed rows until the claim runs out, so a relay that died (SIGKILL, lost host)
   holds its messages for at most ``visibility``; then another relay, or the same one
   restarted, claims them again. A message of a topic no relay handles is never claimed: it
   waits, and is reported (below), until a relay with a handler for it starts.
2. **Deliver.** The handler runs for at most ``min(timeout, time left on the claim minus a
   margin)``, measured on the relay's monotonic clock from *before* the claim was sent;
   ``visibility`` must exceed ``timeout`` by the margin (``max(1s, timeout/10)``: clock-rate
   drift, aborting the call, recording the outcome). At the deadline an async handler is
   cancelled, and the webhook's request with it: its connection is closed. So tenure never
   has two attempts of one message in flight: the next attempt, on this relay or another,
   is claimed only after the previous one's request was aborted or answered. What the
   endpoint does is its own affair: an HTTP server may go on processing a request whose
   client has gone, so attempt 1 may still be running *there* when attempt 2 arrives.
   Consumers deduplicate with the inbox (:func:`tenure.inbox.claim_header`), which makes
   that harmless. A synchronous handler runs in a thread, which cannot be interrupted: past
   its timeout the relay keeps renewing the claim until the thread returns, and records the
   thread's own outcome (give such handlers their own timeout).
3. **Record.** Only after the handler returned is the message marked delivered, and only
   by the claim that delivered it. A relay killed between 2 and 3 leaves the message
   claimed; it is delivered again after the claim runs out. Delivery is therefore at least
   once, and consumers apply it once with :func:`tenure.inbox.claim`.
4. **Fail.** An exception, a timeout or a non-2xx answer records the error and backs off
   exponentially with jitter (``backoff * 2**(attempt-1)``, capped at ``backoff_max``, then
   a random 50-100 %). After ``max_attempts`` the message is parked as ``dead``: visible in
   ``tenure outbox list``, re-driven by ``tenure outbox retry``.
5. **Beat.** A relay registers the topics it handles in ``outbox_relays`` and renews that
   row every few seconds (it lasts ``BEAT_TTL``); it deletes it when it stops. Pending
   messages whose topic no live relay lists are counted (:func:`tenure.outbox.unhandled`,
   ``tenure outbox list``, the ``tenure_outbox_unhandled_messages`` gauge), and each relay
   logs "no relay handles topic X" for them.

Messages of one ``(topic, order_key)`` are claimable one at a time in id order (the claim
query skips a message while an older one of its key is undelivered), so per-key order holds
across any number of relays. Relays sleep on ``LISTEN``; ``enqueue`` notifies at commit. A
poll interval bounds the sleep in case a notification is missed (listen connection lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import importlib
import inspect
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import metrics
from ..db import channels
from ..db.notifier import Retry, listen_forever
from ..db.pruning import prune_forever
from ..db.retention import (
    DEFAULT_INBOX_RETENTION,
    DEFAULT_RETENTION,
    RELAY_TABLES,
    Retention,
)
from ..errors import ConfigurationError, DatabaseError, InvalidArgument, SchemaNotReady
from ..leases._async.client import AsyncClient, connect_async
from ..validation import Duration, parse_duration
from ._async.store import check_topic, message_from_row, unhandled_async
from .message import Message

log = logging.getLogger("tenure.relay")

#: A handler receives the message and returns normally when it was delivered; any exception
#: (or the timeout) is a failed attempt. Coroutine functions are awaited; plain functions
#: run in a worker thread.
Handler = Callable[[Message], Any]

#: metrics event: job = topic; outcome = delivered | retry | dead | lost_claim; value = s.
DELIVERY = "outbox_delivery"

MAX_ERROR = 2000

#: How long a relay's registration lasts without a beat; it beats every third of that.
BEAT_TTL = 30.0
#: A topic nobody handles is logged again at most this often (per relay).
UNHANDLED_LOG_EVERY = 300.0


def claim_margin(timeout: float) -> float:
    """How much longer than a call its claim must last: for clock-rate drift between the
    relay and the database, aborting the call at its deadline and recording the outcome."""
    return max(1.0, timeout / 10)


def load_handlers(spec: str) -> dict[str, Handler]:
    """Handlers from ``MODULE:ATTR``: a mapping of topic to handler, or a callable returning
    one. The current directory is importable, as for ``python -m``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(
            f"--handlers takes MODULE:ATTR (e.g. myapp.outbox:HANDLERS), got {spec!r}"
        )
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import handler module {module_name!r}: {exc}") from exc
    try:
        found = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(found) and not isinstance(found, Mapping):
        found = found()
    if not isinstance(found, Mapping):
        raise ConfigurationError(
            f"{spec} must be a mapping of topic to handler (or a function returning one), "
            f"got {type(found).__name__}"
        )
    return dict(found)


def _is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with async __call__
    )


# -- the relay -----------------------------------------------------------------------------


class Relay:
    """Deliver one schema's outbox to ``handlers`` (topic -> handler).

    ``await relay.run()`` until :meth:`stop` (or cancellation); several relays, in one
    process or many, share the work. Options (durations in seconds or like ``"10s"``):

    * ``concurrency``: handler calls in flight at once;
    * ``timeout``: per handler call; ``visibility``: how long a claim lasts (default
      ``1.5 * timeout + 5s``; at least ``timeout`` + :func:`claim_margin`), i.e. how soon a
      dead relay's messages are retried by others;
    * ``max_attempts``: attempts before a message is parked as dead;
    * ``backoff`` / ``backoff_max``: the retry delay doubles from ``backoff`` up to
      ``backoff_max``, with jitter;
    * ``poll``: longest sleep without a notification;
    * ``topics``: claim only these topics, each of which needs a handler (default: every
      topic in ``handlers``). Messages of other topics are left for the relays that handle
      them.
    * ``retention`` / ``inbox_retention``: while it runs, the relay prunes delivered messages
      older than ``retention`` and inbox claims older than ``inbox_retention`` (at least
      1d) every few minutes, in short batches (see docs/retention.md); ``None``: it does
      not prune.

    Handlers with an ``aclose()`` coroutine (the :class:`~tenure.outbox.webhook.Webhook`,
    whose HTTP client keeps connections open) are closed when :meth:`run` returns; after
    :meth:`run_once`, call :meth:`aclose`.
    """

    def __init__(
        self,
        client: AsyncClient,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = 4,
        timeout: Duration = 10.0,
        visibility: Duration | None = None,
        max_attempts: int = 10,
        backoff: Duration = 1.0,
        backoff_max: Duration = 300.0,
        poll: Duration = 5.0,
        topics: Iterable[str] | None = None,
        retention: Duration | None = DEFAULT_RETENTION,
        inbox_retention: Duration = DEFAULT_INBOX_RETENTION,
    ) -> None:
        self._client = client
        self._handlers: dict[str, Handler] = {}
        for topic, handler in handlers.items():
            check_topic(topic)
            if not callable(handler):
                raise InvalidArgument(f"handler for topic {topic!r} is not callable: {handler!r}")
            self._handlers[topic] = handler
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency must be a positive integer, got {concurrency!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.concurrency = concurrency
        self.max_attempts = max_attempts
        self.timeout = _positive(timeout, "timeout")
        self.visibility = (
            self.timeout * 1.5 + 5.0 if visibility is None else _positive(visibility, "visibility")
        )
        self.margin = claim_margin(self.timeout)
        if self.visibility < self.timeout + self.margin:
            raise InvalidArgument(
                f"visibility ({self.visibility:g}s) must exceed the handler timeout "
                f"({self.timeout:g}s) by at least {self.margin:g}s: a claim must outlast the "
                "call it covers, or a second relay could deliver the message concurrently; "
                f"raise visibility to {self.timeout + self.margin:g}s or more"
            )
        self.backoff = _positive(backoff, "backoff")
        self.backoff_max = max(self.backoff, _positive(backoff_max, "backoff_max"))
        self.poll = _positive(poll, "poll")
        self.retention = None if retention is None else Retention.of(retention, inbox_retention)
        if topics is None:
            self.topics = sorted(self._handlers)
        else:
            self.topics = sorted({check_topic(t) for t in topics})
            missing = [t for t in self.topics if t not in self._handlers]
            if missing:
                raise InvalidArgument(
                    f"topics {missing} have no handler on this relay (handlers: "
                    f"{', '.join(sorted(self._handlers)) or 'none'}); a relay claims only "
                    "topics it can deliver"
                )
        if not self.topics:
            raise InvalidArgument("a relay needs at least one topic with a handler")
        self.id = uuid.uuid4()
        self._channel = channels.channel("outbox", client.schema)
        conninfo = client._pool.conninfo
        if not isinstance(conninfo, str):  # connect_async always passes a string
            raise ConfigurationError("the relay needs a client connected with a DSN string")
        self._conninfo = conninfo
        self._wake = asyncio.Event()
        self._stopping = False
        self._inflight: set[asyncio.Task[None]] = set()
        self.delivered = 0
        self.failed = 0
        self._unhandled_logged: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<Relay {self.id} schema={self._client.schema!r} topics={sorted(self._handlers)}>"

    @property
    def handlers(self) -> dict[str, Handler]:
        return dict(self._handlers)

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once the calls in flight have finished."""
        self._stopping = True
        self._wake.set()

    async def run(self, *, ready: Callable[[], None] | None = None) -> None:
        """Claim and deliver until :meth:`stop`. ``ready`` is called once the relay listens
        for notifications (or gave up listening and polls). A relay runs once: a
        :meth:`stop` that came first (a signal during start-up) makes it return at once."""
        listening = asyncio.Event()
        listener = asyncio.create_task(
            self._listen(listening), name=f"tenure-relay-listen-{self.id}"
        )
        beater: asyncio.Task[None] | None = None
        pruner: asyncio.Task[None] | None = None
        try:
            await self._next_due()  # fails now, not after "ready", if the schema is missing
            await self._beat()
            beater = asyncio.create_task(self._beat_loop(), name=f"tenure-relay-beat-{self.id}")
            if self.retention is not None:
                pruner = asyncio.create_task(
                    prune_forever(
                        self._client, self.retention, tables=RELAY_TABLES, who=f"relay {self.id}"
                    ),
                    name=f"tenure-relay-prune-{self.id}",
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await listening.wait()
            log.info(
                "relay %s started on schema %r: topics %s, concurrency %d",
                self.id,
                self._client.schema,
                ", ".join(sorted(self._handlers)) or "(none)",
                self.concurrency,
            )
            if ready is not None:
                ready()
            await self._loop()
            # Graceful stop: let the calls in flight finish (each is bounded by its timeout).
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
        finally:
            for task in list(self._inflight):
                task.cancel()
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
            for background in (listener, pruner):
                if background is not None:
                    background.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await background
            if beater is not None:
                beater.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beater
                await asyncio.shield(self._leave())
            await self.aclose()
            log.info(
                "relay %s stopped: %d delivered, %d failed attempts",
                self.id,
                self.delivered,
                self.failed,
            )

    async def run_once(self) -> int:
        """Claim one batch (up to ``concurrency``), deliver it and wait for the outcomes;
        the number of messages claimed. For tests, scripts and cron-style draining."""
        sent = time.monotonic()
        claimed = await self._claim(self.concurrency)
        await asyncio.gather(*(self._deliver(m, sent) for m in claimed))
        return len(claimed)

    async def aclose(self) -> None:
        """Close the handlers that hold resources (``aclose()``: the webhook's connections)."""
        closed: set[int] = set()
        for handler in self._handlers.values():
            closer = getattr(handler, "aclose", None)
            if closer is not None and id(handler) not in closed:
                closed.add(id(handler))
                with contextlib.suppress(Exception):
                    await closer()

    # -- internals ---------------------------------------------------------------------------

    async def _beat(self) -> None:
        await self._client._fetch(
            "outbox_relay_beat",
            {
                "relay": self.id,
                "topics": self.topics,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "ttl": dt.timedelta(seconds=BEAT_TTL),
            },
            doing="registering the relay's topics",
            wrote=True,
        )

    async def _leave(self) -> None:
        with contextlib.suppress(DatabaseError):
            await self._client._fetch(
                "outbox_relay_leave",
                {"relay": self.id},
                doing="unregistering the relay",
                wrote=True,
            )

    async def _beat_loop(self) -> None:
        """Renew the registration, and report topics that no relay handles."""
        # Any error is logged and the loop goes on: a relay whose beat stopped would be
        # reported as gone (its topics as unhandled) while it still delivers.
        while True:
            try:
                await self._report_unhandled()
            except Exception as exc:
                log.warning("relay %s: cannot read unhandled topics (%s)", self.id, exc)
            await asyncio.sleep(BEAT_TTL / 3)
            try:
                await self._beat()
            except Exception as exc:
                log.warning("relay %s: cannot renew its registration (%s)", self.id, exc)

    async def _report_unhandled(self) -> None:
        now = time.monotonic()
        found = await unhandled_async(self._client)
        for item in found:
            last = self._unhandled_logged.get(item.topic)
            if last is not None and now - last < UNHANDLED_LOG_EVERY:
                continue
            self._unhandled_logged[item.topic] = now
            log.warning(
                "no relay handles topic %r, oldest %.1f min: %d message(s) waiting; start a "
                "relay with a handler for it (--webhook %s=URL or --handlers MODULE:ATTR)",
                item.topic,
                item.oldest_age / 60,
                item.pending,
                item.topic,
                extra={"job": item.topic, "outcome": "unhandled"},
            )
        current = {item.topic for item in found}
        for topic in list(self._unhandled_logged):
            if topic not in current:
                del self._unhandled_logged[topic]

    async def _loop(self) -> None:
        db_failures = 0
        while not self._stopping:
            self._wake.clear()
            free = self.concurrency - len(self._inflight)
            if free <= 0:
                await _wait(self._wake, self.poll)
                continue
            try:
                sent = time.monotonic()
                claimed = await self._claim(free)
                for msg in claimed:
                    self._start(msg, sent)
                due = None if claimed else await self._next_due()
                db_failures = 0
            except SchemaNotReady:
                raise  # not migrated: waiting will not help
            except DatabaseError as exc:
                db_failures += 1
                pause = min(self.poll, 0.5 * 2 ** min(db_failures, 6))
                log.warning("relay %s: cannot claim (%s); retrying in %.1fs", self.id, exc, pause)
                await _wait(self._wake, pause)
                continue
            if len(claimed) == free:
                continue  # maybe more to claim; the next turn waits for a free slot
            await _wait(self._wake, self.poll if due is None else min(self.poll, max(due, 0.01)))

    def _start(self, msg: Message, sent: float) -> None:
        task = asyncio.create_task(self._deliver(msg, sent), name=f"tenure-relay-{msg.id}")
        self._inflight.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._inflight.discard(t)
            self._wake.set()  # a free slot, and maybe the next message of an ordered key

        task.add_done_callback(done)

    async def _claim(self, limit: int) -> list[Message]:
        rows = await self._client._fetch(
            "outbox_claim",
            {
                "relay": self.id,
                "limit": limit,
                "visibility": dt.timedelta(seconds=self.visibility),
                "topics": self.topics,
            },
            doing="claiming outbox messages",
            wrote=True,
        )
        return [message_from_row(row) for row in rows]

    async def _next_due(self) -> float | None:
        rows = await self._client._fetch(
            "outbox_next_due", {"topics": self.topics}, doing="reading the next retry time"
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    async def _deliver(self, msg: Message, sent: float) -> None:
        # The claim lasts `visibility` from a database time later than `sent`; stop `margin`
        # early to absorb clock-rate drift, aborting the call and recording the outcome.
        deadline = sent + self.visibility - self.margin
        started = time.monotonic()
        handler = self._handlers.get(msg.topic)
        if handler is None:  # not claimed by this relay (claims are limited to its topics)
            await self._release(msg)
            return
        if msg.attempts > self.max_attempts:
            # Earlier claims never reported back (relay killed or stalled during delivery).
            await self._failed(
                msg,
                f"gave up after {msg.attempts - 1} attempts; the last one's claim ran out "
                f"without an outcome (relay killed or stalled). Before: {msg.last_error}",
                started,
                dead=True,
            )
            return
        budget = min(self.timeout, deadline - time.monotonic())
        if budget <= 0.01:
            await self._release(msg)
            return
        error: str | None = None
        thread: asyncio.Future[Any] | None = None
        try:
            async with asyncio.timeout(budget) as scope:
                if _is_async(handler):
                    result = await handler(msg)
                else:
                    # Shielded: the timeout must not forget a thread that goes on running.
                    thread = asyncio.ensure_future(asyncio.to_thread(handler, msg))
                    result = await asyncio.shield(thread)
                    if inspect.isawaitable(result):
                        await result
        except TimeoutError as exc:
            if scope.expired() and thread is not None and not thread.done():
                error = await self._outwait(msg, thread, budget)
            elif scope.expired():
                error = f"timed out after {budget:.3g}s"
            else:  # the handler's own timeout, not ours
                error = f"TimeoutError: {exc}" if str(exc) else "TimeoutError"
        except asyncio.CancelledError:
            # Relay stopping hard: give the claim back so another relay need not wait.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._release(msg))
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if error is None:
            await self._delivered(msg, started)
        else:
            await self._failed(msg, error, started)

    async def _outwait(
        self, msg: Message, thread: asyncio.Future[Any], budget: float
    ) -> str | None:
        """A synchronous handler ran past its timeout, and its thread cannot be stopped: keep
        the claim (renewed every third of ``visibility``) until it returns, so that no other
        attempt starts meanwhile; then its own outcome counts. None if it succeeded."""
        log.warning(
            "message %s (%s %r): the synchronous handler is still running after the %.3gs "
            "timeout; a thread cannot be interrupted, so the relay keeps the claim until it "
            "returns (give the handler its own timeout)",
            msg.id,
            msg.topic,
            msg.key,
            budget,
            extra={"job": msg.job_key, "token": msg.token},
        )
        started = time.monotonic()
        while not thread.done():
            sent = time.monotonic()
            try:
                rows = await self._client._fetch(
                    "outbox_extend",
                    {
                        "id": msg.id,
                        "relay": self.id,
                        "attempt": msg.attempts,
                        "visibility": dt.timedelta(seconds=self.visibility),
                    },
                    doing=f"keeping the claim on outbox message {msg.id}",
                    wrote=True,
                )
                if not rows:
                    log.error(
                        "relay %s: lost the claim on message %s while its synchronous handler "
                        "overran; another attempt may run concurrently",
                        self.id,
                        msg.id,
                        extra={"job": msg.job_key, "token": msg.token},
                    )
            except DatabaseError as exc:
                log.warning("relay %s: cannot keep the claim on %s (%s)", self.id, msg.id, exc)
            left = sent + self.visibility / 3 - time.monotonic()
            await asyncio.wait({thread}, timeout=max(left, 0.01))
        overran = f"ran {budget + time.monotonic() - started:.3g}s, past its {budget:.3g}s timeout"
        failure = thread.exception()
        if failure is None:
            return None
        return f"{type(failure).__name__}: {failure} (the synchronous handler {overran})"

    async def _record(self, name: str, params: dict[str, Any], msg: Message) -> list[Any] | None:
        # A few tries: a failure to record means a duplicate delivery after the claim runs
        # out (harmless with the inbox, but avoidable).
        for pause in (0.2, 1.0, None):
            try:
                rows = await self._client._fetch(
                    name, params, doing=f"recording outbox message {msg.id}", wrote=True
                )
                return rows
            except DatabaseError as exc:
                if pause is None:
                    log.error(
                        "relay %s: could not record the outcome of message %s (%s); it will "
                        "be delivered again once its claim runs out",
                        self.id,
                        msg.id,
                        exc,
                        extra={"job": msg.job_key, "token": msg.token},
                    )
                    return None
                await asyncio.sleep(pause)
        return None  # pragma: no cover

    async def _delivered(self, msg: Message, started: float) -> None:
        rows = await self._record(
            "outbox_delivered",
            {"id": msg.id, "relay": self.id, "attempt": msg.attempts, "channel": self._channel},
            msg,
        )
        elapsed = time.monotonic() - started
        if rows is not None and rows[0][0] == 0:
            metrics.emit(DELIVERY, msg.topic, "lost_claim", elapsed)
            log.warning(
                "relay %s delivered message %s (%s %r) but its claim had been taken over; "
                "it will be delivered again",
                self.id,
                msg.id,
                msg.topic,
                msg.key,
                extra={"job": msg.job_key, "token": msg.token},
            )
            return
        self.delivered += 1
        metrics.emit(DELIVERY, msg.topic, "delivered", elapsed)
        log.info(
            "delivered message %s (%s %r) on attempt %d in %.3fs",
            msg.id,
            msg.topic,
            msg.key,
            msg.attempts,
            elapsed,
            extra={"job": msg.job_key, "token": msg.token},
        )

    async def _failed(
        self, msg: Message, error: str, started: float, *, dead: bool = False
    ) -> None:
        self.failed += 1
        dead = dead or msg.attempts >= self.max_attempts
        delay = 0.0
        if not dead:
            delay = min(self.backoff_max, self.backoff * 2 ** (msg.attempts - 1))
            delay *= random.uniform(0.5, 1.0)  # jitter: relays and keys do not retry in step
        error = error[:MAX_ERROR]
        rows = await self._record(
            "outbox_failed",
            {
                "id": msg.id,
                "relay": self.id,
                "attempt": msg.attempts,
                "dead": dead,
                "error": error,
                "delay": dt.timedelta(seconds=delay),
            },
            msg,
        )
        elapsed = time.monotonic() - started
        extra = {"job": msg.job_key, "token": msg.token}
        if rows is not None and not rows:
            metrics.emit(DELIVERY, msg.topic, "lost_claim", elapsed)
            log.warning(
                "relay %s: message %s failed (%s) after its claim was taken over",
                self.id,
                msg.id,
                error,
                extra=extra,
            )
        elif dead:
            metrics.emit(DELIVERY, msg.topic, "dead", elapsed)
            log.error(
                "message %s (%s %r) parked as dead after %d attempt(s): %s%s",
                msg.id,
                msg.topic,
                msg.key,
                msg.attempts,
                error,
                ""
                if "tenure outbox retry" in error
                else f"; re-drive it with "
                f"`tenure outbox retry --id {msg.id}` once the cause is fixed",
                extra=extra,
            )
        else:
            metrics.emit(DELIVERY, msg.topic, "retry", elapsed)
            log.warning(
                "message %s (%s %r) attempt %d/%d failed: %s; retrying in %.3gs",
                msg.id,
                msg.topic,
                msg.key,
                msg.attempts,
                self.max_attempts,
                error,
                delay,
                extra=extra,
            )

    async def _release(self, msg: Message) -> None:
        with contextlib.suppress(DatabaseError):
            await self._client._fetch(
                "outbox_release",
                {"id": msg.id, "relay": self.id, "attempt": msg.attempts},
                doing=f"releasing the claim on outbox message {msg.id}",
                wrote=True,
            )

    async def _listen(self, listening: asyncio.Event) -> None:
        """LISTEN through the reconnecting loop of :mod:`tenure.db.notifier`; every
        notification, and every new LISTEN (to catch up), wakes the claim loop."""

        def listened(_reconnected: bool) -> None:
            listening.set()
            self._wake.set()  # catch up on messages committed while not listening

        def lost(exc: Exception, _pause: float) -> None:
            listening.set()  # polling still works: do not hold up the start
            log.warning(
                "relay %s: LISTEN connection failed (%s); polling every %.1fs until it is back",
                self.id,
                exc,
                self.poll,
            )

        await listen_forever(
            self._conninfo,
            [self._channel],
            lambda _note: self._wake.set(),
            application_name="tenure-relay",
            on_listening=listened,
            on_lost=lost,
            retry=Retry(most=self.poll),
        )


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


def _positive(value: Duration, what: str) -> float:
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise InvalidArgument(f"{what} must be positive, got {value!r}")
    return seconds


# -- running a relay from a plain (sync) program ---------------------------------------------


def serve(
    handlers: Mapping[str, Handler],
    *,
    dsn: str | None = None,
    schema: str = "tenure",
    ready: Callable[[Relay], None] | None = None,
    **options: Any,
) -> Relay:
    """Run a relay until SIGTERM or SIGINT (in the main thread) and return it when it has
    stopped gracefully. ``options`` are :class:`Relay`'s keyword arguments."""

    async def main() -> Relay:
        concurrency = int(options.get("concurrency", 4))
        client = await connect_async(dsn, schema=schema, pool_size=min(concurrency + 1, 16))
        async with client:
            relay = Relay(client, handlers, **options)
            loop = asyncio.get_running_loop()
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, relay.stop)
            await relay.run(ready=None if ready is None else lambda: ready(relay))
            return relay

    return asyncio.run(main())
