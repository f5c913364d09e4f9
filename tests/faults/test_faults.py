"""Connection faults (invariant 7, and the fault table's "connection loss" row): a holder
that cannot reach the database stops by its local deadline, before any successor starts; a
holder whose connection is killed recovers within its lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

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
