"""tenure behind PgBouncer in transaction pooling mode (Debian's pgbouncer, started here).

Findings these tests pin down (docs/topologies/pgbouncer.md):

* psycopg prepares a statement on the server after ``prepare_threshold`` (5) executions on
  one client connection. Behind PgBouncer < 1.21 in transaction mode the next execution may
  run on another server connection: "prepared statement _pg3_N does not exist / already
  exists", or a Bind against *another client's* statement of the same name. Set
  ``TENURE_PREPARE_THRESHOLD=none`` (or ``tenure.connect(..., prepare_threshold=None)``)
  there, and ``prepare_threshold=None`` on the application's own connection used for
  ``tenure.fence``.
* Session settings made at connect (tenure's statement/lock timeouts) stay on whichever
  server connection served that transaction and leak to other clients.
* Leases, renewals, fenced transactions and results work through it once prepared
  statements are off: every lease statement is one autocommit statement, and the fence's
  settings are transaction-local.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import tenure
from tenure.db.timeouts import CONNECTION_KWARGS
from tests.support.servers import PgBouncer, PgServer, ServerError, pg_bindir, pgbouncer_binary

# does not exist, already exists, Bind with the wrong parameter count, and a Bind whose values
# were parsed as the types of *another* client's statement of the same name (22P02 as text,
# 22P03 as binary: both seen).
PREPARED_STATEMENT_ERRORS = ("26000", "42P05", "08P01", "22P02", "22P03")

pytestmark = pytest.mark.skipif(
    pgbouncer_binary() is None or pg_bindir() is None,
    reason="pgbouncer (Debian package `pgbouncer`; scripts/test installs it when it runs as "
    "root) or PostgreSQL server binaries are not installed",
)


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    try:
        srv = PgServer(name="bounced").start()
    except ServerError as exc:
        pytest.skip(f"cannot start a throwaway PostgreSQL server: {exc}")
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def bouncer(server: PgServer) -> Iterator[PgBouncer]:
    with PgBouncer(server, pool_mode="transaction", pool_size=2) as b:
        yield b


@pytest.fixture
def bschema(server: PgServer) -> Iterator[str]:
    """A schema migrated directly on the server (migrations take an advisory lock)."""
    name = f"b_{uuid.uuid4().hex[:12]}"
    with tenure.connect(server.dsn, schema=name, migrate=True):
        pass
    yield name
    server.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def no_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user does behind PgBouncer < 1.21 (see the module doc): no server-side
    prepared statements on tenure's pooled connections, for every command and client."""
    monkeypatch.setenv("TENURE_PREPARE_THRESHOLD", "none")


def _hammer(client: tenure.Client, threads: int = 4, rounds: int = 30) -> Counter[str]:
    """Acquire, renew, store a result, release and inspect, from several threads at once
    (well past psycopg's prepare threshold of 5 executions per connection)."""
    errors: Counter[str] = Counter()

    def work(i: int) -> None:
        key = f"k{i}"
        for j in range(rounds):
            try:
                lease = client.acquire(key, ttl=5)
                if lease is not None:
                    lease.renew()
                    client.results.put(key, {"round": j}, token=lease.token)
                    lease.release()
                client.inspect(key)
            except tenure.TenureError as exc:
                state = str(getattr(exc, "sqlstate", None))
                if not errors[state]:
                    print(f"{state}: {exc}")  # one example per SQLSTATE, for the log
                errors[state] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    return errors


def test_default_prepared_statements_break_behind_transaction_pooling(
    bouncer: PgBouncer, bschema: str
) -> None:
    """The failure: psycopg's default prepare_threshold behind PgBouncer < 1.21."""
    if bouncer.version() >= (1, 21):
        pytest.skip(f"PgBouncer {bouncer.version()} tracks protocol-level prepared statements")
    assert CONNECTION_KWARGS.get("prepare_threshold", 5) is not None, (
        "tenure now disables prepared statements itself: this test is obsolete"
    )
    assert "TENURE_PREPARE_THRESHOLD" not in __import__("os").environ
    with tenure.connect(bouncer.dsn, schema=bschema, pool_size=4) as client:
        errors = _hammer(client)
    assert errors, "expected prepared-statement errors through PgBouncer"
    assert set(errors) <= set(PREPARED_STATEMENT_ERRORS), errors


