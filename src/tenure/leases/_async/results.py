"""The fenced result store: the seed's ``report_results`` with its conditional upsert."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from ... import metrics
from ...errors import StaleTokenError, TokenNotIssued, translate
from ...validation import check_connection, check_job_key, check_token, to_json
from ..models import Result
from ..rows import ResultRow

if TYPE_CHECKING:
    from .client import AsyncClient

log = logging.getLogger("tenure.results")


class AsyncResults:
    """``client.results``: the last result per job key and the token that wrote it."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def put(
        self,
        job_key: str,
        payload: Any,
        *,
        token: int,
        conn: AsyncConnection[Any] | None = None,
        strict: bool = False,
    ) -> Result:
        """Store ``payload`` for ``job_key`` if ``token`` is not older than the stored one.

        The seed's rule (default): the last accepted token wins; a retry with the same token
        (e.g. after a lost commit acknowledgement) is accepted, and so is a write by a holder
        whose lease expired, as long as no newer token has *written* yet. ``strict=True``
        applies the rule :func:`~tenure.fence` applies: the write is accepted only while
        ``token`` is the newest takeover and its lease is unexpired by the database clock,
        so once a successor has taken over (or the lease has expired) it is refused, even
        before the successor writes anything. Use it when the writer holds the lease in this
        database (tenure does, for ``ctx.results.put`` and ``tenure result put`` inside
        ``tenure exec``); keep the default where only the token travels (another process,
        a queue) and the lease may legitimately be gone when the write lands.

        Zero affected rows is a failure: :class:`StaleTokenError` names both tokens. Pass
        ``conn`` to write inside your own transaction; with ``strict=True`` the fence row
        stays locked until that transaction ends, as after ``fence(conn, ...)``.
        """
        check_job_key(job_key)
        check_token(token)
        if conn is not None:
            check_connection(conn, AsyncConnection, what="results.put(conn=...)")
        text = to_json(payload)
        params = {"job_key": job_key, "payload": Jsonb(text, dumps=_identity), "token": token}
        if strict:
            params["set_idle"] = conn is not None
        name = "result_put_strict" if strict else "result_put"
        doing = f"storing the result of {job_key!r} with token {token}"
        if conn is None:
            rows = await self._client.fetch(name, params, doing=doing, wrote=True)
            row = rows[0]
        else:
            # In the caller's transaction nothing commits here; in autocommit it does.
            idle = conn.pgconn.transaction_status == TransactionStatus.IDLE
            try:
                cur = await conn.execute(self._client._queries[name], params)
                fetched = await cur.fetchone()
            except psycopg.Error as exc:
                raise translate(exc, doing, wrote=idle) from exc
            assert fetched is not None
            row = fetched
        applied, written_at, current, issued = row
        if applied is None:
            if issued is None or issued < token:
                raise TokenNotIssued(job_key, token, issued)
            ended = None
            if strict:
                # Refused by the fence: the newest takeover's token says why, or, when that
                # is still ours, how our lease ended.
                current = issued
                if issued == token:
                    ended = await self._lease_ended(job_key)
            metrics.emit(metrics.STALE, job_key, "result")
            extra = {"job": job_key, "token": token, "current_token": current}
            if ended is None:
                log.warning(
                    "%s result write for %r rejected: token %s, current token %s",
                    "strict" if strict else "stale",
                    job_key,
                    token,
                    current,
                    extra=extra,
                )
            else:
                log.warning(
                    "strict result write for %r rejected: the lease of token %s was %s (no "
                    "newer token has taken over)",
                    job_key,
                    token,
                    ended,
                    extra=extra,
                )
            raise StaleTokenError(job_key, token, current, site="result", lease_ended=ended)
        return Result(job_key, payload, applied, written_at)

    async def _lease_ended(self, job_key: str) -> str:
        """ "released" or "expired": how the lease of the newest token ended. A release (or
        `tenure release`) moves its end before the last renewal + TTL; an expiry leaves it
        there (the two clock readings of one renewal differ by microseconds, not 1 ms)."""
        info = await self._client.inspect(job_key)
        if info is not None and info.expires_at < info.renewed_at + info.ttl - _CLOCK_SLACK:
            return "released"
        return "expired"

    async def get(self, job_key: str) -> Result | None:
        """The stored result for ``job_key``, or None."""
        check_job_key(job_key)
        rows = await self._client.fetch(
            "result_get",
            {"job_key": job_key},
            doing=f"reading the result of {job_key!r}",
            row=ResultRow,
        )
        if not rows:
            return None
        r = rows[0]
        return Result(r.job_key, r.payload, r.applied_fencing_token, r.written_at)


_CLOCK_SLACK = dt.timedelta(milliseconds=1)


def _identity(text: str) -> str:
    return text
