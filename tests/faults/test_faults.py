"""Connection faults (invariant 7, and the fault table's "connection loss" row): a holder
that cannot reach the database stops by its local deadline, before any successor starts; a
holder whose connection is killed recovers within its lease."""

from __future__ import annotations

import asyncio
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import tenure
from tests.support.fix_proxy import Proxy


@pytest.fixture
def proxy(dsn: str) -> Iterator[Proxy]:
    with Proxy.from_dsn(dsn) as p:
        yield p


def test_blackholed_holder_stops_by_local_deadline_before_successor(
    dsn: str, schema: str, proxy: Proxy
) -> None:
    ttl, margin = 1.0, 0.2
    lost_at: list[float] = []
    with (
        tenure.connect(dsn, schema=schema, migrate=True) as direct,
        tenure.connect(proxy.dsn(dsn), schema=schema) as through_proxy,
    ):
        ctx = through_proxy.lease("job", ttl=ttl, safety_margin=margin)
        lease = ctx.__enter__()
        try:
            lease.on_lost(lambda _: lost_at.append(time.monotonic()))
            time.sleep(0.5)  # a renewal or so has succeeded
            assert not lease.lost
            proxy.blackhole()  # partition: renewals hang, nothing tells the holder
            cut_at = time.monotonic()
            # Keep trying to take over from the other side of the partition.
            while (successor := direct.acquire("job", ttl=5)) is None:
                time.sleep(0.01)
            taken_at = time.monotonic()
            assert successor.token == lease.token + 1
            assert lost_at, "the holder did not notice it lost its lease"
            assert lost_at[0] < taken_at, "the successor started before the holder stopped"
            assert lost_at[0] - cut_at <= ttl  # stopped within its TTL of going silent
            assert "deadline" in (lease.lost_reason or "")
            with pytest.raises(tenure.LeaseLost):
                lease.check()
        finally:
            proxy.cut()
            proxy.heal()
            ctx.__exit__(None, None, None)


def test_holder_recovers_when_its_connections_are_terminated(dsn: str, schema: str) -> None:
    """pg_terminate_backend on every connection of this client: the next renewal fails, the
    retry reconnects, and the lease stays held (it recovered within its lease)."""
    name = f"tenure-test-{schema}"
    with (
        tenure.connect(dsn, schema=schema, migrate=True, application_name=name) as client,
        client.lease("job", ttl=1.5) as lease,
    ):
        time.sleep(0.3)
        with psycopg.connect(dsn, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        time.sleep(2.5)  # beyond the TTL: only successful renewals keep it
        assert not lease.lost, lease.lost_reason
        info = client.inspect("job")
        assert info is not None and info.held and info.token == lease.token


def test_unknown_commit_outcome_is_not_success(dsn: str, schema: str, proxy: Proxy) -> None:
    """A result write whose connection dies mid-flight raises DatabaseUnavailable with
    outcome_unknown; a retry with the same token is accepted (not reported as stale)."""
    with (
        tenure.connect(dsn, schema=schema, migrate=True) as direct,
        tenure.connect(proxy.dsn(dsn), schema=schema) as through_proxy,
    ):
        lease = direct.acquire("job", ttl=30)
        assert lease is not None
        proxy.blackhole()
        threading.Timer(0.3, proxy.cut).start()
        with pytest.raises(tenure.DatabaseUnavailable) as err:
            through_proxy.results.put("job", {"attempt": 1}, token=lease.token)
        assert err.value.outcome_unknown
        proxy.heal()
        stored = through_proxy.results.put("job", {"attempt": 2}, token=lease.token)
        assert stored.token == lease.token


# -- a pooled connection that died while idle: nothing was sent ---------------------------------


def _fill_pool(client: tenure.Client, n: int) -> list[psycopg.Connection[Any]]:
    """Make the pool hold ``n`` idle connections (take ``n`` at once, give them back)."""
    taken = [client._pool.getconn() for _ in range(n)]
    for conn in taken:
        conn.execute("SELECT 1")
        client._pool.putconn(conn)
    return taken


def _reset_seen(conns: list[psycopg.Connection[Any]]) -> bool:
    """True once this host's kernel has received the resets (a loaded machine may deliver
    them a moment after the proxy sent them): each socket is readable."""
    return all(select.select([c.pgconn.socket], [], [], 0)[0] for c in conns)


def _wait(check: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_idle_connections_reset_by_a_proxy_are_replaced_before_a_write(
    dsn: str, schema: str, proxy: Proxy
) -> None:
    """A proxy (PgBouncer, a cloud load balancer) resets the pool's idle connections. The
    next acquire and result write were never sent on them: they succeed on fresh
    connections instead of failing with 'may or may not have committed'."""
    with (
        tenure.connect(dsn, schema=schema, migrate=True) as direct,
        tenure.connect(proxy.dsn(dsn), schema=schema, pool_size=3) as client,
    ):
        idle = _fill_pool(client, 3)
        proxy.cut()
        _wait(lambda: _reset_seen(idle), "the resets to arrive")
        lease = client.acquire("job", ttl=30)
        assert lease is not None and lease.token == 1
        idle = _fill_pool(client, 3)
        proxy.cut()
        _wait(lambda: _reset_seen(idle), "the resets to arrive")
        stored = client.results.put("job", {"ok": True}, token=lease.token, strict=True)
        assert stored.token == lease.token
        assert direct.results.get("job") is not None


def test_idle_backends_terminated_next_calls_succeed(dsn: str, schema: str) -> None:
    """pg_terminate_backend on the pool's idle backends (a server restart does the same):
    the next acquire and renewal run on fresh connections."""
    name = f"tenure-test-idle-{schema}"
    with tenure.connect(dsn, schema=schema, migrate=True, application_name=name) as client:
        lease = client.acquire("job", ttl=30)
        assert lease is not None
        _fill_pool(client, 3)
        with psycopg.connect(dsn, autocommit=True) as admin:
            pids = [
                row[0]
                for row in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
                )
            ]
            assert len(pids) == 3
            admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
            _wait(
                lambda: (
                    not admin.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
                    ).fetchone()
                ),
                "the backends to exit",
            )
        lease.renew()
        assert client.acquire("other", ttl=30) is not None
        client.results.put("job", 1, token=lease.token)


