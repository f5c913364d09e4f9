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
