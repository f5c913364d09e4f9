"""Replica promotion (the fault table's "async replica promoted" row, invariant 1).

A primary and a streaming replica on this machine (tests/servers.py: initdb, then
``pg_basebackup -R``), both started and owned by the test. The scenario, twice:

1. a takeover (token 1) reaches the replica;
2. the replica falls behind (it is stopped: the most lag there can be);
3. token 1 expires and a second takeover (token 2) is *acknowledged* by the primary;
4. the primary crashes; the replica is promoted;
5. a contender acquires on the new primary.

With asynchronous replication step 3 returns at once and the replica never gets token 2:
the seed's statement would issue token 2 a second time on the new primary, so two
executions would each be told "you hold token 2". tenure prevents that: every takeover's
token is at least ``(timeline - 1) * 2^40 + 1`` (the timeline is read from
``pg_walfile_name(pg_current_wal_lsn())`` in the acquire statement), and promotion starts a
new timeline, so the first token on the new primary is above every token the old one could
have issued. With synchronous replication (``synchronous_standby_names``) step 3 blocks
until the standby has the WAL, so the caller is never told it holds a token the replica
lacks. See docs/topologies/replica.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import tenure
from tests.support.servers import PgServer, ServerError, pg_bindir

pytestmark = pytest.mark.skipif(
    pg_bindir() is None, reason="no PostgreSQL server binaries (initdb, pg_basebackup)"
)

TIMELINE_SQL = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"


def _cluster(settings: dict[str, str]) -> tuple[PgServer, PgServer]:
    try:
        primary = PgServer(settings=settings, name="primary").start()
    except ServerError as exc:
        pytest.skip(f"cannot start a throwaway PostgreSQL server: {exc}")
    try:
        # Promoted, the replica must not wait for a standby of its own (there is none).
        replica = primary.replica(name="replica", settings={"synchronous_standby_names": ""})
        replica.start()
    except BaseException:
        primary.close()
        raise
    return primary, replica


@pytest.fixture
def async_cluster() -> Iterator[tuple[PgServer, PgServer]]:
    primary, replica = _cluster({})
    try:
        yield primary, replica
    finally:
        replica.close()
        primary.close()


@pytest.fixture
def sync_cluster() -> Iterator[tuple[PgServer, PgServer]]:
    primary, replica = _cluster({"synchronous_standby_names": "*", "synchronous_commit": "on"})
    try:
        yield primary, replica
    finally:
        replica.close()
        primary.close()


def _wait_replayed(primary: PgServer, replica: PgServer, timeout: float = 30) -> None:
    lsn = primary.execute("SELECT pg_current_wal_lsn()")[0][0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if replica.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))[0][0]:
            return
        time.sleep(0.05)
    raise AssertionError("the replica did not catch up")


def _take_over(client: tenure.Client, key: str, ttl: float, timeout: float = 10) -> tenure.Lease:
    deadline = time.monotonic() + timeout
    while (lease := client.acquire(key, ttl=ttl)) is None:
        assert time.monotonic() < deadline, "never acquired"
        time.sleep(0.05)
    return lease


def _fail_over(primary: PgServer, replica: PgServer) -> int:
    """Crash the primary, promote the (stopped, lagging) replica; its new timeline id."""
    primary.stop("immediate")
    replica.start()
    replica.promote()
    deadline = time.monotonic() + 30
    while replica.execute("SELECT pg_is_in_recovery()")[0][0]:
        assert time.monotonic() < deadline, "promotion did not finish"
        time.sleep(0.05)
    timeline: int = replica.execute(TIMELINE_SQL)[0][0]
    return timeline


def test_async_replica_promotion_never_reissues_a_token(
    async_cluster: tuple[PgServer, PgServer],
) -> None:
    primary, replica = async_cluster
    with tenure.connect(primary.dsn, schema="tenure", migrate=True) as client:
        first = _take_over(client, "job", ttl=0.3)
        _wait_replayed(primary, replica)
        old_timeline = primary.execute(TIMELINE_SQL)[0][0]
        replica.stop("fast")  # from now on the replica misses everything
        second = _take_over(client, "job", ttl=30)  # acknowledged by the primary
        assert second.token == first.token + 1
    new_timeline = _fail_over(primary, replica)
    with tenure.connect(replica.dsn, schema="tenure") as client:
        info = client.inspect("job")
        assert info is not None and info.token == first.token, "the takeover was replicated?"
        again = _take_over(client, "job", ttl=30)
    # The hazard: the takeover that issued token 2 is gone, and the seed's statement would
    # issue token 2 again here. tenure's timeline floor lifts the next token above it.
    assert new_timeline > old_timeline
    assert again.token == ((new_timeline - 1) << 40) + 1
    assert again.token > second.token


def test_sync_replication_never_acknowledges_a_takeover_the_replica_lacks(
    sync_cluster: tuple[PgServer, PgServer],
) -> None:
    primary, replica = sync_cluster
    outcome: dict[str, Any] = {}
    with tenure.connect(primary.dsn, schema="tenure", migrate=True) as client:
        first = _take_over(client, "job", ttl=0.3)
        replica.stop("fast")
        time.sleep(0.5)  # first has expired

        def take_over() -> None:
            try:
                outcome["lease"] = client.acquire("job", ttl=30)
            except tenure.TenureError as exc:
                outcome["error"] = exc

        contender = threading.Thread(target=take_over)
        contender.start()
        # Past tenure's 5 s statement_timeout: PostgreSQL does not cancel a commit's wait for
        # the standby on statement_timeout, so the acquire neither returns nor fails.
        contender.join(6)
        assert contender.is_alive() and not outcome, outcome
        waiting = primary.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        )
        assert waiting == [(1,)]
        primary.stop("immediate")
        contender.join(15)
    err = outcome.get("error")
    assert "lease" not in outcome, "a takeover the replica never got was acknowledged"
    assert isinstance(err, tenure.DatabaseUnavailable) and err.outcome_unknown, err
    _fail_over(primary, replica)
    with tenure.connect(replica.dsn, schema="tenure") as client:
        info = client.inspect("job")
        assert info is not None and info.token == first.token  # token 1 was durable
        again = _take_over(client, "job", ttl=30)
    assert again.token > first.token  # the unacknowledged token 2 was never handed out


def test_cancelled_sync_wait_acknowledges_an_unreplicated_takeover(
    sync_cluster: tuple[PgServer, PgServer],
) -> None:
    """PostgreSQL's documented escape hatch: cancelling a commit that waits for the standby
    (pg_cancel_backend, or a client-side cancel) reports the commit as done, with only a
    WARNING. tenure then hands out a lease whose takeover the replica lacks, and promotion
    would reissue its token without tenure's timeline floor. Do not cancel such waits."""
    primary, replica = sync_cluster
    outcome: dict[str, Any] = {}
    notices: list[str] = []
    with tenure.connect(primary.dsn, schema="tenure", migrate=True) as client:
        first = _take_over(client, "job", ttl=0.3)
        with client.connection() as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        replica.stop("fast")
        time.sleep(0.5)

        def take_over() -> None:
            outcome["lease"] = client.acquire("job", ttl=30)

        contender = threading.Thread(target=take_over)
        contender.start()
        deadline = time.monotonic() + 10
        while not primary.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        ):
            assert time.monotonic() < deadline, "the takeover never waited for the standby"
            time.sleep(0.05)
        contender.join(15)
        second = outcome["lease"]
        assert second is not None and second.token == first.token + 1
    _fail_over(primary, replica)
    with tenure.connect(replica.dsn, schema="tenure") as client:
        info = client.inspect("job")
        assert info is not None and info.token == first.token  # the takeover was lost...
        again = _take_over(client, "job", ttl=30)
    assert again.token > second.token  # ...but the timeline floor never reissues its token
    if notices:  # the pool may have used another connection than the one we hooked
        assert any("synchronous replication" in n for n in notices), notices


def test_timeline_query_works_on_a_primary(async_cluster: tuple[PgServer, PgServer]) -> None:
    primary, replica = async_cluster
    assert primary.execute(TIMELINE_SQL) == [(1,)]
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        replica.execute(TIMELINE_SQL)  # pg_walfile_name() is not allowed during recovery
