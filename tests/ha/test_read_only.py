"""A read-only server (a hot standby, or ``default_transaction_read_only``) is named as such,
with what to do, instead of PostgreSQL's "cannot execute SELECT in a read-only transaction"
(SQLSTATE 25006): the error a client pointed at a replica, or at an HA endpoint that still
leads to a demoted primary, gets. tests/ha/standby.py runs the commands on a real
Patroni replica; this one needs only the shared server."""

from __future__ import annotations

import pytest

import tenure


def test_a_write_on_a_read_only_server_says_to_connect_to_the_primary(
    dsn: str, schema: str
) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    sep = "&" if "?" in dsn else "?"
    read_only = f"{dsn}{sep}options=-c%20default_transaction_read_only%3Don"
    with tenure.connect(read_only, schema=schema) as client:
        assert client.inspect("job") is None  # reads work
        with pytest.raises(tenure.DatabaseError) as caught:
            client.acquire("job", ttl=5)
    err = caught.value
    assert err.sqlstate == "25006"
    assert "the server is read-only" in str(err) and "connect to the primary" in str(err)
    assert "target_session_attrs=read-write" in str(err)
