"""The fenced result store (invariants 3, 4, 6): the seed's conditional upsert."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import tenure


def test_seed_acceptance_two_sessions(dsn: str, schema: str) -> None:
    """The seed's scenario: A takes token 1 and stops renewing; its lease expires; B takes
    token 2 and writes; A resumes and writes: zero rows, and the result is B's."""
    with (
        tenure.connect(dsn, schema=schema, migrate=True) as a,
        tenure.connect(dsn, schema=schema) as b,
    ):
        lease_a = a.acquire("report", ttl=0.3)
        assert lease_a is not None and lease_a.token == 1
        time.sleep(0.35)
        lease_b = b.acquire("report", ttl=5)
        assert lease_b is not None and lease_b.token == 2
        b.results.put("report", {"by": "B"}, token=lease_b.token)
        with pytest.raises(tenure.StaleTokenError) as err:
            a.results.put("report", {"by": "A"}, token=lease_a.token)
        assert (err.value.job_key, err.value.token, err.value.current_token) == ("report", 1, 2)
        assert "token 1" in str(err.value) and "token 2" in str(err.value)
        stored = a.results.get("report")
        assert stored is not None and stored.payload == {"by": "B"} and stored.token == 2


def test_older_token_written_first_is_superseded(client: tenure.Client) -> None:
    old = client.acquire("job", ttl=0.1)
    assert old is not None
    time.sleep(0.15)
    new = client.acquire("job", ttl=5)
    assert new is not None
    client.results.put("job", "old", token=old.token)  # no newer write yet: accepted
    client.results.put("job", "new", token=new.token)
    stored = client.results.get("job")
    assert stored is not None and (stored.payload, stored.token) == ("new", new.token)


def test_same_token_retry_is_not_stale(client: tenure.Client) -> None:
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    client.results.put("job", {"try": 1}, token=lease.token)
    second = client.results.put("job", {"try": 2}, token=lease.token)
    assert second.token == lease.token
    stored = client.results.get("job")
    assert stored is not None and stored.payload == {"try": 2}


def test_token_never_issued_is_refused(client: tenure.Client) -> None:
    with pytest.raises(tenure.TokenNotIssued, match="no token was issued"):
        client.results.put("job", 1, token=1)
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    with pytest.raises(tenure.TokenNotIssued, match="newest issued token is 1"):
        client.results.put("job", 1, token=99)
    assert client.results.get("job") is None


@pytest.mark.parametrize("payload", [object(), {"x": {1, 2}}, float("nan")])
def test_payload_must_be_json(client: tenure.Client, payload: Any) -> None:
    with pytest.raises(tenure.InvalidArgument, match="JSON"):
        client.results.put("job", payload, token=1)


def test_bad_token_rejected_before_sql(client: tenure.Client) -> None:
    for token in (0, -1, True, "1"):
        with pytest.raises(tenure.InvalidArgument, match="positive integer"):
            client.results.put("job", 1, token=token)  # type: ignore[arg-type]


def test_result_in_callers_fenced_transaction(
    client: tenure.Client, conn: psycopg.Connection[Any], schema: str
) -> None:
    """A result and a fence in one transaction: both commit or neither."""
    lease = client.acquire("job", ttl=5)
    assert lease is not None
    with pytest.raises(RuntimeError), conn.transaction():
        tenure.fence(conn, "job", lease.token, schema=schema)
        client.results.put("job", "rolled back", token=lease.token, conn=conn)
        raise RuntimeError("fail after writing")
    assert client.results.get("job") is None
    with conn.transaction():
        tenure.fence(conn, "job", lease.token, schema=schema)
        client.results.put("job", "committed", token=lease.token, conn=conn)
    stored = client.results.get("job")
    assert stored is not None and stored.payload == "committed"


def test_stale_result_emits_metric_event(client: tenure.Client) -> None:
    old = client.acquire("job", ttl=0.1)
    assert old is not None
    time.sleep(0.15)
    new = client.acquire("job", ttl=5)
    assert new is not None
    client.results.put("job", 1, token=new.token)
    events: list[tenure.metrics.Event] = []
    unsubscribe = tenure.metrics.subscribe(events.append)
    try:
        with pytest.raises(tenure.StaleTokenError):
            client.results.put("job", 0, token=old.token)
    finally:
        unsubscribe()
    assert tenure.metrics.Event("stale_token_rejection", "job", "result") in events


