"""The lease-event record (migration 18): a takeover is recorded by the acquire that got its
token, in the same statement; a write the fence refused is recorded too: by the result
store's statement when it wrote nothing, and by a separate autocommit statement from the
client's pool when fence() refused (the caller's transaction rolls back). Accepted writes, a
busy acquire and a fence that passes record nothing. Sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tenure


def events(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            sql.SQL(
                "SELECT token, event, detail FROM {}.lease_events WHERE job_key = %s "
                "ORDER BY at, token"
            ).format(sql.Identifier(schema)),
            (key,),
        )
        return cur.fetchall()


def expire(dsn: str, schema: str, key: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.job_leases SET lease_until = clock_timestamp() - interval '1s' "
                "WHERE job_key = %s"
            ).format(sql.Identifier(schema)),
            (key,),
        )


def test_acquire_and_refused_writes_are_recorded(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True) as client:
        a = client.acquire("k", ttl=30)
        assert a is not None
        assert client.acquire("k", ttl=30) is None  # busy: nothing recorded
        expire(dsn, schema, "k")
        b = client.acquire("k", ttl=30)
        assert b is not None and b.token == a.token + 1
        client.results.put("k", {"by": "b"}, token=b.token)  # accepted: nothing recorded
        with pytest.raises(tenure.StaleTokenError):
            client.results.put("k", {"by": "a"}, token=a.token)
        with pytest.raises(tenure.StaleTokenError):
            client.results.put("k", {"by": "a"}, token=a.token, strict=True)
        with pytest.raises(tenure.StaleTokenError), client.fenced("k", a.token):
            pass
        with client.fenced("k", b.token):  # passes: nothing recorded
            pass
        with psycopg.connect(dsn) as conn:
            with pytest.raises(tenure.StaleTokenError), conn.transaction():
                tenure.fence(conn, "k", a.token, schema=schema, client=client)
            # An untrusted token is not recorded as refused: it was never issued.
            with pytest.raises(tenure.TokenNotIssued):
                client.results.put("k", {"by": "x"}, token=b.token + 5)
    assert events(dsn, schema, "k") == [
        (a.token, "acquired", None),
        (b.token, "acquired", None),
        (a.token, "refused", "results.put"),
        (a.token, "refused", "results.put strict"),
        (a.token, "refused", "fence"),
        (a.token, "refused", "fence"),
    ]


def test_async_acquire_and_refused_writes_are_recorded(dsn: str, schema: str) -> None:
    asyncio.run(_async_scenario(dsn, schema))


async def _async_scenario(dsn: str, schema: str) -> None:
    async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
        a = await client.acquire("k", ttl=30)
        assert a is not None
        assert await client.acquire("k", ttl=30) is None
        expire(dsn, schema, "k")
        b = await client.acquire("k", ttl=30)
        assert b is not None
        await client.results.put("k", {"by": "b"}, token=b.token)
        with pytest.raises(tenure.StaleTokenError):
            await client.results.put("k", {"by": "a"}, token=a.token)
        with pytest.raises(tenure.StaleTokenError):
            await client.results.put("k", {"by": "a"}, token=a.token, strict=True)
        with pytest.raises(tenure.StaleTokenError):
            async with client.fenced("k", a.token):
                pass
        async with client.fenced("k", b.token):
            pass
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(tenure.StaleTokenError):
                async with conn.transaction():
                    await tenure.fence_async(conn, "k", a.token, schema=schema, client=client)
    assert events(dsn, schema, "k") == [
        (a.token, "acquired", None),
        (b.token, "acquired", None),
        (a.token, "refused", "results.put"),
        (a.token, "refused", "results.put strict"),
        (a.token, "refused", "fence"),
        (a.token, "refused", "fence"),
    ]


def test_a_refusal_in_the_callers_transaction_is_recorded_when_it_commits(
    dsn: str, schema: str
) -> None:
    """results.put(conn=...) writes its refusal in the caller's transaction: recorded if the
    caller commits anyway (the error was caught), gone with a rollback, like the write."""
    with tenure.connect(dsn, schema=schema, migrate=True) as client:
        a = client.acquire("k", ttl=30)
        assert a is not None
        expire(dsn, schema, "k")
        b = client.acquire("k", ttl=30)
        assert b is not None
        client.results.put("k", {"by": "b"}, token=b.token)
        with (
            psycopg.connect(dsn) as conn,
            conn.transaction(),
            pytest.raises(tenure.StaleTokenError),
        ):
            client.results.put("k", {"by": "a"}, token=a.token, conn=conn)
    assert events(dsn, schema, "k")[-1] == (a.token, "refused", "results.put")
