"""Leases: the seed's acquire/renew/release statements and their invariants (1, 2, 7)."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid

import psycopg
import pytest

import tenure


def test_acquire_gives_token_one_then_busy(client: tenure.Client) -> None:
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    assert lease.token == 1
    assert isinstance(lease.owner, uuid.UUID)
    assert client.acquire("job", ttl=5) is None
    info = client.inspect("job")
    assert info is not None and info.held and info.token == 1 and info.owner == lease.owner


def test_a_ttl_validated_before_lets_no_equal_invalid_one_through(client: tenure.Client) -> None:
    """The client keeps the TTLs it has validated. True == 1 (and hashes alike), yet ttl=True
    is still refused after ttl=1 was accepted; a refused margin stays refused."""
    assert client.acquire("job", ttl=1) is not None
    with pytest.raises(tenure.InvalidArgumentType):
        client.acquire("other", ttl=True)
    for _ in range(2):
        with pytest.raises(tenure.InvalidArgument, match="safety_margin"):
            client.acquire("other", ttl=1, safety_margin=1)
    assert client.inspect("other") is None


def test_each_execution_gets_a_fresh_owner(client: tenure.Client) -> None:
    owners = set()
    for _ in range(3):
        lease = client.acquire("job", ttl=5)
        assert lease is not None
        owners.add(lease.owner)
        lease.release()
    assert len(owners) == 3


def test_takeover_only_after_expiry_increments_token(client: tenure.Client) -> None:
    first = client.acquire("job", ttl=0.3)
    assert first is not None
    assert client.acquire("job", ttl=0.3) is None
    time.sleep(0.35)
    second = client.acquire("job", ttl=5)
    assert second is not None
    assert second.token == first.token + 1
    with pytest.raises(tenure.LeaseLost):
        first.renew()


def test_release_keeps_token_and_allows_immediate_takeover(client: tenure.Client) -> None:
    first = client.acquire("job", ttl=30)
    assert first is not None
    assert first.release() is True
    assert first.release() is False
    second = client.acquire("job", ttl=30)
    assert second is not None and second.token == 2
    with pytest.raises(tenure.LeaseLost):
        first.check()


def test_renew_extends_by_database_clock(client: tenure.Client) -> None:
    lease = client.acquire("job", ttl=1)
    assert lease is not None
    before = lease.expires_at
    time.sleep(0.1)
    after = lease.renew()
    assert after > before
    assert lease.expires_at == after


def test_renew_by_another_owner_with_same_token_fails(client: tenure.Client) -> None:
    """An owner id is per execution: a restarted process cannot renew the old lease."""
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    impostor = tenure.Lease(
        client,
        "job",
        uuid.uuid4(),
        tenure.leases.models.Grant(lease.token, lease.expires_at),
        ttl=5,
        safety_margin=0.5,
        sent_at=time.monotonic(),
    )
    with pytest.raises(tenure.LeaseLost, match="refused"):
        impostor.renew()
    assert lease.renew() >= lease.expires_at


def test_local_deadline_marks_lease_lost_without_database(client: tenure.Client) -> None:
    lease = client.acquire("job", ttl=0.5, safety_margin=0.1)
    assert lease is not None
    assert not lease.lost
    time.sleep(0.45)
    assert lease.lost
    assert "deadline" in (lease.lost_reason or "")
    with pytest.raises(tenure.LeaseLost):
        lease.check()


def test_renewal_that_waited_on_a_row_lock_does_not_revive_expired_lease(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """Invariant 2: a renewal blocked by another transaction's row lock must re-check expiry
    after the lock is granted (READ COMMITTED does not re-check a row that was only locked)."""
    lease = client.acquire("job", ttl=0.5, safety_margin=0.0)
    assert lease is not None
    outcome: list[object] = []
    with psycopg.connect(dsn) as blocker:
        blocker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {}.job_leases WHERE job_key = 'job' FOR UPDATE").format(
                psycopg.sql.Identifier(schema)
            )
        )

        def renew() -> None:
            try:
                outcome.append(
                    lease._client.fetch(
                        "renew",
                        {
                            "job_key": "job",
                            "owner": lease.owner,
                            "token": lease.token,
                            "ttl": dt.timedelta(seconds=5),
                            "lock_timeout": "10s",
                        },
                        doing="renew",
                    )
                )
            except Exception as exc:  # pragma: no cover - reported below
                outcome.append(exc)

        worker = threading.Thread(target=renew)
        worker.start()
        time.sleep(0.2)  # the renewal is now waiting for the row lock, lease still live
        assert worker.is_alive()
        time.sleep(0.5)  # ...and the lease expires while it waits
        blocker.rollback()  # the lock is released without an update
        worker.join(5)
    assert outcome == [[]], f"a renewal revived an expired lease: {outcome}"
    info = client.inspect("job")
    assert info is not None and not info.held
    successor = client.acquire("job", ttl=5)
    assert successor is not None and successor.token == lease.token + 1


def test_acquire_never_joins_the_callers_transaction(
    client: tenure.Client, conn: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Invariant 1: an acquire attempted inside a transaction that rolls back still commits
    on its own, so its token is never issued twice."""
    with pytest.raises(RuntimeError), conn.transaction():
        conn.execute("SELECT 1")
        lease = client.acquire("job", ttl=0.1)
        assert lease is not None and lease.token == 1
        raise RuntimeError("roll back the caller's transaction")
    time.sleep(0.15)
    again = client.acquire("job", ttl=5)
    assert again is not None and again.token == 2


