"""A job that blocks its worker's event loop (sync code inside ``async def``) loses its
lease under a live worker (issue 29). The worker says so: a WARNING naming the job and how
long the loop was blocked, and the ``tenure_worker_loop_lag_seconds`` gauge. And such runs do
not count toward quarantine, which is for runs whose worker really died: two real worker
processes take the job over from each other run after run, and it is never quarantined."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.env import tenure_env
from tests.support.scheduler_support import WorkerProcess, prepare, query
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

KEY = "blocks-loop"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def test_a_job_blocking_its_workers_loop_is_reported_and_never_quarantined(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    pytest.importorskip("prometheus_client", reason="the `prometheus` extra is not installed")
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    ports = [free_port(), free_port()]
    workers = [
        WorkerProcess(
            "blocker", env, tmp_path / f"worker{i}.log", args=["--metrics-port", str(port)]
        )
        for i, port in enumerate(ports)
    ]
    try:
        for w in workers:
            w.wait_started()
        # Four runs: without the fix the fourth claim quarantines the job (three runs in a
        # row "ended with their worker gone", the default quarantine_after).
        deadline = time.monotonic() + 90
        while True:
            [(started, paused)] = query(
                dsn,
                schema,
                "SELECT (SELECT count(*) FROM {schema}.job_runs WHERE job_key = %s), paused "
                "FROM {schema}.scheduled_jobs WHERE job_key = %s",
                (KEY, KEY),
            )
            if started >= 5 or paused:
                break
            assert time.monotonic() < deadline, [w.log() for w in workers]
            assert all(w.proc.poll() is None for w in workers), [w.log() for w in workers]
            time.sleep(0.2)
        assert all(w.proc.poll() is None for w in workers), [w.log() for w in workers]
        scraped = [scrape(port) for port in ports]
    finally:
        for w in workers:
            w.stop()
    logs = [w.log() for w in workers]
    [(paused, reason, streak)] = query(
        dsn,
        schema,
        "SELECT paused, quarantine_reason, crash_streak FROM {schema}.scheduled_jobs "
        "WHERE job_key = %s",
        (KEY,),
    )
    assert (paused, reason, streak) == (False, None, 0), logs
    errors = [
        r[0]
        for r in query(
            dsn, schema, "SELECT error FROM {schema}.job_runs WHERE job_key = %s", (KEY,)
        )
    ]
    assert not any("worker gone" in (e or "") for e in errors), errors

    # The warning names the job and the time the loop was blocked (the job sleeps 4 s).
    lags = [
        float(m.group(1))
        for text in logs
        for m in re.finditer(rf"event loop was blocked for ([0-9.]+)s .*{KEY}", text)
    ]
    assert lags, logs
    assert max(lags) >= 3.0, lags
    # The gauge: the longest block each worker measured in the last minute, on its endpoint.
    gauges = []
    for text in scraped:
        [sample] = [
            line for line in text.splitlines() if line.startswith("tenure_worker_loop_lag_seconds{")
        ]
        assert "app=" in sample, sample
        gauges.append(float(sample.rsplit(" ", 1)[1]))
    assert max(gauges) >= 3.0, scraped
