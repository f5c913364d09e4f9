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

Modules: :mod:`.settings` (the options, one frozen value), :mod:`.handlers` (what a handler
is), :mod:`.delivery` (steps 2 to 4 for one message), :mod:`.presence` (step 5); this one
claims (step 1), wakes on notifications (:mod:`tenure.db.notifier`) and runs the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..db import channels
from ..db.notifier import Retry, listen_forever
from ..db.pruning import prune_forever
from ..db.retention import RELAY_TABLES
from ..errors import ConfigurationError, DatabaseError, InvalidArgument, SchemaNotReady
from ..leases._async.client import AsyncClient, connect_async
from ._async.store import message_from_row
from .delivery import Delivery
from .handlers import Handler, aclose_all, checked
from .message import Message
from .presence import Presence
from .settings import RelaySettings, claim_margin

__all__ = ["Handler", "Relay", "RelaySettings", "claim_margin", "serve"]

log = logging.getLogger("tenure.relay")


class Relay:
    """Deliver one schema's outbox to ``handlers`` (topic -> handler).

    ``await relay.run()`` until :meth:`stop` (or cancellation); several relays, in one
    process or many, share the work. How it claims and delivers is a
    :class:`~tenure.outbox.settings.RelaySettings`: pass one as ``settings``, or its fields
    as keyword arguments (``Relay(client, handlers, timeout="30s")``), not both.

    Handlers with an ``aclose()`` coroutine (the :class:`~tenure.outbox.webhook.Webhook`,
    whose HTTP client keeps connections open) are closed when :meth:`run` returns; after
    :meth:`run_once`, call :meth:`aclose`.
    """

    def __init__(
        self,
        client: AsyncClient,
        handlers: Mapping[str, Handler],
        settings: RelaySettings | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and options:
            raise InvalidArgument(
                f"pass the relay's settings or its options ({', '.join(sorted(options))}), not both"
            )
        self._client = client
        self._handlers = checked(handlers)
        self.settings = RelaySettings.of(options) if settings is None else settings
        if self.settings.topics is None:
            self.topics = sorted(self._handlers)
        else:
            self.topics = list(self.settings.topics)
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
        conninfo = client.conninfo
        if conninfo is None:  # connect_async always passes a string
            raise ConfigurationError("the relay needs a client connected with a DSN string")
        self._conninfo = conninfo
        self._delivery = Delivery(client, self.id, self.settings, self._handlers, self._channel)
        self._presence = Presence(client, self.id, self.topics)
        self._wake = asyncio.Event()
        self._stopping = False
        self._inflight: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<Relay {self.id} schema={self._client.schema!r} topics={sorted(self._handlers)}>"

    @property
    def handlers(self) -> dict[str, Handler]:
        return dict(self._handlers)

    @property
    def delivered(self) -> int:
        """Messages this relay delivered (and recorded)."""
        return self._delivery.delivered

    @property
    def failed(self) -> int:
        """Failed delivery attempts of this relay."""
        return self._delivery.failed

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
            await self._presence.beat()
            beater = asyncio.create_task(
                self._presence.beat_forever(), name=f"tenure-relay-beat-{self.id}"
            )
            pruning = self.settings.pruning
            if pruning is not None:
                pruner = asyncio.create_task(
                    prune_forever(
                        self._client, pruning, tables=RELAY_TABLES, who=f"relay {self.id}"
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
                self.settings.concurrency,
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
                await asyncio.shield(self._presence.leave())
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
        claimed = await self._claim(self.settings.concurrency)
        await asyncio.gather(*(self._delivery.deliver(m, sent) for m in claimed))
        return len(claimed)

    async def aclose(self) -> None:
        """Close the handlers that hold resources (``aclose()``: the webhook's connections)."""
        await aclose_all(self._handlers)

    # -- internals ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        db_failures = 0
        while not self._stopping:
            self._wake.clear()
            free = self.settings.concurrency - len(self._inflight)
            if free <= 0:
                await _wait(self._wake, self.settings.poll)
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
                pause = min(self.settings.poll, 0.5 * 2 ** min(db_failures, 6))
                log.warning("relay %s: cannot claim (%s); retrying in %.1fs", self.id, exc, pause)
                await _wait(self._wake, pause)
                continue
            if len(claimed) == free:
                continue  # maybe more to claim; the next turn waits for a free slot
            await _wait(
                self._wake,
                self.settings.poll if due is None else min(self.settings.poll, max(due, 0.01)),
            )

    def _start(self, msg: Message, sent: float) -> None:
        task = asyncio.create_task(self._delivery.deliver(msg, sent), name=f"tenure-relay-{msg.id}")
        self._inflight.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._inflight.discard(t)
            self._wake.set()  # a free slot, and maybe the next message of an ordered key

        task.add_done_callback(done)

    async def _claim(self, limit: int) -> list[Message]:
        rows = await self._client.fetch(
            "outbox_claim",
            {
                "relay": self.id,
                "limit": limit,
                "visibility": dt.timedelta(seconds=self.settings.claim_ttl),
                "topics": self.topics,
            },
            doing="claiming outbox messages",
            wrote=True,
        )
        return [message_from_row(row) for row in rows]

    async def _next_due(self) -> float | None:
        rows = await self._client.fetch(
            "outbox_next_due", {"topics": self.topics}, doing="reading the next retry time"
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

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
                self.settings.poll,
            )

        await listen_forever(
            self._conninfo,
            [self._channel],
            lambda _note: self._wake.set(),
            application_name="tenure-relay",
            on_listening=listened,
            on_lost=lost,
            retry=Retry(most=self.settings.poll),
        )


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


# -- running a relay from a plain (sync) program ---------------------------------------------


def serve(
    handlers: Mapping[str, Handler],
    *,
    dsn: str | None = None,
    schema: str = "tenure",
    ready: Callable[[Relay], None] | None = None,
    settings: RelaySettings | None = None,
    **options: Any,
) -> Relay:
    """Run a relay until SIGTERM or SIGINT (in the main thread) and return it when it has
    stopped gracefully. ``settings`` (or its fields as ``options``) as for :class:`Relay`."""
    if settings is None:
        settings = RelaySettings.of(options)
    elif options:
        raise InvalidArgument(
            f"pass the relay's settings or its options ({', '.join(sorted(options))}), not both"
        )
    chosen = settings

    async def main() -> Relay:
        pool_size = min(chosen.concurrency + 1, 16)
        client = await connect_async(dsn, schema=schema, pool_size=pool_size)
        async with client:
            relay = Relay(client, handlers, chosen)
            loop = asyncio.get_running_loop()
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, relay.stop)
            await relay.run(ready=None if ready is None else lambda: ready(relay))
            return relay

    return asyncio.run(main())