def test_leases_fenced_writes_and_results_through_pgbouncer(
    bouncer: PgBouncer, server: PgServer, bschema: str, no_prepare: None
) -> None:
    with tenure.connect(bouncer.dsn, schema=bschema, pool_size=4) as client:
        assert _hammer(client) == Counter()
        # A holder loses its lease; the successor takes over through the same bouncer.
        old = client.acquire("job", ttl=0.3)
        assert old is not None
        with client.lease("job", ttl=5, wait=5) as new:
            assert new.token == old.token + 1
            # The application's own connection through PgBouncer: prepare_threshold=None too.
            with psycopg.connect(bouncer.dsn, prepare_threshold=None) as conn:
                for _ in range(10):  # past the threshold: would prepare by default
                    with conn.transaction():
                        tenure.fence(conn, "job", new.token, schema=bschema)
                        client.results.put("job", {"by": "new"}, token=new.token, conn=conn)
                    # strict: the old holder's fence fails once the takeover committed ...
                    with pytest.raises(tenure.StaleTokenError), conn.transaction():
                        tenure.fence(conn, "job", old.token, schema=bschema)
                    # ... and its result write once a higher token wrote.
                    with pytest.raises(tenure.StaleTokenError):
                        client.results.put("job", {"by": "old"}, token=old.token)
        stored = client.results.get("job")
    assert stored is not None and stored.payload == {"by": "new"} and stored.token == new.token
    # The fence row really was written through the bouncer, on the real server.
    rows = server.execute(
        f'SELECT fenced_token FROM "{bschema}".job_state WHERE job_key = %s', ("job",)
    )
    assert rows == [(new.token,)]


def test_strict_fence_holds_a_server_connection_through_pgbouncer(
    bouncer: PgBouncer, bschema: str, no_prepare: None
) -> None:
    """A takeover waits for the predecessor's open fenced transaction even through the
    bouncer (the transaction pins one server connection), and then succeeds."""
    with tenure.connect(bouncer.dsn, schema=bschema, pool_size=2) as client:
        old = client.acquire("job", ttl=0.5)
        assert old is not None
        outcome: dict[str, Any] = {}
        with psycopg.connect(bouncer.dsn, prepare_threshold=None) as conn:
            with conn.transaction():
                # idle_timeout: this transaction idles on purpose for longer than old's TTL.
                tenure.fence(conn, "job", old.token, schema=bschema, idle_timeout="30s")

                def contend() -> None:
                    outcome["lease"] = client.lease("job", ttl=5, wait=10).__enter__()

                t = threading.Thread(target=contend)
                t.start()
                t.join(1.5)  # past old's expiry: the takeover waits on our fence row
                assert "lease" not in outcome, "took over while a fenced transaction was open"
            t.join(15)
        successor = outcome["lease"]
        assert successor.token == old.token + 1
        successor.release()


def test_session_settings_leak_across_clients_in_transaction_pooling(
    server: PgServer, bschema: str, no_prepare: None
) -> None:
    """tenure sets its timeouts once per connection (set_config(..., false)). With one
    server connection behind the bouncer, another client inherits them: session state is
    not per client in transaction pooling. Safety does not depend on these timeouts
    (docs/safety.md); the per-statement lock bounds of acquire and renew are
    transaction-local and unaffected."""
    with PgBouncer(server, pool_mode="transaction", pool_size=1) as single:
        with psycopg.connect(single.dsn, autocommit=True, prepare_threshold=None) as plain:
            before = plain.execute(b"SHOW statement_timeout").fetchone()
        with (
            tenure.connect(single.dsn, schema=bschema, pool_size=1),
            psycopg.connect(single.dsn, autocommit=True, prepare_threshold=None) as plain,
        ):
            leaked = plain.execute(b"SHOW statement_timeout").fetchone()
    assert before == ("0",)
    assert leaked == ("5s",)