def test_unreachable_after_idle_reset_is_unavailable_not_unknown(
    dsn: str, schema: str, proxy: Proxy
) -> None:
    """The pool's connections were reset while idle and the server cannot be reached: the
    write was never sent, so the error does not say it may have committed."""
    with (
        tenure.connect(dsn, schema=schema, migrate=True),
        tenure.connect(proxy.dsn(dsn), schema=schema) as client,
    ):
        idle = _fill_pool(client, 2)
        proxy.stop()
        _wait(lambda: _reset_seen(idle), "the resets to arrive")
        with pytest.raises(tenure.DatabaseUnavailable) as err:
            client.acquire("job", ttl=30)
        assert not err.value.outcome_unknown
        assert "may or may not have committed" not in str(err.value)


def test_renewal_cut_mid_statement_is_an_unknown_outcome(dsn: str, schema: str) -> None:
    """A renewal whose backend is terminated while the statement runs (here: while it
    waits for a row lock) may or may not have committed: it is reported as unknown."""
    name = f"tenure-test-renew-{schema}"
    with (
        tenure.connect(dsn, schema=schema, migrate=True, application_name=name) as client,
        psycopg.connect(dsn, autocommit=True) as admin,
        psycopg.connect(dsn) as blocker,
    ):
        lease = client.acquire("job", ttl=60)  # renew's lock wait is bounded by ttl/3
        assert lease is not None
        blocker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {}.job_leases FOR UPDATE").format(
                psycopg.sql.Identifier(schema)
            )
        )
        errors: list[BaseException] = []

        def renew() -> None:
            try:
                lease.renew()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=renew, daemon=True)
        thread.start()
        waiting = (
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'"
        )
        _wait(lambda: admin.execute(waiting, (name,)).fetchone(), "the renewal to wait")
        row = admin.execute(waiting, (name,)).fetchone()
        assert row is not None
        admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        thread.join(30)
        blocker.rollback()
        [err] = errors
        assert isinstance(err, tenure.DatabaseUnavailable), err
        assert err.outcome_unknown
        assert "may or may not have committed" in str(err)


def test_async_client_replaces_idle_connections_reset_by_a_proxy(
    dsn: str, schema: str, proxy: Proxy
) -> None:
    """The same with the asyncio client (its pool is another class)."""

    async def scenario() -> int:
        async with await tenure.connect_async(proxy.dsn(dsn), schema=schema, pool_size=3) as c:
            taken = [await c._pool.getconn() for _ in range(3)]
            for conn in taken:
                await conn.execute("SELECT 1")
                await c._pool.putconn(conn)
            proxy.cut()
            _wait(lambda: _reset_seen(taken), "the resets to arrive")  # type: ignore[arg-type]
            lease = await c.acquire("job", ttl=30)
            assert lease is not None
            await c.results.put("job", 1, token=lease.token, strict=True)
            return lease.token

    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    assert asyncio.run(scenario()) == 1
