"""A worker that says it stopped exits, whatever its job bodies do (issue 31): a sync body
that never returns and an async body that swallows CancelledError are recorded 'abandoned'
(their slots handed over), the process ends, and a slot whose runs keep refusing to stop is
quarantined as one whose runs keep killing their worker. Real worker processes, SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure.db.channels import channel
from tenure.scheduler import jobs as ops
from tests.support.env import tenure_env
from tests.support.scheduler_support import WorkerProcess, prepare, query, wait_for

pytestmark = pytest.mark.slow


def _trigger(dsn: str, schema: str, key: str) -> None:
    with tenure.connect(dsn, schema=schema) as client:
        ops.trigger(client, key, channel=channel("jobs", schema))


def _started(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT token FROM {schema}.evidence WHERE job_key = %s AND phase = 'started' "
        "ORDER BY token",
        (key,),
    )


def _run_until_stopped(dsn: str, schema: str, tmp_path: Path, key: str, n: int) -> WorkerProcess:
    """Start worker ``n``, wait for its run of ``key`` to start (its ``n``-th), SIGTERM it and
    wait for the process to end."""
    w = WorkerProcess("stubborn", tenure_env(dsn, schema), tmp_path / f"worker{n}.log")
    try:
        w.wait_started()
        if n == 1:
            _trigger(dsn, schema, key)
        wait_for(lambda: len(_started(dsn, schema, key)) >= n, timeout=20, what="the run")
        w.signal(signal.SIGTERM)
        # Before: alive (2 threads) long after it logged "stopped", or for ever.
        assert w.wait(timeout=30) == 0, w.log()
    finally:
        w.stop()
    assert " stopped: " in w.log(), w.log()
    return w


@pytest.mark.parametrize("key", ["stubborn-sync", "stubborn-async"])
def test_a_worker_whose_job_does_not_stop_exits_and_records_the_run_abandoned(
    dsn: str, schema: str, tmp_path: Path, key: str
) -> None:
    prepare(dsn, schema)
    w = _run_until_stopped(dsn, schema, tmp_path, key, 1)
    assert "1 left behind (did not stop)" in w.log(), w.log()
    [(token,)] = _started(dsn, schema, key)
    rows = query(
        dsn,
        schema,
        "SELECT token, outcome, error, finished_at IS NOT NULL FROM {schema}.job_runs "
        "WHERE job_key = %s",
        (key,),
    )
    # Before: 'cancelled' (sync: as if it had stopped) or 'running' for ever (async).
    assert [r[:2] for r in rows] == [(token, "abandoned")], rows
    assert "did not stop" in rows[0][2] and rows[0][3]
    # Handed over: the lease is released and the slot is due for the next worker at once.
    [(live, running)] = query(
        dsn,
        schema,
        "SELECT l.lease_until > clock_timestamp(), j.running_token FROM {schema}.job_leases "
        "AS l JOIN {schema}.scheduled_jobs AS j USING (job_key) WHERE job_key = %s",
        (key,),
    )
    assert (live, running) == (False, token)


def test_a_slot_whose_runs_keep_refusing_to_stop_is_quarantined(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """quarantine_after=2: the first run refuses, its retry refuses, the next claim
    quarantines the job instead of running it a third time."""
    prepare(dsn, schema)
    key = "stubborn-sync"
    for n in (1, 2):
        _run_until_stopped(dsn, schema, tmp_path, key, n)
    w = WorkerProcess("stubborn", tenure_env(dsn, schema), tmp_path / "worker3.log")
    try:
        w.wait_started()
        reason = wait_for(
            lambda: query(
                dsn,
                schema,
                "SELECT quarantine_reason FROM {schema}.scheduled_jobs "
                "WHERE job_key = %s AND paused",
                (key,),
            ),
            timeout=20,
            what="the job to be quarantined",
        )
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0, w.log()
    finally:
        w.stop()
    assert "2 consecutive runs" in reason[0][0], reason
    assert len(_started(dsn, schema, key)) == 2  # not run a third time
    outcomes = query(
        dsn,
        schema,
        "SELECT outcome FROM {schema}.job_runs WHERE job_key = %s AND started_at IS NOT NULL "
        "ORDER BY token",
        (key,),
    )
    assert outcomes == [("abandoned",), ("abandoned",)], outcomes
