"""A job that kills its worker process (os._exit: what a segfault or the OOM killer does)
must not walk through the fleet: after N consecutive runs that ended with their worker gone
it is quarantined (paused, with a reason), and the other jobs miss no slot. Real worker
processes, restarted by the test as a supervisor would."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tenure.observability import exporter
from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_apps import POISON_EXIT
from tests.support.scheduler_support import WorkerProcess, prepare, query

pytestmark = pytest.mark.slow

SECOND = dt.timedelta(seconds=1)


def jobs_json(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = run_tenure(["jobs", "list", "--json"], env)
    assert done.returncode == 0, done.stderr
    return {job["job"]: job for job in json.loads(done.stdout)}


def quarantined_gauge(dsn: str, schema: str) -> dict[str, float]:
    """tenure_job_quarantined as the metrics endpoint exports it (read from the database)."""
    collector = exporter.DatabaseCollector(exporter.Database(dsn, schema))
    [family] = [f for f in collector.collect() if f.name == "tenure_job_quarantined"]
    return {sample.labels["job_key"]: sample.value for sample in family.samples}


def test_a_job_that_kills_its_worker_is_quarantined_and_its_neighbour_misses_no_slot(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    # The quarantine gauge is read as the metrics endpoint exports it (extra `prometheus`).
    pytest.importorskip("prometheus_client", reason="the `prometheus` extra is not installed")
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    started_workers = itertools.count()

    def start() -> WorkerProcess:
        return WorkerProcess("poison", env, tmp_path / f"worker{next(started_workers)}.log")

    workers = [start(), start()]
    deaths: list[int] = []
    try:

        def supervise() -> None:
            """Restart every worker that died (each death must be the poison's)."""
            for i, w in enumerate(workers):
                code = w.proc.poll()
                if code is not None:
                    assert code == POISON_EXIT, w.log()
                    deaths.append(code)
                    w.stop()
                    workers[i] = start()

        deadline = time.monotonic() + 60
        while not query(
            dsn, schema, "SELECT 1 FROM {schema}.scheduled_jobs WHERE job_key = 'poison' AND paused"
        ):
            assert time.monotonic() < deadline, (
                f"the poison job was not quarantined after {len(deaths)} worker deaths"
            )
            supervise()
            time.sleep(0.1)
        supervise()  # a death noticed only now, after the claim that quarantined the job
        # Quarantined; the fleet keeps running the innocent job for a while.
        for w in workers:
            w.wait_started()
        time.sleep(6)
        assert all(w.proc.poll() is None for w in workers), [w.log() for w in workers]
        [(stopped,)] = query(dsn, schema, "SELECT clock_timestamp()")
        for w in workers:
            w.signal(signal.SIGTERM)
        assert [w.wait(timeout=30) for w in workers] == [0, 0], [w.log() for w in workers]
    finally:
        for w in workers:
            w.stop()
    assert len(deaths) == 3  # the default quarantine_after

    # The innocent job missed no slot: from the first slot after it was registered to the
    # last before the workers stopped, every 1s slot has a successful run (a slot whose run
    # died with its worker was retried, so it may have run twice), none was skipped.
    [(registered,)] = query(
        dsn, schema, "SELECT defined_at FROM {schema}.scheduled_jobs WHERE job_key = 'innocent'"
    )
    slots = [
        row[0]
        for row in query(
            dsn,
            schema,
            "SELECT DISTINCT slot FROM {schema}.job_runs "
            "WHERE job_key = 'innocent' AND outcome = 'succeeded' ORDER BY slot",
        )
    ]
    assert slots[0] <= registered + SECOND, (slots[0], registered)
    assert slots[-1] >= stopped - 2.5 * SECOND, (slots[-1], stopped)
    gaps = [(a, b) for a, b in itertools.pairwise(slots) if b - a != SECOND]
    assert gaps == [], f"the innocent job missed slots: {gaps}"
    evidence = {
        row[0]
        for row in query(
            dsn, schema, "SELECT slot FROM {schema}.evidence WHERE job_key = 'innocent'"
        )
    }
    assert set(slots) <= evidence
    assert (
        query(
            dsn,
            schema,
            "SELECT outcome, count(*) FROM {schema}.job_runs WHERE job_key = 'innocent' "
            "AND outcome NOT IN ('succeeded', 'lease_lost') GROUP BY outcome",
        )
        == []
    )

    # The poison job: three runs of one slot ended with their worker gone, then quarantine.
    runs = query(
        dsn,
        schema,
        "SELECT attempt, outcome, error FROM {schema}.job_runs "
        "WHERE job_key = 'poison' ORDER BY run_id",
    )
    assert [(r[0], r[1]) for r in runs] == [
        (1, "lease_lost"),
        (2, "lease_lost"),
        (3, "lease_lost"),
        (1, "abandoned"),
    ], runs
    assert all("worker gone" in r[2] for r in runs[:3]), runs
    assert "quarantined" in runs[3][2]

    listed = jobs_json(env)
    assert listed["poison"]["paused"] is True
    reason = listed["poison"]["quarantined"]
    assert reason and "3 consecutive runs ended with their worker gone" in reason
    assert listed["innocent"]["quarantined"] is None
    table = run_tenure(["jobs", "list"], {**env, "COLUMNS": "200"})
    assert "quarantined" in table.stdout, table.stdout
    status = run_tenure(["status", "--json"], env)
    assert status.returncode == 0, status.stderr
    [poison_status] = [j for j in json.loads(status.stdout) if j["job"] == "poison"]
    assert poison_status["quarantined"] == reason

    assert quarantined_gauge(dsn, schema) == {"innocent": 0.0, "poison": 1.0}

    # `tenure jobs resume` lifts the quarantine (and the streak starts again).
    resumed = run_tenure(["jobs", "resume", "poison"], env)
    assert resumed.returncode == 0, resumed.stderr
    assert "quarantine lifted" in resumed.stdout
    after = jobs_json(env)["poison"]
    assert (after["paused"], after["quarantined"]) == (False, None)
    assert query(
        dsn, schema, "SELECT crash_streak FROM {schema}.scheduled_jobs WHERE job_key = 'poison'"
    ) == [(0,)]
    assert quarantined_gauge(dsn, schema) == {"innocent": 0.0, "poison": 0.0}
