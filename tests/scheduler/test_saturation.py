"""A worker that cannot keep up says so (log line and metric) and degrades gracefully: every
slot it misses is recorded as skipped, none runs twice. And the batched finish records the
outcome of runs that end together."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import threading
import time
from typing import Any

import pytest

import tenure
from tenure import metrics
from tenure.scheduler import saturation
from tenure.scheduler.saturation import Saturation
from tests.scheduler.test_scheduler import captured
from tests.support.scheduler_support import InProcessWorker, prepare, query, wait_for

JOBS = 30


def slow(ctx: tenure.JobContext) -> None:
    time.sleep(0.1)


def test_a_worker_that_cannot_keep_up_says_it_is_saturated_and_records_every_skipped_slot(
    dsn: str, schema: str
) -> None:
    """30 jobs every second and one run at a time of 0.1 s: 30 runs/s asked, 10 done."""
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    uninstall = metrics.install_prometheus(registry)
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, concurrency=1)
    for i in range(JOBS):
        app.job(f"busy-{i:02d}", every="1s")(slow)
    events: list[metrics.Event] = []
    unsubscribe = metrics.subscribe(events.append)
    try:
        with captured() as records, InProcessWorker(app):
            wait_for(
                lambda: any(e.name == metrics.SATURATED for e in events),
                timeout=30,
                what="the worker to report saturation",
            )
            gauge = registry.get_sample_value("tenure_worker_saturated", {"app": app.name})
            # Saturation may first be reported for a run that started over a second late,
            # before any job came round again with a slot to skip: wait for the skips.
            wait_for(
                lambda: query(
                    dsn,
                    schema,
                    "SELECT 1 FROM {schema}.job_runs WHERE outcome = 'misfire_skipped'",
                ),
                timeout=30,
                what="a skipped slot to be recorded",
            )
    finally:
        unsubscribe()
        uninstall()
    first = next(e for e in events if e.name == metrics.SATURATED)
    assert (first.job, first.outcome, first.value) == (app.name, "saturated", 1.0)
    assert gauge == 1.0
    lines = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    said = [m for m in lines if " is saturated: it cannot keep up" in m]
    assert len(said) == 1, lines
    rows = query(
        dsn,
        schema,
        "SELECT job_key, slot, coalesce(last_slot, slot), slots, outcome FROM {schema}.job_runs "
        "WHERE kind = 'scheduled' ORDER BY job_key, slot",
    )
    assert any(outcome == "misfire_skipped" for *_, outcome in rows)
    by_job: dict[str, list[tuple[dt.datetime, dt.datetime, int]]] = {}
    for key, slot, last, count, _outcome in rows:
        assert (last - slot).total_seconds() == count - 1  # a run of skipped slots, counted
        by_job.setdefault(key, []).append((slot, last, count))
    for key, spans in by_job.items():
        times = [slot for slot, _last, _count in spans]
        assert len(times) == len(set(times)), f"{key}: a slot recorded twice"
        # From the first recorded slot to the last, every second has its row: run or skipped
        # (a row of skipped slots stands for every second from its slot to its last_slot).
        steps = {(b[0] - a[1]).total_seconds() for a, b in itertools.pairwise(spans)}
        assert steps <= {1.0}, f"{key}: a slot neither ran nor was recorded as skipped"


def test_saturation_counts_only_slots_due_while_the_worker_ran_and_recovers() -> None:
    events: list[metrics.Event] = []
    unsubscribe = metrics.subscribe(events.append)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    try:
        s = Saturation("w1", "app")
        s.started(t0)
        assert not s.counts(t0 - dt.timedelta(seconds=1))  # a backlog from before its start
        assert s.counts(t0)
        s.observe(0, [0.01, saturation.LAG / 2], now=100.0)
        assert not s.saturated and events == []
        s.observe(0, [saturation.LAG + 0.5], now=101.0)
        assert s.saturated
        s.observe(3, [], now=102.0)  # still saturated: no second event, no second line
        s.observe(0, [], now=102.0 + saturation.WINDOW - 0.5)  # not yet
        assert s.saturated
        s.observe(0, [], now=102.0 + saturation.WINDOW + 0.5)
        assert not s.saturated
    finally:
        unsubscribe()
    assert [(e.name, e.job, e.outcome, e.value) for e in events] == [
        (metrics.SATURATED, "app", "saturated", 1.0),
        (metrics.SATURATED, "app", "ok", 0.0),
    ]


async def _anoop(ctx: tenure.JobContext) -> None:
    pass


def test_runs_that_end_together_are_all_recorded(dsn: str, schema: str) -> None:
    """Many jobs due at once on a worker with room for all: their ends go to the database in
    batches (see Worker._finish_batches); each run still gets its own outcome, its lease is
    released and its slot is done."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, concurrency=64)
    keys = [f"many-{i:02d}" for i in range(40)]
    for key in keys:
        app.job(key, every="1s")(_anoop)
    with InProcessWorker(app):
        wait_for(
            lambda: _finished_per_job(dsn, schema) >= 3,
            timeout=30,
            what="3 finished runs of every job",
        )
    rows = query(
        dsn,
        schema,
        "SELECT r.outcome, count(*) FROM {schema}.job_runs AS r "
        "WHERE r.started_at IS NOT NULL GROUP BY r.outcome",
    )
    outcomes: dict[str, Any] = dict(rows)
    assert set(outcomes) <= {"succeeded", "cancelled"}, outcomes
    [(live, running)] = query(
        dsn,
        schema,
        "SELECT (SELECT count(*) FROM {schema}.job_leases WHERE lease_until > clock_timestamp()),"
        " (SELECT count(*) FROM {schema}.scheduled_jobs WHERE running_slot IS NOT NULL"
        "  AND done_slot IS DISTINCT FROM running_slot)",
    )
    assert live == 0  # every finish released its lease
    assert running <= outcomes.get("cancelled", 0)  # only runs cut by the stop stay open


