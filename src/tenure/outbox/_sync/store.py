# WARNING: this file is generated from src/tenure/outbox/_async/store.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""The outbox: enqueue inside the caller's (fenced) transaction; list, re-drive and purge.

``enqueue`` is one statement on the caller's connection: the INSERT and its ``pg_notify``
belong to the caller's transaction, so the message and the relays' wake-up exist only if it
commits. The fence is the caller's own ``fence()`` call in the same transaction; ``job_key``
and ``token`` are recorded for audits only.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from psycopg import Connection
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from ... import tracing
from ...db import channels
from ...db.queries import query
from ...errors import InvalidArgument, InvalidArgumentType, mapped
from ...validation import (
    MAX_BIGINT,
    Duration,
    check_connection,
    check_int,
    check_job_key,
    check_schema,
    check_text,
    check_token,
    parse_duration,
    to_json,
)
from ..message import STATES, Message, UnhandledTopic

if TYPE_CHECKING:
    from ...leases._sync.client import Client
log = logging.getLogger("tenure.outbox")
MAX_TOPIC = 200
MAX_KEY = 500
MAX_LIMIT = 100000
# ASCII and fullmatch: "$" would accept a trailing newline, \w any Unicode letter.
_TOPIC = re.compile("[\\w.:/-]+", re.ASCII)


def check_topic(topic: object) -> str:
    """A topic names a handler: letters, digits and ``_ . : / -`` (no ``=`` or spaces, so
    ``--webhook TOPIC=URL`` stays unambiguous)."""
    if not isinstance(topic, str):
        raise InvalidArgumentType(f"topic must be a string, got {type(topic).__name__}")
    if not _TOPIC.fullmatch(topic) or len(topic) > MAX_TOPIC:
        raise InvalidArgument(
            f"topic must be 1 to {MAX_TOPIC} characters of letters, digits and _ . : / -, "
            f"got {topic!r}"
        )
    return topic


def check_key(key: object, *, what: str = "key") -> str:
    return check_text(key, what=what, max_chars=MAX_KEY)


def _check_in_transaction(conn: Connection[Any], what: str) -> None:
    # In autocommit mode outside a transaction block the statement would commit on its own:
    # the message would exist even if the caller's fenced work then rolled back.
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise InvalidArgument(
            f"{what} must run inside your transaction, but the connection is in autocommit "
            "mode outside a transaction block: wrap it in `with conn.transaction():`"
        )


def enqueue(
    conn: Connection[Any],
    topic: str,
    key: str,
    payload: Any,
    *,
    order_key: str | None = None,
    job_key: str | None = None,
    token: int | None = None,
    schema: str = "tenure",
) -> bool:
    """Add a message to the outbox in the caller's current transaction on ``conn``.

    The message is delivered only if that transaction commits. Returns True for a new
    message, False when ``(topic, key)`` was already enqueued (the first message is kept,
    ``payload`` is ignored). ``payload`` must be JSON-serialisable (checked before any SQL).
    ``order_key``: messages of one ``(topic, order_key)`` are delivered one at a time, in
    order. ``job_key`` and ``token`` (both or neither) record which fenced execution
    enqueued the message; call ``fence()`` in the same transaction for the fence itself.
    """
    check_connection(conn, Connection, what="enqueue()")
    check_topic(topic)
    check_key(key)
    if order_key is not None:
        check_key(order_key, what="order_key")
    if (job_key is None) != (token is None):
        raise InvalidArgument(
            "pass job_key and token together (the fenced execution that enqueues), or neither"
        )
    if job_key is not None:
        check_job_key(job_key)
        check_token(token)
    check_schema(schema)
    text = to_json(payload)
    _check_in_transaction(conn, "enqueue()")
    params = {
        "topic": topic,
        "key": key,
        "payload": Jsonb(text, dumps=_identity),
        "order_key": order_key,
        "job_key": job_key,
        "token": token,
        "channel": channels.channel("outbox", schema),
        "traceparent": tracing.traceparent(),
    }
    with mapped(f"enqueuing {topic!r} message {key!r}"):
        cur = conn.execute(query(schema, "outbox_enqueue"), params)
        row = cur.fetchone()
    assert row is not None  # the statement always returns one row
    new = row[0] is not None
    log.debug(
        "outbox %s %r message %r",
        "enqueued" if new else "already holds",
        topic,
        key,
        extra={"job": job_key, "token": token},
    )
    return new


