"""Server restarts while leases are held (the fault table's "connection loss" row, invariant 7).

Every test here restarts PostgreSQL, so it runs against a throwaway server this module
starts itself (tests/servers.py), never the machine's shared server. Connection cuts and
partitions without a restart are in tests/test_faults.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest

import tenure
from tests.support.servers import PgServer, ServerError, pg_bindir

T = TypeVar("T")


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    if pg_bindir() is None:
        pytest.skip(
            "no PostgreSQL server binaries to start a throwaway server (see tests/servers.py)"
        )
    try:
        srv = PgServer(name="restart")
        srv.start()
    except ServerError as exc:
        pytest.skip(f"cannot start a throwaway PostgreSQL server: {exc}")
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def own(server: PgServer) -> Iterator[tenure.Client]:
    """A migrated client on the throwaway server (fresh schema per test)."""
    if not server.running:
        server.start()
    schema = f"t_{time.monotonic_ns() % 10**12}"
    with tenure.connect(server.dsn, schema=schema, migrate=True) as client:
        yield client
    if not server.running:
        server.start()
    server.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _retry_unavailable(fn: Callable[[], T], attempts: int = 5) -> tuple[T, int]:
    """Call ``fn``; retry on DatabaseUnavailable (a dead pooled connection after a restart).
    Returns the value and how many attempts failed."""
    for failed in range(attempts):
        try:
            return fn(), failed
        except tenure.DatabaseUnavailable:
            time.sleep(0.05)
    raise AssertionError(f"still unavailable after {attempts} attempts")


def _records(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(name)]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_holder_renews_after_a_restart_within_its_lease(
    own: tenure.Client, server: PgServer, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart shorter than the lease: the pool finds its connection dead before the next
    renewal is sent on it and renews on a new one (a renewal sent while the server is still
    down fails and is retried); the lease is never lost, the token stays, and failures are
    logged a few times at most, not per statement."""
    caplog.set_level(logging.INFO)
    ttl = 4.0
    with own.lease("job", ttl=ttl) as lease:
        time.sleep(0.3)
        server.restart(mode)
        restarted_at = time.monotonic()
        # Beyond the TTL: only renewals after the restart can keep the lease.
        time.sleep(ttl * 1.5)
        assert not lease.lost, lease.lost_reason
        info = own.inspect("job")
        assert info is not None and info.held and info.token == lease.token
        assert info.renewed_at > info.acquired_at
        renew_failures = [
            r for r in _records(caplog, "tenure.lease") if "renewing lease" in r.getMessage()
        ]
        assert len(renew_failures) <= 5, [r.getMessage() for r in renew_failures]
        assert all(r.levelno == logging.WARNING for r in renew_failures)
        assert all(getattr(r, "token", None) == lease.token for r in renew_failures)
        replaced = [
            r.getMessage()
            for r in _records(caplog, "tenure.client") + _records(caplog, "psycopg.pool")
        ]
        assert any("while idle" in m or "broken" in m for m in replaced), replaced
        assert time.monotonic() - restarted_at < ttl * 2


