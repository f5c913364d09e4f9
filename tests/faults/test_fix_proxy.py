"""The fault-injection proxy (tests/fix_proxy.py) against the real test PostgreSQL."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from tests.support.env import pick_dsn
from tests.support.fix_proxy import Proxy

DSN = pick_dsn()


class QueryThread(threading.Thread):
    """Run one query on ``conn`` in a daemon thread; keep its result or exception."""

    def __init__(self, conn: psycopg.Connection[Any], query: str) -> None:
        super().__init__(daemon=True)
        self.conn = conn
        self.query = query
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            row = self.conn.execute(self.query).fetchone()
            self.result = row[0] if row else None
        except BaseException as exc:
            self.error = exc


def test_dsn_keeps_other_params() -> None:
    with Proxy("127.0.0.1", 5432) as proxy:
        params = psycopg.conninfo.conninfo_to_dict(
            proxy.dsn("postgresql://u@db.example:6543/app?application_name=x&hostaddr=10.0.0.1")
        )
        assert params == {
            "host": "127.0.0.1",
            "port": str(proxy.port),
            "user": "u",
            "dbname": "app",
            "application_name": "x",
        }


def test_query_through_proxy() -> None:
    with Proxy.from_dsn(DSN) as proxy, psycopg.connect(proxy.dsn(DSN)) as conn:
        assert conn.info.port == proxy.port
        assert conn.execute("SELECT 42").fetchone() == (42,)
        assert proxy.connections == 1


def test_cut_breaks_existing_connections_only() -> None:
    with Proxy.from_dsn(DSN) as proxy:
        with psycopg.connect(proxy.dsn(DSN)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            proxy.cut()
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
            # libpq may notice the reset while sending or while reading: either way the
            # connection stays unusable.
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        with psycopg.connect(proxy.dsn(DSN), connect_timeout=2) as conn2:
            assert conn2.execute("SELECT 2").fetchone() == (2,)


def test_blackhole_hangs_then_heal_resumes() -> None:
    with Proxy.from_dsn(DSN) as proxy:
        conn = psycopg.connect(proxy.dsn(DSN), autocommit=True)
        try:
            proxy.blackhole()
            query = QueryThread(conn, "SELECT 7")
            query.start()
            query.join(1.0)
            assert query.is_alive(), "the query went through a blackholed proxy"

            # New connections hang too: libpq gives up after connect_timeout (min 2 s).
            t0 = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(proxy.dsn(DSN), connect_timeout=2)
            assert time.monotonic() - t0 >= 1.5
            assert query.is_alive()

            # Healing delivers the pending bytes late, as TCP would.
            proxy.heal()
            query.join(5.0)
            assert not query.is_alive()
            assert query.error is None
            assert query.result == 7
            with psycopg.connect(proxy.dsn(DSN), connect_timeout=2) as conn2:
                assert conn2.execute("SELECT 8").fetchone() == (8,)
        finally:
            conn.close()


def test_stop_unblocks_a_blackholed_query() -> None:
    proxy = Proxy.from_dsn(DSN)
    proxy.start()
    conn = psycopg.connect(proxy.dsn(DSN), autocommit=True)
    try:
        proxy.blackhole()
        query = QueryThread(conn, "SELECT 1")
        query.start()
        query.join(0.3)
        assert query.is_alive()
        t0 = time.monotonic()
        proxy.stop()
        assert time.monotonic() - t0 < 2.5
        query.join(2.0)
        assert not query.is_alive()
        assert isinstance(query.error, psycopg.OperationalError)
    finally:
        proxy.stop()
        conn.close()


def test_stop_refuses_then_start_serves_again() -> None:
    with Proxy.from_dsn(DSN) as proxy:
        dsn = proxy.dsn(DSN)
        proxy.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(dsn, connect_timeout=2)
        proxy.start()
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            assert conn.execute("SELECT 3").fetchone() == (3,)