# -- strict=True: the rule fence() applies -------------------------------------------------------


def _expire(client: tenure.Client, job_key: str) -> None:
    """Wait until ``job_key``'s lease has expired by the database clock (no timed guess)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = client.inspect(job_key)
        if info is not None and not info.held:
            return
        time.sleep(0.01)
    raise AssertionError(f"lease {job_key!r} did not expire")


def test_expired_holder_after_takeover_strict_refused_seed_rule_accepted(
    client: tenure.Client,
) -> None:
    """The documented difference: a holder whose lease expired (tiny TTL, no renewal) writes
    after a successor took over but before the successor wrote anything. The seed's rule
    (last accepted token wins) accepts it; strict=True refuses it, as fence() would."""
    old = client.acquire("job", ttl=0.05)
    assert old is not None
    _expire(client, "job")
    new = client.acquire("job", ttl=60)
    assert new is not None and new.token == old.token + 1
    with pytest.raises(tenure.StaleTokenError) as err:
        client.results.put("job", {"by": "old"}, token=old.token, strict=True)
    assert (err.value.token, err.value.current_token) == (old.token, new.token)
    assert client.results.get("job") is None  # nothing was written
    late = client.results.put("job", {"by": "old"}, token=old.token)  # the seed's rule
    assert late.token == old.token
    stored = client.results.put("job", {"by": "new"}, token=new.token, strict=True)
    assert stored.token == new.token


def test_strict_put_refused_once_the_lease_expired_even_without_successor(
    client: tenure.Client,
) -> None:
    lease = client.acquire("job", ttl=0.05)
    assert lease is not None
    _expire(client, "job")
    with pytest.raises(tenure.StaleTokenError, match="expired"):
        client.results.put("job", 1, token=lease.token, strict=True)
    assert client.results.get("job") is None


def test_strict_put_by_the_live_holder_and_its_retry(client: tenure.Client) -> None:
    lease = client.acquire("job", ttl=60)
    assert lease is not None
    first = client.results.put("job", {"try": 1}, token=lease.token, strict=True)
    again = client.results.put("job", {"try": 2}, token=lease.token, strict=True)
    assert first.token == again.token == lease.token
    stored = client.results.get("job")
    assert stored is not None and stored.payload == {"try": 2}
    with pytest.raises(tenure.TokenNotIssued):
        client.results.put("job", 1, token=lease.token + 1, strict=True)


def test_strict_put_in_callers_transaction_holds_off_the_takeover(
    client: tenure.Client, conn: psycopg.Connection[Any], schema: str
) -> None:
    """On the caller's connection, a strict put locks the fence row until the caller's
    transaction ends (like fence()): rolled back with it, and a successor cannot take over
    meanwhile, even once the lease has expired."""
    lease = client.acquire("job", ttl=2)
    assert lease is not None
    with pytest.raises(RuntimeError), conn.transaction():
        client.results.put("job", "rolled back", token=lease.token, conn=conn, strict=True)
        raise RuntimeError("fail after writing")
    assert client.results.get("job") is None
    expired = psycopg.sql.SQL(
        "SELECT lease_until < clock_timestamp() FROM {}.job_leases WHERE job_key = 'job'"
    ).format(psycopg.sql.Identifier(schema))
    with conn.transaction():
        client.results.put("job", "kept", token=lease.token, conn=conn, strict=True)
        # Wait for the expiry on this connection: the strict put set the transaction's idle
        # timeout to the TTL, and a transaction idle that long would be ended by the server.
        while not conn.execute(expired).fetchone()[0]:  # type: ignore[index]
            time.sleep(0.01)
        # The takeover waits for this transaction's row lock (its lock_timeout: 0.3 s).
        assert client.acquire("job", ttl=0.3) is None
    successor = client.acquire("job", ttl=60)
    assert successor is not None and successor.token == lease.token + 1
    stored = client.results.get("job")
    assert stored is not None and stored.payload == "kept"
