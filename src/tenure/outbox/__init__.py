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

A relay (``tenure relay``, or :class:`tenure.outbox.relay.Relay` inside a worker) delivers committed
messages at least once. Consumers make that *exactly once* in effect with
:func:`tenure.inbox.claim`, keyed by the message's business key.

``key`` is the business key: enqueuing the same ``(topic, key)`` twice keeps one message (the
first), so a retried job or a second executor of the same slot cannot send twice.
``order_key`` groups messages that must be delivered one at a time in enqueue order (for
example the job key, or an entity id): a message waits while an older message of the same
``(topic, order_key)`` is undelivered, including a dead one (re-drive or purge it).

Layout: :mod:`.message` (the value), ``_async/store.py`` (enqueue and the operator functions;
``_sync`` is generated), :mod:`.inbox` (the consumer's side), :mod:`.relay` (delivery) and
:mod:`.webhook` (the built-in HTTP handler).

Operator functions (``messages``, ``counts``, ``unhandled``, ``retry``, ``purge``) take a
client; their
``*_async`` twins take an :class:`~tenure.AsyncClient`.
"""

from __future__ import annotations

# The functions are defined once, as asyncio code, in _async/store.py; _sync/store.py is
# generated from it.
from ..db import channels
from ._async.store import (
    counts_async,
    enqueue_async,
    messages_async,
    purge_async,
    retry_async,
    unhandled_async,
)
from ._sync.store import counts, enqueue, messages, purge, retry, unhandled
from .message import (
    STATES,
    Message,
    State,
    UnhandledTopic,
    idempotency_key,
    parse_idempotency_key,
)


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel a schema's outbox notifies at commit (public; the one rule
    for every channel name is :func:`tenure.db.channels.channel`)."""
    return channels.channel("outbox", schema)


__all__ = [
    "STATES",
    "Message",
    "State",
    "UnhandledTopic",
    "channel",
    "counts",
    "counts_async",
    "enqueue",
    "enqueue_async",
    "idempotency_key",
    "messages",
    "messages_async",
    "parse_idempotency_key",
    "purge",
    "purge_async",
    "retry",
    "retry_async",
    "unhandled",
    "unhandled_async",
]
