"""A run whose claim was answered just before its lease's local deadline renews the lease
before its body begins.

Found by tests/ha's synchronous lagging failover in CI: a claim sent as the primary died was
answered on the new one almost a TTL later (the worker counts the lease's local deadline from
when it sent the claim), and the run began with 9.7 ms of its lease left. Its renewal, sent
at once, could not come back in 9.7 ms: the lease was lost locally while the body ran, its
fenced write committed (the database's lease was live: it counted the TTL from when the claim
ran there), the run ended as ``lease_lost`` and the same worker ran the slot again under the
next token: two committed runs of one slot.

Here the late answer is made by building the run's lease as the worker does from a claim
(``sent_at``: when the claim was sent) 50 ms before its local deadline, and the renewal is
held 0.3 s behind a row lock on the lease, as a slow round trip would.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from collections.abc import Iterator

import psycopg
from psycopg import sql

import tenure
from tenure.leases._async.client import default_margin
from tenure.leases._async.lease import AsyncLease
from tenure.leases.models import Grant
from tenure.scheduler.bodies import BodyLimit
from tenure.scheduler.claim import RunIdentity
from tenure.scheduler.context import JobContext
from tenure.scheduler.execution import Run, execute

TTL = 3.0
LEFT = 0.05  # seconds of the lease left when the claim's answer came
HELD = 0.3  # seconds the renewal waits behind the test's row lock


def test_a_run_claimed_just_before_its_local_deadline_renews_before_its_body_begins(
    dsn: str, schema: str
) -> None:
    began: list[float] = []

    def body(ctx: tenure.JobContext) -> None:
        began.append(ctx.lease.deadline_in)
        time.sleep(0.2)  # longer than what was left of the lease when the claim came back

    app = tenure.Scheduler()
    app.add_job("late", body, every="1s", ttl=f"{TTL:g}s")
    spec = app.jobs["late"]

    async def main() -> tuple[str, str | None]:
        async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
            taken = await client.acquire("late", ttl=TTL)
            assert taken is not None
            margin = default_margin(TTL)
            # The run's lease as worker._launch builds it from a claim sent TTL - margin -
            # LEFT seconds ago.
            lease = AsyncLease(
                client,
                "late",
                taken.owner,
                Grant(taken.token, taken.expires_at),
                ttl=TTL,
                safety_margin=margin,
                sent_at=time.monotonic() - (TTL - margin) + LEFT,
            )
            slot = dt.datetime.now(dt.UTC)
            ctx = JobContext(
                job_key="late",
                token=taken.token,
                slot=slot,
                kind="scheduled",
                attempt=1,
                lease=lease,
                client=client,
                worker_id="test",
            )
            lease.on_lost(lambda lost: ctx._stop(lost.lost_reason or "the lease is lost"))
            ident = RunIdentity("late", taken.token, taken.owner, slot, "scheduled", 1, slot)
            run = Run(spec, ident, ctx, lease, time.monotonic())
            with _lease_row_locked(dsn, schema, "late", HELD):
                outcome, error, _took = await execute(run, BodyLimit(8, asyncio.Event()))
            await lease.stop_keeping()
            return outcome, error

    outcome, error = asyncio.run(main())
    # The body began on a renewed lease and ran to its end with it. (Before: it began with
    # 50 ms left, the renewal came back after the local deadline, and the run was lease_lost
    # although its body had run: its slot was retried.)
    assert began and began[0] > TTL / 3, began
    assert (outcome, error) == ("succeeded", None)


@contextlib.contextmanager
def _lease_row_locked(dsn: str, schema: str, job_key: str, seconds: float) -> Iterator[None]:
    """Hold ``job_key``'s lease row locked for ``seconds`` (from a timer thread), as a slow
    round trip would hold its renewal."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL("SELECT 1 FROM {}.job_leases WHERE job_key = %s FOR UPDATE").format(
                sql.Identifier(schema)
            ),
            (job_key,),
        )
        timer = threading.Timer(seconds, conn.commit)
        timer.start()
        try:
            yield
        finally:
            timer.join()