def test_holder_stops_by_its_local_deadline_while_the_server_is_down(
    own: tenure.Client, server: PgServer
) -> None:
    """Down for longer than the lease: the holder stops at its local deadline without
    hearing from the database; after the restart a successor takes token+1 strictly after
    the old expiry (database clock) and the old holder's writes are refused."""
    ttl = 2.0
    lost_at: list[float] = []
    ctx = own.lease("job", ttl=ttl)
    lease = ctx.__enter__()
    try:
        lease.on_lost(lambda _: lost_at.append(time.monotonic()))
        old_expiry = lease.expires_at
        server.stop("fast")
        stopped_at = time.monotonic()
        deadline = stopped_at + ttl * 3
        while not lost_at and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost_at, "the holder did not stop while the database was unreachable"
        assert lost_at[0] - stopped_at <= ttl, "stopped later than its TTL after the outage"
        assert "deadline" in (lease.lost_reason or "")
        with pytest.raises(tenure.LeaseLost):
            lease.check()
        server.start()
        with tenure.connect(server.dsn, schema=own.schema) as other:
            # The holder stopped *before* its database expiry: a successor may have to wait.
            give_up = time.monotonic() + ttl * 3
            while (successor := other.acquire("job", ttl=30)) is None:
                assert time.monotonic() < give_up, "the old lease never expired"
                time.sleep(0.05)
            assert successor.token == lease.token + 1
            assert successor.acquired_at is not None
            assert successor.acquired_at > max(old_expiry, lease.expires_at)
            other.results.put("job", {"by": "successor"}, token=successor.token)
        # The old holder's pool reconnects, and the database refuses its stale writes.
        with pytest.raises(tenure.StaleTokenError):
            _retry_unavailable(lambda: own.results.put("job", {"by": "old"}, token=lease.token))
        with (
            psycopg.connect(server.dsn) as conn,
            pytest.raises(tenure.StaleTokenError),
            conn.transaction(),
        ):
            tenure.fence(conn, "job", lease.token, schema=own.schema)
    finally:
        if not server.running:
            server.start()
        ctx.__exit__(None, None, None)
    stored, _ = _retry_unavailable(lambda: own.results.get("job"))
    assert stored is not None and stored.payload == {"by": "successor"}


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_write_in_flight_during_a_restart_is_unknown_not_success(
    own: tenure.Client, server: PgServer, mode: str
) -> None:
    """A result write waiting on a row lock when the server goes down.

    ``immediate`` (every backend quits at once): the write cannot commit; it raises
    DatabaseUnavailable with outcome_unknown, never success and never "stale".
    ``fast`` (backends get SIGTERM): the lock holder may die first and the write may then
    commit and be acknowledged before its own backend exits (seen in practice). Either
    outcome is fine as long as it is true: an acknowledged write is there after the restart,
    a failed one is reported as outcome unknown. A retry with the same token is accepted."""
    lease = own.acquire("job", ttl=30)
    assert lease is not None
    own.results.put("job", {"attempt": 0}, token=lease.token)
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            outcome["result"] = own.results.put("job", {"attempt": 1}, token=lease.token)
        except tenure.TenureError as exc:
            outcome["error"] = exc

    blocker = server.connect(autocommit=False)
    try:
        blocker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {}.report_results WHERE job_key = 'job' FOR UPDATE")
            .format(psycopg.sql.Identifier(own.schema))
            .as_string()
            .encode()
        )
        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.5)  # the write is now waiting for the row lock (lock_timeout is 2 s)
        server.restart(mode)
        writer.join(15)
    finally:
        blocker.close()
    after, _ = _retry_unavailable(lambda: own.results.get("job"))
    assert after is not None
    if "result" in outcome:
        assert mode == "fast", "a write cut by an immediate shutdown was reported as success"
        assert after.payload == {"attempt": 1}, "an acknowledged write is missing"
    else:
        err = outcome["error"]
        assert isinstance(err, tenure.DatabaseUnavailable), err
        assert err.outcome_unknown
        assert not isinstance(err, tenure.StaleTokenError)
        if mode == "immediate":
            assert after.payload == {"attempt": 0}
    stored, _ = _retry_unavailable(
        lambda: own.results.put("job", {"attempt": 2}, token=lease.token)
    )
    assert stored.token == lease.token


def test_fenced_transaction_open_across_a_restart_does_not_commit(
    own: tenure.Client, server: PgServer
) -> None:
    """The application's transaction (fence + insert) is cut by the restart: its COMMIT
    fails, nothing of it is there afterwards, and the same holder can fence again."""
    lease = own.acquire("job", ttl=30)
    assert lease is not None
    table = psycopg.sql.Identifier(own.schema, "ledger")
    server.execute(f'CREATE TABLE "{own.schema}".ledger (note text)')
    conn = psycopg.connect(server.dsn)
    try:
        tenure.fence(conn, "job", lease.token, schema=own.schema)
        conn.execute(psycopg.sql.SQL("INSERT INTO {} VALUES ('cut')").format(table))
        server.restart("fast")
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
    finally:
        conn.close()
    with psycopg.connect(server.dsn) as again:
        count = again.execute(psycopg.sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
        assert count == (0,)
        with again.transaction():
            tenure.fence(again, "job", lease.token, schema=own.schema)
            again.execute(psycopg.sql.SQL("INSERT INTO {} VALUES ('after')").format(table))
    info, _ = _retry_unavailable(lambda: own.inspect("job"))
    assert info is not None and info.token == lease.token


def test_pool_reconnects_after_a_restart(
    server: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    """After a restart, tenure's pool still holds the dead idle connections. Before handing
    one out, the pool sees that the server closed it (without a round trip), discards it,
    checks the other idle ones (discarding every dead one at once, each with a logged
    warning) and hands out a fresh one: the first call succeeds, and so do the next."""
    caplog.set_level(logging.WARNING)
    pool_size = 4
    schema = f"t_{time.monotonic_ns() % 10**12}"
    with tenure.connect(server.dsn, schema=schema, migrate=True, pool_size=pool_size) as c:

        def busy() -> None:
            for _ in range(20):
                c.inspect("job")

        threads = [threading.Thread(target=busy) for _ in range(pool_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        server.restart("fast")
        info, failed = _retry_unavailable(lambda: c.inspect("job"), attempts=pool_size + 1)
        assert info is None
        assert failed == 0
        for _ in range(pool_size * 2):  # every connection handed out now is a fresh one
            assert c.inspect("job") is None
    server.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    discarded = [r for r in _records(caplog, "psycopg.pool") if "discarding" in r.getMessage()]
    assert len(discarded) <= pool_size
