"""The report job refuses stale work: a test a team writes with the tenure pytest plugin.

Run it with your server (``TENURE_TEST_DSN=postgresql://... pytest examples/testing``) or,
without one, on the embedded PostgreSQL (``pip install 'tenure[embedded]'``).
"""

from __future__ import annotations

import psycopg

import tenure
from tenure.testing import LeaseHelpers

from .report import TABLE, create_table, store_report


def rows(dsn: str, schema: str) -> list[tuple[int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT rows FROM "{schema}".{TABLE}').fetchall()


def test_a_paused_run_cannot_overwrite_its_successors_report(
    tenure_dsn: str, tenure_schema: str, tenure_leases: LeaseHelpers
) -> None:
    create_table(tenure_dsn, tenure_schema)
    # A: a real process holding the lease, frozen mid-job as by a long GC pause.
    a = tenure_leases.holder("nightly-report", target="examples.testing.report:store_report")
    a.pause()
    # Meanwhile A's lease expires and B takes over with a newer token and writes.
    b = tenure_leases.take_over("nightly-report")
    with tenure.connect(tenure_dsn, schema=tenure_schema) as client:
        assert store_report(client, b) == b.token
    # A wakes up and commits its report with its old token: refused, nothing written.
    outcome = a.run()
    assert outcome.refused, outcome
    assert rows(tenure_dsn, tenure_schema) == [(b.token,)]


def test_a_successors_result_stands(
    tenure_client: tenure.Client, tenure_leases: LeaseHelpers
) -> None:
    mine = tenure_client.acquire("sync-invoices", ttl="30s")
    assert mine is not None
    tenure_leases.take_over("sync-invoices", {"by": "successor"})
    try:
        tenure_client.results.put("sync-invoices", {"by": "me"}, token=mine.token)
    except tenure.StaleTokenError:
        pass
    else:
        raise AssertionError("a stale token's result was stored")
    stored = tenure_client.results.get("sync-invoices")
    assert stored is not None and stored.payload == {"by": "successor"}
