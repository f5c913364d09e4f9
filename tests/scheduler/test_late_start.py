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
from tenure.leases._async.client import AsyncClient, default_margin
from tenure.leases._async.lease import AsyncLease
from tenure.leases.models import Grant
from tenure.scheduler.bodies import BodyLimit
from tenure.scheduler.claim import RunIdentity
from tenure.scheduler.context import JobContext
from tenure.scheduler.execution import Run, execute
from tenure.scheduler.spec import JobSpec

TTL = 3.0
LEFT = 0.05  # seconds of the lease left when the claim's answer came
HELD = 0.3  # seconds the renewal waits behind the test's row lock


async def _claimed(client: AsyncClient, spec: JobSpec, left: float | None = None) -> Run:
    """A run of ``spec``'s job under a lease taken now, as worker._launch builds it from a
    claim whose answer came with ``left`` seconds of the lease left (None: at once): its
    local deadline counts from when the claim was sent."""
    ttl = spec.ttl
    taken = await client.acquire(spec.key, ttl=ttl)
    assert taken is not None
    margin = default_margin(ttl)
    sent_at = time.monotonic() - (0.0 if left is None else ttl - margin - left)
    lease = AsyncLease(
        client,
        taken.job_key,
        taken.owner,
        Grant(taken.token, taken.expires_at),
        ttl=ttl,
        safety_margin=margin,
        sent_at=sent_at,
    )
    slot = dt.datetime.now(dt.UTC)
    ctx = JobContext(
        job_key=taken.job_key,
        token=taken.token,
        slot=slot,
        kind="scheduled",
        attempt=1,
        lease=lease,
        client=client,
        worker_id="test",
    )
    lease.on_lost(lambda lost: ctx._stop(lost.lost_reason or "the lease is lost"))
    ident = RunIdentity(taken.job_key, taken.token, taken.owner, slot, "scheduled", 1, slot)
    return Run(spec, ident, ctx, lease, time.monotonic())


def _job(ttl: float, began: list[float], sleep: float) -> JobSpec:
    """A job whose body notes how much of its lease was left as it began, then sleeps."""

    def body(ctx: tenure.JobContext) -> None:
        began.append(ctx.lease.deadline_in)
        time.sleep(sleep)

    app = tenure.Scheduler()
    app.add_job("late", body, every="1s", ttl=f"{ttl:g}s")
    return app.jobs["late"]


def test_a_run_claimed_just_before_its_local_deadline_renews_before_its_body_begins(
    dsn: str, schema: str
) -> None:
    began: list[float] = []
    # Its body runs longer than what was left of the lease when the claim came back.
    spec = _job(TTL, began, 0.2)

    async def main() -> tuple[str, str | None]:
        async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
            run = await _claimed(client, spec, LEFT)
            with _lease_row_locked(dsn, schema, "late", HELD):
                outcome, error, _took = await execute(run, BodyLimit(8, asyncio.Event()))
            await run.lease.stop_keeping()
            return outcome, error

    outcome, error = asyncio.run(main())
    # The body began on a renewed lease and ran to its end with it. (Before: it began with
    # 50 ms left, the renewal came back after the local deadline, and the run was lease_lost
    # although its body had run: its slot was retried.)
    assert began and began[0] > TTL / 3, began
    assert (outcome, error) == ("succeeded", None)


WAIT_TTL = 6.0


def test_a_run_whose_renewals_failed_while_it_waited_for_a_body_slot_does_not_begin(
    dsn: str, schema: str
) -> None:
    # The worker's one body slot is busy; the run waits for it, its lease renewed from ttl/3
    # on. Its renewals wait behind a row lock and fail (lock_timeout) until the slot frees
    # with less than a third of the lease left. A renewal failure means: start no new work.
    # (Before: the body began on what was left, 0.8 s, and the lease was lost while it ran.)
    began: list[float] = []
    spec = _job(WAIT_TTL, began, 1.5)

    async def main() -> tuple[str, str | None]:
        async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
            run = await _claimed(client, spec)
            limit = BodyLimit(1, asyncio.Event())
            busy = limit.take("another")
            assert busy is not None
            with _lease_row_locked(dsn, schema, "late", 7.5):
                task = asyncio.create_task(execute(run, limit))
                margin = default_margin(WAIT_TTL)
                await asyncio.sleep(WAIT_TTL - margin - 0.8)  # 0.8 s of the lease left
                assert not run.lease.lost and not task.done()
                limit.release(busy)
                limit.grant()
                outcome, error, _took = await task
            await run.lease.stop_keeping()
            return outcome, error

    outcome, error = asyncio.run(main())
    assert not began, began
    assert outcome == "lease_lost", (outcome, error)


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
