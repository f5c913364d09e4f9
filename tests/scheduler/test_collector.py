"""The garbage collector in a worker process: ``tenure worker`` freezes what exists at start
(the app and its job definitions) and collects the young generation less often, because full
collections of a 120,000-job worker stopped its loop for 90-165 ms every 2-3 s
(``scheduler/collector.py``). A worker embedded in another program leaves that program's
collector alone."""

from __future__ import annotations

import gc
from pathlib import Path

import tenure
from tenure.scheduler.collector import GEN0_THRESHOLD
from tests.support.env import tenure_env
from tests.support.scheduler_support import (
    InProcessWorker,
    WorkerProcess,
    prepare,
    query,
    wait_for,
)


def test_a_tenure_worker_process_settles_its_collector(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    worker = WorkerProcess("collector_probe", tenure_env(dsn, schema), tmp_path / "w.log")
    try:
        worker.wait_started()
        [(phase,)] = wait_for(
            lambda: query(dsn, schema, "SELECT phase FROM {schema}.evidence LIMIT 1"),
            timeout=20,
            what="a run of gc-probe",
        )
    finally:
        worker.stop()
    assert phase == f"threshold={GEN0_THRESHOLD} frozen=True"


def test_an_embedded_worker_leaves_the_programs_collector_alone(dsn: str, schema: str) -> None:
    prepare(dsn, schema)
    before = (gc.get_threshold(), gc.get_freeze_count())
    seen: list[tuple[tuple[int, int, int], int]] = []
    app = tenure.Scheduler(dsn, schema=schema)
    app.add_job(
        "probe", lambda ctx: seen.append((gc.get_threshold(), gc.get_freeze_count())), every="1s"
    )
    with InProcessWorker(app):
        wait_for(lambda: seen, timeout=20, what="a run")
    assert seen[0] == before
