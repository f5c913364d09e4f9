"""A run whose lease is lost on its own clock must not fence (and so commit) any more.

Found by the Patroni partition test: a scheduled run started 20 ms before its lease's
local deadline; the deadline passed while it worked, but the database still had its lease
(a renewal had committed there; its answer came late), so its fence passed and its writes
committed; the run ended as ``lease_lost`` and its slot ran again under the next token: two
committed runs of one slot. ``ctx.fence()`` now refuses once the run's lease is lost
(:class:`~tenure.LeaseLost`), like ``ctx.check()``, so only the retry commits. (The local
check and the commit are still two steps: a deadline passing between them is not covered.)

The lease here is live in the database and marked lost locally, the state the partition
produced; nothing waits on a clock.
"""

from __future__ import annotations

import psycopg
import pytest

import tenure
from tenure.leases.context import RunContext, SyncStore


def test_a_run_whose_lease_is_lost_locally_cannot_fence(
    client: tenure.Client, schema: str, conn: psycopg.Connection[tuple[object, ...]]
) -> None:
    lease = client.acquire("job", ttl=600)
    assert lease is not None
    ctx = RunContext(
        job_key="job",
        token=lease.token,
        schema=schema,
        store=SyncStore(lambda: client),
        lease=lease,
    )
    with conn.transaction():
        ctx.fence(conn)  # live: fences
    lease._mark_lost("deadline", "no successful renewal before the local deadline")
    with pytest.raises(tenure.LeaseLost), conn.transaction():
        ctx.fence(conn)
    info = client.inspect("job")
    assert info is not None and info.token == lease.token  # still live in the database
