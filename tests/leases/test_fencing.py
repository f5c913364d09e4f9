"""Fenced transactions (invariants 3 and 5): strict fencing in the caller's transaction."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tenure

Conn = psycopg.Connection[Any]


def _ledger(conn: Conn, schema: str) -> None:
    """A business table of the user's, in the same database."""
    with conn.transaction():
        conn.execute(
            sql.SQL("CREATE TABLE {}.ledger (job text, token bigint, note text)").format(
                sql.Identifier(schema)
            )
        )


def _rows(conn: Conn, schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        sql.SQL("SELECT job, token, note FROM {}.ledger ORDER BY token").format(
            sql.Identifier(schema)
        )
    ).fetchall()


def _write(conn: Conn, schema: str, token: int, note: str) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {}.ledger VALUES ('job', %s, %s)").format(sql.Identifier(schema)),
        (token, note),
    )


def test_fenced_transaction_commits_with_current_token(
    client: tenure.Client, conn: Conn, schema: str
) -> None:
    _ledger(conn, schema)
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    with conn.transaction():
        tenure.fence(conn, "job", lease.token, schema=schema)
        _write(conn, schema, lease.token, "holder")
    assert _rows(conn, schema) == [("job", lease.token, "holder")]


def test_predecessor_cannot_commit_after_takeover_even_before_successor_writes(
    client: tenure.Client, conn: Conn, schema: str
) -> None:
    """Strict fencing: the successor's takeover alone fences the predecessor."""
    _ledger(conn, schema)
    old = client.acquire("job", ttl=0.2)
    assert old is not None
    time.sleep(0.25)
    new = client.acquire("job", ttl=5)
    assert new is not None and new.token == old.token + 1
    with pytest.raises(tenure.StaleTokenError) as err, conn.transaction():
        _write(conn, schema, old.token, "stale")
        tenure.fence(conn, "job", old.token, schema=schema)
    assert err.value.token == old.token and err.value.current_token == new.token
    assert _rows(conn, schema) == []  # the business write rolled back with the fence


def test_expired_lease_without_successor_is_fenced_too(
    client: tenure.Client, conn: Conn, schema: str
) -> None:
    lease = client.acquire("job", ttl=0.1)
    assert lease is not None
    time.sleep(0.15)
    with pytest.raises(tenure.StaleTokenError), conn.transaction():
        tenure.fence(conn, "job", lease.token, schema=schema)


def test_takeover_waits_for_open_fenced_transaction(
    client: tenure.Client, conn: Conn, dsn: str, schema: str
) -> None:
    """While the holder's fenced transaction is open, a takeover cannot commit; once the
    holder commits, the takeover proceeds and the holder's write is ordered before it."""
    _ledger(conn, schema)
    old = client.acquire("job", ttl=0.3)
    assert old is not None
    with tenure.connect(dsn, schema=schema) as other:
        with conn.transaction():
            # idle_timeout above the stall: the server must not end this session here.
            tenure.fence(conn, "job", old.token, schema=schema, idle_timeout="30s")
            _write(conn, schema, old.token, "holder")
            time.sleep(0.4)  # the lease expires while the fenced transaction is open
            # A contender now finds the lease expired, but its takeover must wait for the
            # fence row: it times out (lock_timeout) and reports busy.
            started = time.monotonic()
            assert other.acquire("job", ttl=5) is None
            assert time.monotonic() - started >= 1.5  # it really waited for the lock
        new = other.acquire("job", ttl=5)
        assert new is not None and new.token == old.token + 1
    assert _rows(conn, schema) == [("job", old.token, "holder")]


def test_fence_that_waited_for_a_takeover_sees_the_new_token(
    client: tenure.Client, conn: Conn, dsn: str, schema: str
) -> None:
    """EvalPlanQual: a fence blocked behind an in-flight takeover re-checks the new row
    version when the takeover commits, and fails."""
    old = client.acquire("job", ttl=0.3)
    assert old is not None
    time.sleep(0.35)
    with psycopg.connect(dsn) as takeover:
        # A takeover in its own transaction, held open: it has updated the fence row.
        row = takeover.execute(
            client._queries["acquire"],
            {
                "job_key": "job",
                "owner": __import__("uuid").uuid4(),
                "ttl": dt.timedelta(seconds=5),
                "lock_timeout": "10s",
            },
        ).fetchone()
        assert row is not None and row[0] and row[1] == old.token + 1
        outcome: list[BaseException | None] = []

        def fence() -> None:
            try:
                with conn.transaction():
                    tenure.fence(conn, "job", old.token, schema=schema, idle_timeout=False)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        # The lease row of this test is expired, so make the fence's expiry check pass by
        # construction: it must fail on the token alone.
        worker = threading.Thread(target=fence)
        worker.start()
        time.sleep(0.3)
        takeover.commit()
        worker.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], tenure.StaleTokenError)


