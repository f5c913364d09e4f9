"""The inbox: a consumer applies a key once, however often it is delivered (invariant 6)."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg import sql

import tenure
from tenure.outbox import inbox

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def effects(client: tenure.Client, dsn: str) -> str:
    """A consumer's business table, next to tenure's inbox in the test schema."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            sql.SQL("CREATE TABLE {}.effects (key text, note text)").format(
                sql.Identifier(client.schema)
            )
        )
    return client.schema


def _apply(conn: Conn, schema: str, key: str, note: str, consumer: str = "billing") -> bool:
    """The consumer pattern: claim and side effect in one transaction."""
    with conn.transaction():
        first = inbox.claim(conn, consumer, key, schema=schema)
        if first:
            conn.execute(
                sql.SQL("INSERT INTO {}.effects VALUES (%s, %s)").format(sql.Identifier(schema)),
                (key, note),
            )
        return first


def _effects(conn: Conn, schema: str) -> list[tuple[object, ...]]:
    # In a transaction block, so the connection is idle afterwards (the schema is dropped).
    with conn.transaction():
        return conn.execute(
            sql.SQL("SELECT key, note FROM {}.effects ORDER BY note").format(sql.Identifier(schema))
        ).fetchall()


def test_second_delivery_is_not_applied(conn: Conn, effects: str) -> None:
    assert _apply(conn, effects, "mail:job:1", "first") is True
    assert _apply(conn, effects, "mail:job:1", "duplicate") is False
    assert _apply(conn, effects, "mail:job:2", "other key") is True
    # Another consumer of the same message applies it for itself.
    assert _apply(conn, effects, "mail:job:1", "audit", consumer="audit") is True
    assert _effects(conn, effects) == [
        ("mail:job:1", "audit"),
        ("mail:job:1", "first"),
        ("mail:job:2", "other key"),
    ]


def test_rolled_back_claim_does_not_count(conn: Conn, effects: str) -> None:
    with pytest.raises(RuntimeError), conn.transaction():
        assert inbox.claim(conn, "billing", "k", schema=effects) is True
        raise RuntimeError("side effect failed")
    assert _apply(conn, effects, "k", "retried") is True
    assert _effects(conn, effects) == [("k", "retried")]


@pytest.mark.parametrize("first_commits", [True, False])
def test_concurrent_claim_waits_for_the_first_transaction(
    conn: Conn, effects: str, dsn: str, first_commits: bool
) -> None:
    """Two deliveries of one key at once: the second waits, then sees the first's outcome."""
    outcome: list[bool] = []

    def second() -> None:
        with psycopg.connect(dsn) as other:
            outcome.append(_apply(other, effects, "k", "second"))

    worker = threading.Thread(target=second)
    with conn.transaction():
        assert inbox.claim(conn, "billing", "k", schema=effects) is True
        worker.start()
        time.sleep(0.5)
        assert outcome == [], "the second claim must wait for the first transaction"
        if not first_commits:
            raise psycopg.Rollback()
    worker.join(timeout=30)
    assert outcome == [not first_commits]
    assert _effects(conn, effects) == ([] if first_commits else [("k", "second")])


def test_claim_refuses_autocommit_outside_a_transaction(effects: str, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as auto:
        with pytest.raises(tenure.InvalidArgument, match="inside your transaction"):
            inbox.claim(auto, "billing", "k", schema=effects)
        with auto.transaction():
            assert inbox.claim(auto, "billing", "k", schema=effects) is True


@pytest.mark.parametrize(
    ("consumer", "key"), [("", "k"), ("c", ""), ("c", "x" * 1001), ("c", "a\x00b"), (" ", "k")]
)
def test_bad_arguments(conn: Conn, effects: str, consumer: str, key: str) -> None:
    with pytest.raises(tenure.InvalidArgument):
        inbox.claim(conn, consumer, key, schema=effects)


def test_async_claim(effects: str, dsn: str) -> None:
    async def scenario() -> list[bool]:
        seen = []
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            for _ in range(2):
                async with aconn.transaction():
                    seen.append(await inbox.claim_async(aconn, "billing", "k", schema=effects))
        return seen

    assert asyncio.run(scenario()) == [True, False]
