"""The workers page: which worker runs what, from the runs they recorded (job_runs) and
the workers' presence rows (scheduler_workers, migration 13)."""

from __future__ import annotations

import re
import time

import psycopg
import pytest

import tenure
from tenure.scheduler import presence
from tests.support.scheduler_support import InProcessWorker, prepare, wait_for
from tests.support.ui import register_job
from tests.ui.test_page_safety import pages


def test_the_workers_page_says_which_worker_runs_what(dsn: str, schema: str) -> None:
    for key in ("report", "sync"):
        register_job(dsn, schema, key)
    ident = psycopg.sql.Identifier(schema)
    run = psycopg.sql.SQL(
        "INSERT INTO {}.job_runs (job_key, slot, kind, attempt, token, worker_id, host, pid, "
        "started_at, finished_at, outcome, error) VALUES (%s, now(), 'manual', 1, %s, %s, "
        "%s, %s, now(), %s, %s, NULL)"
    ).format(ident)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(run, ("report", 1, "w-a", "host-a", 11, None, "running"))
        conn.execute(
            psycopg.sql.SQL(
                "UPDATE {}.scheduled_jobs SET running_slot = now(), running_token = 1 "
                "WHERE job_key = 'report'"
            ).format(ident)
        )
        for token in (1, 2):
            conn.execute(run, ("sync", token, "w-b", "host-b", 22, None, "failed"))
        conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {}.scheduler_workers (worker_id, app, job_keys, host, pid, "
                "seen_until) VALUES ('w-b', 'app:app', ARRAY['report', 'sync'], 'host-b', 22, "
                "now() + interval '1 minute')"
            ).format(ident)
        )
    [(status, page), (_s, overview)] = pages(dsn, schema, ("/workers", ""), ("/", ""))
    assert status == 200, page
    assert 'href="/workers"' in overview
    rows = page.split('<tr class="worker')[1:]
    assert len(rows) == 2, page
    a = next(r for r in rows if ">w-a<" in r)
    b = next(r for r in rows if ">w-b<" in r)
    assert "host-a" in a and "job?key=report" in a  # w-a runs report now
    assert "job?key=sync" not in a
    assert "app:app" in b and "alive" in b and "2 job(s)" in b  # presence row: defines 2
    assert "2 failed" in b and "job?key=report" not in b


def test_the_workers_page_shows_each_workers_loop_lag_and_saturation(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real worker (one body at a time) whose async job blocks its event loop for 1.5 s
    every second, beside ten jobs every second that it cannot keep up with: its presence beat
    carries the longest lag since the beat before and its saturation, and the page shows
    both on its row (the lag over the worker's own warning threshold: marked bad)."""
    monkeypatch.setattr(presence, "PRESENCE_EVERY", 0.3)
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, concurrency=1)

    @app.job("blocker", every="1s", ttl="30s")
    async def blocker(ctx: tenure.JobContext) -> None:
        time.sleep(1.5)  # sync work inside async def: the whole loop stops

    def busy(ctx: tenure.JobContext) -> None:
        time.sleep(0.2)

    for i in range(10):
        app.job(f"busy-{i}", every="1s")(busy)

    def page_shows_it() -> bool:
        [(status, page)] = pages(dsn, schema, ("/workers", ""))
        assert status == 200, page
        [row] = [r for r in page.split('<tr class="worker')[1:] if "alive" in r]
        lag = re.search(r'<td class="loop-lag"><span class="bad">([0-9.]+) s</span>', row)
        saturated = '<td class="saturation"><span class="state st-failing">saturated' in row
        return lag is not None and float(lag.group(1)) >= 1.0 and saturated

    with InProcessWorker(app):
        wait_for(page_shows_it, timeout=40, interval=0.2, what="the lag and saturation shown")
