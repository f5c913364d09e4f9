"""Fenced transactions: bind a caller's writes to the fencing token, in the caller's own
transaction.

Why it is safe (strict mode, the default; details in docs/safety.md):

* ``fence()`` updates the job-state row only if the caller's token is the newest takeover and
  its lease is unexpired by the database clock. The update's row lock lasts until the
  caller's transaction ends.
* A takeover updates the same row in the same statement that issues the new token, so it
  waits for the predecessor's open fenced transaction (bounded by the contender's
  lock_timeout). Once the takeover has committed, the predecessor's ``fence()`` matches zero
  rows, even if the successor has written nothing yet, and raises :class:`StaleTokenError`.
* Under READ COMMITTED, if the takeover commits while ``fence()`` waits for the row lock,
  PostgreSQL re-evaluates the WHERE clause on the new row version (EvalPlanQual): the token
  no longer matches, so the fence fails rather than succeeding on the old version.
* Renewals do not touch the job-state row, so a holder's long fenced transaction never
  starves its own renewals.
* ``fence()`` sets ``idle_in_transaction_session_timeout`` for the rest of the transaction
  (default: the lease TTL), so a holder paused inside its transaction is disconnected by the
  server and cannot block a successor for longer than that.

Relaxed mode (``strict=False``) is for data in a database that has no lease table: the
seed's rule, the last accepted token per key, in that database's ``job_state`` table.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus

from ... import metrics
from ...db.queries import query
from ...errors import (
    InvalidArgument,
    InvalidArgumentType,
    StaleTokenError,
    TenureError,
    one_line,
    translate,
)
from ...validation import (
    Duration,
    check_connection,
    check_job_key,
    check_schema,
    check_token,
    parse_duration,
)

if TYPE_CHECKING:
    from .client import AsyncClient

log = logging.getLogger("tenure.fencing")

#: idle_in_transaction_session_timeout is an int of milliseconds: at most 2**31 - 1 ms.
MAX_IDLE_TIMEOUT = (2**31 - 1) // 1000


async def fence_async(
    conn: AsyncConnection[Any],
    job_key: str,
    token: int,
    *,
    schema: str = "tenure",
    strict: bool = True,
    idle_timeout: Duration | bool | None = None,
    client: AsyncClient | None = None,
) -> None:
    """Fence the caller's current transaction on ``conn`` with ``token``.

    Call it inside your transaction, before or after your other writes: they commit only if
    the token is still the newest. Raises :class:`StaleTokenError` when it is not; roll the
    transaction back then (leaving a ``with conn.transaction():`` block by the exception
    does). ``idle_timeout``: how long the server lets this transaction sit idle before ending
    it (default: the lease TTL; ``False`` leaves the session's setting alone).
    ``client``: the tenure client of this schema, if you have one: a refusal is then
    recorded as a lease event for the key's timeline on the dashboard (a separate statement
    from its pool, on the refusal path only; ``client.fenced()`` records its own refusals,
    once its transaction has rolled back and given its connection back).
    """
    check_connection(conn, AsyncConnection, what="fence()")
    check_job_key(job_key)
    check_token(token)
    check_schema(schema)
    if conn.autocommit and conn.pgconn.transaction_status == TransactionStatus.IDLE:
        raise InvalidArgument(
            "fence() must run inside your transaction, but the connection is in autocommit "
            "mode outside a transaction block: wrap it in `with conn.transaction():`"
        )
    if idle_timeout is True:
        # A bool where a duration belongs: the wrong type (True would read as 1 second).
        raise InvalidArgumentType("idle_timeout=True means nothing: pass a duration, None or False")
    set_idle = idle_timeout is not False
    idle = (
        None
        if idle_timeout is None or idle_timeout is False
        else parse_duration(idle_timeout, what="idle_timeout")
    )
    if idle is not None and not 0 < idle <= MAX_IDLE_TIMEOUT:
        # 0 would switch the server's timeout off: pass False to leave the setting alone.
        raise InvalidArgument(
            f"idle_timeout {idle_timeout!r} must be more than 0 and at most "
            f"{MAX_IDLE_TIMEOUT}s (about 24 days, PostgreSQL's limit); pass False to leave "
            "the session's setting alone"
        )
    params = {
        "job_key": job_key,
        "token": token,
        "set_idle": set_idle,
        "idle": None if idle is None else dt.timedelta(seconds=idle),
    }
    name = "fence" if strict else "fence_relaxed"
    try:
        cur = await conn.execute(query(schema, name), params)
        row = await cur.fetchone()
    except psycopg.Error as exc:
        raise translate(exc, f"fencing {job_key!r} with token {token}") from exc
    assert row is not None  # the statement always returns one row
    if row[0] is None:
        metrics.emit(metrics.STALE, job_key, "fence")
        if client is not None and client.schema == schema:
            await record_refused(client, job_key, token, "fence")
        raise StaleTokenError(job_key, token, row[2], site="fence")


async def record_refused(client: AsyncClient, job_key: str, token: int, detail: str) -> None:
    """Record a refused write of ``token`` (migration 18's lease events), in autocommit on
    ``client``'s pool. The refusal stands whatever happens here: a failure (a schema before
    version 18, a role without INSERT, the database gone) is logged and the caller raises its
    StaleTokenError as before."""
    try:
        await client.fetch(
            "lease_event_refused",
            {"job_key": job_key, "token": token, "detail": detail},
            doing=f"recording the refused write of {job_key!r} with token {token}",
            wrote=True,
        )
    except TenureError as exc:
        log.debug("could not record a refused write of %r: %s", job_key, one_line(str(exc)))