def _finished_per_job(dsn: str, schema: str) -> int:
    [(least,)] = query(
        dsn,
        schema,
        "SELECT coalesce(min(n), 0) FROM (SELECT count(*) FILTER (WHERE outcome = 'succeeded')"
        " AS n FROM {schema}.scheduled_jobs AS j LEFT JOIN {schema}.job_runs AS r"
        " USING (job_key) GROUP BY j.job_key) AS c",
    )
    return int(least)


def test_sync_bodies_ending_together_wake_the_loop_once_not_once_each() -> None:
    """Each wake-up from a thread is a byte in the event loop's self-pipe, which is also its
    signal wake-up fd: 1,024 bodies ending at once filled it, a SIGTERM was lost and the
    worker never stopped. Outcomes queued while the loop is busy share one wake-up."""
    from tenure.scheduler.execution import in_thread

    bodies = 200
    ended = 0
    lock = threading.Lock()

    def body(ctx: Any) -> int:
        nonlocal ended
        with lock:
            ended += 1
        return 7

    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        wakeups = 0
        original = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakeups
            wakeups += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        gate = threading.Event()
        futures = [
            in_thread(lambda ctx: gate.wait(30) and body(ctx), None, f"t{i}", lambda cpu: None)
            for i in range(bodies)
        ]
        gate.set()
        while ended < bodies:  # the loop stays busy (blocked) while every body ends
            time.sleep(0.01)
        time.sleep(0.2)  # and while they hand their outcomes over
        results = await asyncio.gather(*futures)
        return results, wakeups

    results, wakeups = asyncio.run(main())
    assert results == [7] * bodies
    assert wakeups <= bodies // 10, wakeups


def test_slots_held_up_by_another_holders_lease_are_not_the_workers_saturation(
    dsn: str, schema: str
) -> None:
    """A holder that froze or died with a job's lease (here: a lease taken and never renewed)
    keeps the job's slots from every worker until the lease expires. The worker that then
    takes the job over and skips the slots in between is not falling behind: before, it said
    it was saturated (seen in the observability scenario, whose stalled worker had claimed a
    job ahead of its slot)."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    app.add_job("held", lambda ctx: None, every="1s", ttl="5s")
    app.register()
    with tenure.connect(dsn, schema=schema) as client:
        assert client.acquire("held", ttl="3s") is not None
    events: list[metrics.Event] = []
    unsubscribe = metrics.subscribe(events.append)
    try:
        with captured() as records, InProcessWorker(app):
            wait_for(
                lambda: query(
                    dsn,
                    schema,
                    "SELECT 1 FROM {schema}.job_runs WHERE job_key = 'held' "
                    "AND started_at IS NOT NULL",
                ),
                timeout=20,
                what="the run after the lease expired",
            )
    finally:
        unsubscribe()
    # The scenario happened: slots came due under the other lease and were skipped...
    assert query(
        dsn,
        schema,
        "SELECT 1 FROM {schema}.job_runs WHERE job_key = 'held' AND outcome = 'misfire_skipped' "
        "LIMIT 1",
    )
    # ...and the worker did not call that its own falling behind.
    assert [e for e in events if e.name == metrics.SATURATED] == []
    assert not [r for r in records if "saturated" in r.getMessage()]
