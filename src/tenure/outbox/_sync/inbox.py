# WARNING: this file is generated from src/tenure/outbox/_async/inbox.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""The inbox: a consumer applies each message once, however often it is delivered.

Delivery is at least once (a relay may die after the handler ran and before it recorded the
delivery; a webhook may answer after the relay gave up). The consumer claims the message's
business key in the same transaction as its side effect: the claim and the effect commit
together or not at all, and a second delivery finds the claim and skips the effect::

    with conn.transaction():
        if tenure.inbox.claim_header(conn, "billing", request.headers["Idempotency-Key"]):
            conn.execute("INSERT INTO invoices ...")

:func:`claim_header` takes the webhook's ``Idempotency-Key`` header as it arrives (see
:func:`tenure.outbox.idempotency_key` for its format); :func:`claim` takes any key of yours.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from psycopg import Connection
from psycopg.pq import TransactionStatus

from ...db.queries import query
from ...errors import InvalidArgument, mapped
from ...validation import check_connection, check_schema, check_text
from ..message import idempotency_key, parse_idempotency_key

log = logging.getLogger("tenure.inbox")
MAX_CONSUMER = 200
MAX_KEY = 1000


def claim(conn: Connection[Any], consumer: str, key: str, *, schema: str = "tenure") -> bool:
    """Claim ``key`` for ``consumer`` in the caller's current transaction on ``conn``.

    True: first time, apply the side effect in this transaction. False: already applied by
    a committed transaction, skip it. A concurrent claim of the same key waits for the
    first transaction, then returns False if it committed (True if it rolled back).
    ``consumer`` names the applying party, so two consumers of one message each apply it.
    """
    check_connection(conn, Connection, what="claim()")
    check_text(consumer, what="consumer", max_chars=MAX_CONSUMER)
    check_text(key, what="inbox key", max_chars=MAX_KEY, blank_ok=True)
    check_schema(schema)
    # Outside a transaction the claim would commit on its own, before the side effect: a
    # failure in between would lose the message for good.
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise InvalidArgument(
            "claim() must run inside your transaction, together with the side effect, but "
            "the connection is in autocommit mode outside a transaction block: wrap both in "
            "`with conn.transaction():`"
        )
    with mapped(f"claiming inbox key {key!r} for {consumer!r}"):
        cur = conn.execute(query(schema, "inbox_claim"), {"consumer": consumer, "key": key})
        row = cur.fetchone()
    first = row is not None
    if not first:
        log.info("inbox %r: %r already applied, skipping", consumer, key)
    return first


def claim_header(
    conn: Connection[Any], consumer: str, header: str, *, schema: str = "tenure"
) -> bool:
    """:func:`claim` for the webhook's ``Idempotency-Key`` header, as it arrives.

    The header is checked (a malformed one raises :class:`~tenure.InvalidArgument`) and
    claimed in its canonical form, so escapes in another case (a proxy's rewrite) still find
    the claim. A header longer than the inbox's key column (a long non-ASCII key) is claimed
    as ``#sha256:`` and its digest; ``#`` never starts a header, so the two never meet.
    """
    key = idempotency_key(*parse_idempotency_key(header))
    if len(key) > MAX_KEY:
        key = "#sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return claim(conn, consumer, key, schema=schema)
