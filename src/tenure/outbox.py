"""The transactional outbox: side effects outside PostgreSQL, decided inside a fenced transaction.

A fence protects what lives in PostgreSQL; an e-mail, a webhook or a payment cannot compare
tokens. So the executor does not call the outside world itself: it *enqueues* a message in
the same transaction as its fence and its other writes. The message exists if and only if
that transaction commits, so a stale executor, whose fence fails and whose transaction rolls
back, leaves no message behind::

    with conn.transaction():
        tenure.fence(conn, "nightly-report", lease.token)
        conn.execute("INSERT INTO reports ...")
        tenure.outbox.enqueue(conn, "report.ready", "nightly-report:2024-06-01",
                              {"url": "..."}, job_key="nightly-report", token=lease.token)

A relay (``tenure relay``, or :class:`tenure.relay.Relay` inside a worker) delivers committed
messages at least once. Consumers make that *exactly once* in effect with
:func:`tenure.inbox.claim`, keyed by the message's business key.

``key`` is the business key: enqueuing the same ``(topic, key)`` twice keeps one message (the
first), so a retried job or a second executor of the same slot cannot send twice.
``order_key`` groups messages that must be delivered one at a time in enqueue order (for
example the job key, or an entity id): a message waits while an older message of the same
``(topic, order_key)`` is undelivered, including a dead one (re-drive or purge it).

Operator functions (``messages``, ``counts``, ``retry``, ``purge``) take a client; their
``*_async`` twins take an :class:`~tenure.AsyncClient`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["pending", "delivered", "dead"]
STATES: tuple[State, ...] = ("pending", "delivered", "dead")


@dataclass(frozen=True, slots=True)
class Message:
    """One outbox message as the database saw it (times are database times).

    ``attempts`` counts claims by relays, including the one delivering it now (a handler sees
    1 on the first delivery). ``token`` and ``job_key`` say which fenced execution enqueued
    it, when the caller passed them.
    """

    id: int
    topic: str
    key: str
    payload: Any
    order_key: str | None
    job_key: str | None
    token: int | None
    state: State
    attempts: int
    created_at: dt.datetime
    available_at: dt.datetime
    last_error: str | None
    last_attempt_at: dt.datetime | None
    delivered_at: dt.datetime | None
    claimed_until: dt.datetime | None

    @property
    def idempotency_key(self) -> str:
        """``topic:key``: what a consumer deduplicates on (the webhook's Idempotency-Key)."""
        return f"{self.topic}:{self.key}"


# The functions are defined once, as asyncio code, in _async/outbox.py; _sync/outbox.py is
# generated from it. Imported after Message, which they build their return values from.
from ._async.outbox import (  # noqa: E402
    channel,
    counts_async,
    enqueue_async,
    messages_async,
    purge_async,
    retry_async,
)
from ._sync.outbox import counts, enqueue, messages, purge, retry  # noqa: E402

__all__ = [
    "STATES",
    "Message",
    "State",
    "channel",
    "counts",
    "counts_async",
    "enqueue",
    "enqueue_async",
    "messages",
    "messages_async",
    "purge",
    "purge_async",
    "retry",
    "retry_async",
]