def test_renewal_is_not_starved_by_holders_own_fenced_transaction(
    client: tenure.Client, conn: Conn, schema: str
) -> None:
    lease = client.acquire("job", ttl=0.5)
    assert lease is not None
    with conn.transaction():
        # This transaction idles past the TTL on purpose; lift the default idle timeout.
        tenure.fence(conn, "job", lease.token, schema=schema, idle_timeout="30s")
        for _ in range(5):
            time.sleep(0.15)
            lease.renew()  # would block (and expire) if renewals touched the fence row
        tenure.fence(conn, "job", lease.token, schema=schema)
    assert not lease.lost


def test_rollback_leaves_fence_state_and_tokens_unchanged(
    client: tenure.Client, conn: Conn, schema: str
) -> None:
    _ledger(conn, schema)
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    state = sql.SQL("SELECT token, fenced_token FROM {}.job_state WHERE job_key = 'job'").format(
        sql.Identifier(schema)
    )
    before = conn.execute(state).fetchone()
    conn.commit()
    with pytest.raises(RuntimeError), conn.transaction():
        tenure.fence(conn, "job", lease.token, schema=schema)
        _write(conn, schema, lease.token, "rolled back")
        raise RuntimeError("business logic failed")
    assert conn.execute(state).fetchone() == before
    assert _rows(conn, schema) == []
    info = client.inspect("job")
    assert info is not None and info.token == lease.token


def test_paused_fenced_transaction_is_ended_by_idle_timeout(
    client: tenure.Client, conn: Conn, dsn: str, schema: str
) -> None:
    """A holder that stalls inside its fenced transaction cannot block takeovers forever:
    the fence sets idle_in_transaction_session_timeout to the lease TTL."""
    old = client.acquire("job", ttl=0.5)
    assert old is not None
    conn.execute("SELECT 1")  # open a transaction
    tenure.fence(conn, "job", old.token, schema=schema)
    time.sleep(1.2)  # idle in transaction > TTL: the server ends the session
    with tenure.connect(dsn, schema=schema) as other:
        new = other.acquire("job", ttl=5)
        assert new is not None and new.token == old.token + 1
    # The stalled holder finds its session ended: its transaction can never commit.
    with pytest.raises((psycopg.errors.IdleInTransactionSessionTimeout, psycopg.OperationalError)):
        conn.execute("SELECT 1")
        conn.commit()


def test_fence_refuses_autocommit_outside_transaction(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    with psycopg.connect(dsn, autocommit=True) as auto:
        with pytest.raises(tenure.InvalidArgument, match="inside your transaction"):
            tenure.fence(auto, "job", lease.token, schema=schema)
        with auto.transaction():
            tenure.fence(auto, "job", lease.token, schema=schema)


def test_relaxed_fence_keeps_last_accepted_token(dsn: str, schema: str) -> None:
    """For data in a database without the lease table: the seed's last-accepted rule."""
    with tenure.connect(dsn, schema=schema, migrate=True), psycopg.connect(dsn) as other:
        with other.transaction():
            tenure.fence(other, "job", 5, schema=schema, strict=False)
        with other.transaction():
            tenure.fence(other, "job", 5, schema=schema, strict=False)  # same token: a retry
        with pytest.raises(tenure.StaleTokenError) as err, other.transaction():
            tenure.fence(other, "job", 4, schema=schema, strict=False)
        assert err.value.current_token == 5
        with other.transaction():
            tenure.fence(other, "job", 7, schema=schema, strict=False)


def test_stale_fence_emits_metric_event(client: tenure.Client, conn: Conn, schema: str) -> None:
    events: list[tenure.metrics.Event] = []
    unsubscribe = tenure.metrics.subscribe(events.append)
    try:
        with pytest.raises(tenure.StaleTokenError), conn.transaction():
            tenure.fence(conn, "never-acquired", 1, schema=schema)
    finally:
        unsubscribe()
    assert tenure.metrics.Event("stale_token_rejection", "never-acquired", "fence") in events
