"""Delivering one claimed message: call its handler within the claim, then record the
outcome (steps 2 to 4 of the protocol in :mod:`tenure.outbox.relay`).

The handler runs for at most ``min(timeout, time left on the claim minus a margin)``,
measured on the relay's monotonic clock from *before* the claim was sent. An async handler
is cancelled at that deadline; a synchronous one runs in a thread, which cannot be
interrupted, so past its timeout the claim is renewed until the thread returns and the
thread's own outcome is recorded. Only the claim that delivered a message marks it
delivered; a failure backs off exponentially with jitter, and after ``max_attempts`` the
message is parked as dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
import random
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .. import metrics, tracing
from ..errors import DatabaseError
from ..leases._async.client import AsyncClient
from .handlers import Handler, is_async
from .message import Message
from .settings import RelaySettings

log = logging.getLogger("tenure.relay")

#: Longest error text recorded on a message.
MAX_ERROR = 2000


class Delivery:
    """Delivers the messages one relay claimed, and counts the outcomes."""

    def __init__(
        self,
        client: AsyncClient,
        relay: uuid.UUID,
        settings: RelaySettings,
        handlers: Mapping[str, Handler],
        channel: str,
    ) -> None:
        self._client = client
        self._relay = relay
        self._settings = settings
        self._handlers = handlers
        self._channel = channel
        self.delivered = 0
        self.failed = 0

    async def deliver(self, msg: Message, sent: float) -> None:
        """Deliver ``msg``, claimed by a statement sent at ``sent`` (monotonic clock)."""
        settings = self._settings
        # The claim lasts `visibility` from a database time later than `sent`; stop `margin`
        # early to absorb clock-rate drift, aborting the call and recording the outcome.
        deadline = sent + settings.claim_ttl - settings.margin
        started = time.monotonic()
        handler = self._handlers.get(msg.topic)
        if handler is None:  # not claimed by this relay (claims are limited to its topics)
            await self.release(msg)
            return
        if msg.attempts > settings.max_attempts:
            # Earlier claims never reported back (relay killed or stalled during delivery).
            await self._failed(
                msg,
                f"gave up after {msg.attempts - 1} attempts; the last one's claim ran out "
                f"without an outcome (relay killed or stalled). Before: {msg.last_error}",
                started,
                dead=True,
            )
            return
        budget = min(settings.timeout, deadline - time.monotonic())
        if budget <= 0.01:
            await self.release(msg)
            return
        attributes = {
            "tenure.topic": msg.topic,
            "tenure.message_id": msg.id,
            "tenure.attempt": msg.attempts,
            "tenure.job_key": msg.job_key,
            "tenure.token": msg.token,
        }
        # A child of the span that enqueued the message (its stored traceparent).
        with tracing.span("tenure.outbox.deliver", attributes, parent=msg.traceparent) as span:
            error, final = await self._call(msg, handler, budget)
            span.outcome("delivered" if error is None else "failed", error)
        if error is None:
            await self._delivered(msg, started)
        else:
            await self._failed(msg, error, started, dead=final)

    async def _call(self, msg: Message, handler: Handler, budget: float) -> tuple[str | None, bool]:
        """Call the handler for at most ``budget`` seconds: (None, False) if it succeeded,
        else the error to record and whether it is final (an exception with ``final=True``,
        e.g. a webhook's 400: dead at once, not retried)."""
        error: str | None = None
        final = False
        thread: asyncio.Future[Any] | None = None
        try:
            async with asyncio.timeout(budget) as scope:
                if is_async(handler):
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
                await asyncio.shield(self.release(msg))
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            final = getattr(exc, "final", False) is True
        return error, final

    async def release(self, msg: Message) -> None:
        """Give the claim on ``msg`` back, uncounted (best effort)."""
        with contextlib.suppress(DatabaseError):
            await self._client.fetch(
                "outbox_release",
                {"id": msg.id, "relay": self._relay, "attempt": msg.attempts},
                doing=f"releasing the claim on outbox message {msg.id}",
                wrote=True,
            )

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
        visibility = self._settings.claim_ttl
        started = time.monotonic()
        while not thread.done():
            sent = time.monotonic()
            try:
                rows = await self._client.fetch(
                    "outbox_extend",
                    {
                        "id": msg.id,
                        "relay": self._relay,
                        "attempt": msg.attempts,
                        "visibility": dt.timedelta(seconds=visibility),
                    },
                    doing=f"keeping the claim on outbox message {msg.id}",
                    wrote=True,
                )
                if not rows:
                    log.error(
                        "relay %s: lost the claim on message %s while its synchronous handler "
                        "overran; another attempt may run concurrently",
                        self._relay,
                        msg.id,
                        extra={"job": msg.job_key, "token": msg.token},
                    )
            except DatabaseError as exc:
                log.warning("relay %s: cannot keep the claim on %s (%s)", self._relay, msg.id, exc)
            left = sent + visibility / 3 - time.monotonic()
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
                rows = await self._client.fetch(
                    name, params, doing=f"recording outbox message {msg.id}", wrote=True
                )
                return rows
            except DatabaseError as exc:
                if pause is None:
                    log.error(
                        "relay %s: could not record the outcome of message %s (%s); it will "
                        "be delivered again once its claim runs out",
                        self._relay,
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
            {"id": msg.id, "relay": self._relay, "attempt": msg.attempts, "channel": self._channel},
            msg,
        )
        elapsed = time.monotonic() - started
        if rows is not None and rows[0][0] == 0:
            metrics.delivery(msg.topic, "lost_claim", elapsed)
            log.warning(
                "relay %s delivered message %s (%s %r) but its claim had been taken over; "
                "it will be delivered again",
                self._relay,
                msg.id,
                msg.topic,
                msg.key,
                extra={"job": msg.job_key, "token": msg.token},
            )
            return
        self.delivered += 1
        metrics.delivery(msg.topic, "delivered", elapsed)
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
        settings = self._settings
        self.failed += 1
        dead = dead or msg.attempts >= settings.max_attempts
        delay = 0.0
        if not dead:
            delay = min(settings.backoff_max, settings.backoff * 2 ** (msg.attempts - 1))
            delay *= random.uniform(0.5, 1.0)  # jitter: relays and keys do not retry in step
        error = error[:MAX_ERROR]
        rows = await self._record(
            "outbox_failed",
            {
                "id": msg.id,
                "relay": self._relay,
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
            metrics.delivery(msg.topic, "lost_claim", elapsed)
            log.warning(
                "relay %s: message %s failed (%s) after its claim was taken over",
                self._relay,
                msg.id,
                error,
                extra=extra,
            )
        elif dead:
            metrics.delivery(msg.topic, "dead", elapsed)
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
            metrics.delivery(msg.topic, "retry", elapsed)
            log.warning(
                "message %s (%s %r) attempt %d/%d failed: %s; retrying in %.3gs",
                msg.id,
                msg.topic,
                msg.key,
                msg.attempts,
                settings.max_attempts,
                error,
                delay,
                extra=extra,
            )