def _states(state: str | Iterable[str] | None) -> list[str]:
    if state is None:
        return ["pending", "dead"]
    if not isinstance(state, str) and (not hasattr(state, "__iter__")):
        raise InvalidArgumentType(f"state must be a string or a list of them, got {state!r}")
    wanted = [state] if isinstance(state, str) else list(state)
    if wanted == ["all"]:
        return list(STATES)
    bad = [s for s in wanted if s not in STATES]
    if bad or not wanted:
        raise InvalidArgument(f"state must be one of {', '.join(STATES)} (or 'all'), got {bad}")
    return wanted


def _ids(ids: Iterable[int] | None) -> list[int] | None:
    if ids is None:
        return None
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise InvalidArgumentType(f"ids must be a list of message ids, got {ids!r}")
    return [check_int(i, what="message id", minimum=1, maximum=MAX_BIGINT) for i in ids]


def messages(
    client: Client,
    *,
    state: str | Iterable[str] | None = None,
    topic: str | None = None,
    ids: Iterable[int] | None = None,
    limit: int = 100,
) -> list[Message]:
    """Outbox messages in id order. ``state``: ``"pending"``, ``"delivered"``, ``"dead"``, a
    list of them or ``"all"`` (default: pending and dead, i.e. not yet delivered)."""
    if topic is not None:
        check_topic(topic)
    check_int(limit, what="limit", minimum=1, maximum=MAX_LIMIT)
    rows = client.fetch(
        "outbox_list",
        {"states": _states(state), "topic": topic, "ids": _ids(ids), "limit": limit},
        doing="listing outbox messages",
    )
    return [message_from_row(row) for row in rows]


def counts(client: Client) -> dict[str, int]:
    """Number of messages per state (every state present, zero if none)."""
    rows = client.fetch("outbox_counts", {}, doing="counting outbox messages")
    found = {state: int(n) for state, n in rows}
    return {state: found.get(state, 0) for state in ("pending", "delivered", "dead")}


def unhandled(client: Client) -> list[UnhandledTopic]:
    """Topics with pending messages that no live relay handles, with how many and the age of
    the oldest: such messages wait (they are never claimed, so never parked) until a relay with a
    handler for their topic starts. A relay is live while it beats (see ``tenure relay``);
    one killed without stopping still counts for its last beat's lifetime."""
    rows = client.fetch("outbox_unhandled", {}, doing="reading unhandled outbox topics")
    return [UnhandledTopic(topic, int(n), float(age)) for topic, n, age in rows]


def retry(
    client: Client, *, ids: Iterable[int] | None = None, topic: str | None = None
) -> list[int]:
    """Re-drive dead messages (all of them, or those with these ids / this topic): they
    become pending now with a fresh attempt budget, and the relays are woken. Returns the
    ids re-driven."""
    if topic is not None:
        check_topic(topic)
    rows = client.fetch(
        "outbox_retry",
        {"ids": _ids(ids), "topic": topic, "channel": channels.channel("outbox", client.schema)},
        doing="re-driving dead outbox messages",
        wrote=True,
    )
    redriven: list[int] = list(rows[0][0])
    if redriven:
        log.info("outbox: re-drove %d dead message(s): %s", len(redriven), redriven)
    return redriven


def purge(
    client: Client,
    *,
    older_than: Duration,
    state: str = "delivered",
    ids: Sequence[int] | None = None,
    topic: str | None = None,
) -> int:
    """Delete delivered (or, with ``state="dead"``, dead) messages whose last event is older
    than ``older_than`` (database clock). Returns how many were deleted.

    Pending messages are never purged. A purged message no longer deduplicates: enqueuing
    its ``(topic, key)`` again creates a new message, so keep delivered messages for longer
    than a duplicate enqueue can happen.
    """
    if not isinstance(state, str) or state not in ("delivered", "dead"):
        raise InvalidArgument(
            f"only delivered or dead messages can be purged, got state {state!r}; pending "
            "messages are never deleted (re-drive or wait for them instead)"
        )
    age = parse_duration(older_than, what="older_than")
    if topic is not None:
        check_topic(topic)
    rows = client.fetch(
        "outbox_purge",
        {"state": state, "older_than": dt.timedelta(seconds=age), "ids": _ids(ids), "topic": topic},
        doing=f"purging {state} outbox messages",
        wrote=True,
    )
    purged = int(rows[0][0])
    if purged:
        log.info("outbox: purged %d %s message(s)", purged, state)
    return purged


def message_from_row(row: Sequence[Any]) -> Message:
    return Message(*row)


def _identity(text: str) -> str:
    return text