def test_raw_acquire_rolled_back_issues_no_valid_token(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """The seed's statement inside a rolled-back transaction: its token never became valid
    (never committed), and the next committed token is still above every committed one."""
    first = client.acquire("job", ttl=0.1)
    assert first is not None
    time.sleep(0.15)
    with psycopg.connect(dsn) as raw:
        row = raw.execute(
            client._queries["acquire"],
            {
                "job_key": "job",
                "owner": uuid.uuid4(),
                "ttl": dt.timedelta(seconds=5),
                "lock_timeout": "10s",
            },
        ).fetchone()
        assert row is not None and row[0] and row[1] == 2
        raw.rollback()
    nxt = client.acquire("job", ttl=5)
    assert nxt is not None and nxt.token == 2
    assert nxt.token > first.token


def test_lease_context_renews_in_background_and_releases(client: tenure.Client) -> None:
    # TTL 1 s, not less: on a loaded 2-core CI box a renewal thread can be late by a few
    # hundred ms, and this test is about renewing, not about a tight margin.
    with client.lease("job", ttl=1.0) as lease:
        time.sleep(3.0)  # three TTLs: only background renewals keep it alive
        assert not lease.lost
        info = client.inspect("job")
        assert info is not None and info.held and info.token == lease.token
    info = client.inspect("job")
    assert info is not None and not info.held
    nxt = client.acquire("job", ttl=5)
    assert nxt is not None and nxt.token == lease.token + 1


def test_lease_context_busy_names_holder(client: tenure.Client) -> None:
    holder = client.acquire("job", ttl=30)
    assert holder is not None
    with pytest.raises(tenure.LeaseBusy) as err, client.lease("job", ttl=5):
        pass
    assert err.value.token == holder.token
    assert err.value.expires_at == holder.expires_at
    assert f"token {holder.token}" in str(err.value)


def test_lease_context_wait_polls_until_free(client: tenure.Client) -> None:
    holder = client.acquire("job", ttl=0.4)
    assert holder is not None
    started = time.monotonic()
    with client.lease("job", ttl=5, wait=5) as lease:
        assert lease.token == holder.token + 1
    assert time.monotonic() - started < 3


def test_lease_context_wait_times_out(client: tenure.Client) -> None:
    assert client.acquire("job", ttl=30) is not None
    started = time.monotonic()
    with pytest.raises(tenure.LeaseBusy), client.lease("job", ttl=5, wait=0.3):
        pass
    assert 0.3 <= time.monotonic() - started < 2


def test_on_lost_callback_runs_once_when_taken_over(client: tenure.Client) -> None:
    calls: list[str] = []
    with client.lease("job", ttl=0.5) as lease:
        lease.on_lost(lambda lease: calls.append(lease.lost_reason or ""))
        client.release("job")  # an operator expires it: the next renewal is refused
        deadline = time.monotonic() + 3
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lease.lost
        with pytest.raises(tenure.LeaseLost):
            lease.check()
    assert len(calls) == 1 and "refused" in calls[0]


def test_operator_release_keeps_token(client: tenure.Client) -> None:
    lease = client.acquire("job", ttl=30)
    assert lease is not None
    assert client.release("job") == lease.token
    assert client.release("job") is None
    nxt = client.acquire("job", ttl=30)
    assert nxt is not None and nxt.token == lease.token + 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"job_key": "", "ttl": 5}, "non-empty"),
        ({"job_key": "x" * 201, "ttl": 5}, "limit is 200"),
        ({"job_key": "job", "ttl": 0}, "out of range"),
        ({"job_key": "job", "ttl": -1}, "out of range"),
        ({"job_key": "job", "ttl": "1y"}, "not a duration"),
        ({"job_key": "job", "ttl": 10**9}, "out of range"),
    ],
)
def test_bad_input_is_rejected_before_sql(
    client: tenure.Client, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(tenure.InvalidArgument, match=match):
        client.acquire(**kwargs)  # type: ignore[arg-type]
    assert client.leases() == []


def test_durations_accept_units(client: tenure.Client) -> None:
    lease = client.acquire("job", ttl="1500ms")
    assert lease is not None and lease.ttl == 1.5
    assert tenure.parse_duration("2m") == 120


def test_unmigrated_schema_says_run_migrate(dsn: str) -> None:
    with (
        tenure.connect(dsn, schema=f"missing_{uuid.uuid4().hex[:8]}") as c,
        pytest.raises(tenure.SchemaNotReady, match="tenure migrate"),
    ):
        c.acquire("job", ttl=5)


def test_unreachable_database_names_host_and_port() -> None:
    with pytest.raises(tenure.DatabaseUnavailable, match=r"127\.0\.0\.1:1/"):
        tenure.connect("postgresql://postgres@127.0.0.1:1/postgres")


def test_password_never_in_error(dsn: str) -> None:
    with pytest.raises(tenure.DatabaseUnavailable) as err:
        tenure.connect("postgresql://postgres:hunter2secret@127.0.0.1:1/postgres")
    assert "hunter2secret" not in str(err.value)


def test_renewal_lock_wait_is_bounded_by_a_third_of_the_ttl(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    lease = client.acquire("job", ttl=1.5)
    assert lease is not None
    with psycopg.connect(dsn) as blocker:
        blocker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {}.job_leases WHERE job_key = 'job' FOR UPDATE").format(
                psycopg.sql.Identifier(schema)
            )
        )
        started = time.monotonic()
        with pytest.raises(tenure.Timeout, match="55P03"):
            lease.renew()
        assert time.monotonic() - started < 1.5  # gave up well before the lease expired
        blocker.rollback()
    lease.renew()  # the lock is gone: renewal works again, the lease was never lost
    assert not lease.lost
