"""The workers page: which worker runs what, from the runs they recorded (job_runs) and
the workers' presence rows (scheduler_workers, migration 13)."""

from __future__ import annotations

import psycopg

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
