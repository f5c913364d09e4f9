"""job_runs' indexes (issue 28): what a run's history row costs to write, and that every reader
of the history still finds its rows through an index.

Every run inserts one row into job_runs, and each index it goes into is one more entry to
write (WAL and CPU per run); each index led by job_key keeps a leaf page per busy job hot
(tenure doctor's memory check). The readers that want a job's newest rows read them through
job_runs_window (job_key, recorded_at) or job_runs_run (job_key, token): see the comments
of sched_list and sched_history (scheduler.sql) for why their order is the one users saw.
"""

from __future__ import annotations

import datetime as dt
import threading

import psycopg
from psycopg import sql

import tenure
from tenure.db.channels import channel
from tenure.db.queries import query as named_query
from tenure.observability.doctor import BUFFERS_PER_JOB
from tenure.scheduler import jobs as ops
from tests.support.history import BUSY, TYPICAL, fill, rows_read, scans
from tests.support.scheduler_apps import NEVER
from tests.support.scheduler_support import InProcessWorker, prepare, query, wait_for

PAGE = 8192


def _indexes_of(dsn: str, schema: str, run_id: int) -> tuple[set[str], set[str]]:
    """The indexes of job_runs that hold the row ``run_id`` (a partial index: its predicate
    holds for the row), and which of those lead with job_key."""
    held: set[str] = set()
    led: set[str] = set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        indexes = conn.execute(
            "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid), a.attname "
            "FROM pg_index AS i "
            "JOIN pg_class AS c ON c.oid = i.indexrelid "
            "JOIN pg_class AS t ON t.oid = i.indrelid "
            "JOIN pg_namespace AS n ON n.oid = t.relnamespace "
            "JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
            "WHERE n.nspname = %s AND t.relname = 'job_runs'",
            (schema,),
        ).fetchall()
        for name, predicate, first in indexes:
            if predicate is not None:
                [(holds,)] = conn.execute(
                    sql.SQL("SELECT {} FROM {} WHERE run_id = %s").format(
                        sql.SQL(predicate), sql.Identifier(schema, "job_runs")
                    ),
                    (run_id,),
                ).fetchall()
                if not holds:
                    continue
            held.add(name)
            if first == "job_key":
                led.add(name)
    return held, led


def test_a_runs_history_row_goes_into_four_indexes_two_of_them_led_by_its_job(
    dsn: str, schema: str
) -> None:
    """A run that succeeded on its first attempt (nearly every run) writes its row into the
    primary key, job_runs_recorded (retention, the overview's windows), job_runs_run (the
    finish's ON CONFLICT) and job_runs_window (the timeline, and every job's newest run). It
    went into job_runs_history (job_key, run_id) too, which the readers of the newest runs
    walked backwards; they read job_runs_window or job_runs_run now (migration 19)."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    app.add_job("k", lambda ctx: None, cron=NEVER, ttl="30s")
    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        ops.trigger(client, "k", channel=channel("jobs", schema))
        [(run_id,)] = wait_for(
            lambda: query(
                dsn, schema, "SELECT run_id FROM {schema}.job_runs WHERE outcome = 'succeeded'"
            ),
            timeout=20,
            what="the run",
        )
    held, led = _indexes_of(dsn, schema, run_id)
    assert held == {"job_runs_pkey", "job_runs_recorded", "job_runs_run", "job_runs_window"}
    assert led == {"job_runs_run", "job_runs_window"}
    # tenure doctor's memory check: a leaf page of each job_key-led index, twice over.
    assert 2 * len(led) * PAGE == BUFFERS_PER_JOB


def test_the_readers_of_the_newest_runs_use_the_window_and_run_indexes(
    dsn: str, schema: str
) -> None:
    """With a week of history the newest rows of a job are found through an index led by its
    key, for every job in the lists: never by walking the primary key backwards (the whole
    table for a job without recent runs) nor by reading all of a job's rows to sort them."""
    prepare(dsn, schema)
    fill(dsn, schema)
    window, run = "job_runs_window", "job_runs_run"
    expected = {
        # Each job's newest ended row; the ended run of the same claim (same token) only
        # when that row is a skipped slot's.
        "sched_list": ({}, {window, run}),
        "sched_history": ({"job_key": TYPICAL, "limit": 20}, {window}),
        # The newest success by token; the oldest row from the index alone.
        "observe_jobs": ({}, {run, window}),
    }
    plans = {
        name: scans(dsn, named_query(schema, name), params)
        for name, (params, _) in expected.items()
    }
    assert plans == {name: found for name, (_, found) in expected.items()}
    # The busy job's newest rows are among the newest of the table: about as many rows as
    # asked are read, newest first, whichever index does it; not all of its 20,000 sorted.
    params = {"job_key": BUSY, "limit": 20}
    assert rows_read(dsn, named_query(schema, "sched_history"), params) <= 2 * 20 + 10


def test_the_newest_run_is_the_run_its_start_began_after_skipping_slots(
    dsn: str, schema: str
) -> None:
    """A start that skips slots records them (one row) microseconds after the run it starts,
    whose row is written when the run ends: newest by recorded_at the skipped slots' row
    comes first, newest by run_id the run. `tenure jobs list` shows the run as the job's
    last, and `tenure jobs history` lists it above the slots skipped before it, as before
    migration 19."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    ran = threading.Event()

    @app.job("hourly", every="1h", ttl="30s")
    def hourly(ctx: tenure.JobContext) -> None:
        ran.set()

    app.register()
    # Five slots due at once (every worker was down): the newest runs, four are skipped.
    query(
        dsn,
        schema,
        "UPDATE {schema}.scheduled_jobs SET next_slot = next_slot - interval '5 hours' "
        "WHERE job_key = 'hourly'",
    )
    with tenure.connect(dsn, schema=schema) as client:
        with InProcessWorker(app):
            assert ran.wait(20)
            wait_for(
                lambda: query(
                    dsn,
                    schema,
                    "SELECT 1 FROM {schema}.job_runs WHERE outcome = 'succeeded'",
                ),
                timeout=20,
                what="the run's row",
            )
        rows = query(
            dsn,
            schema,
            "SELECT outcome, run_id, recorded_at FROM {schema}.job_runs ORDER BY run_id",
        )
        [skipped, done] = rows
        # What makes the two orders differ (sched_start, sched_finish).
        assert (skipped[0], done[0]) == ("misfire_skipped", "succeeded")
        assert skipped[2] > done[2]
        [job] = ops.list_jobs(client)
        history = ops.history(client, "hourly")
    assert (job.last_outcome, job.last_slot) == ("succeeded", _slot(dsn, schema, done[1]))
    assert [(r.outcome, r.run_id) for r in history] == [
        ("succeeded", done[1]),
        ("misfire_skipped", skipped[1]),
    ]


def test_history_pages_by_run_id_whatever_the_starts_skipped(dsn: str, schema: str) -> None:
    """`tenure jobs history --limit N` returns the newest N rows by run_id, newest first,
    for a job whose every start also skipped slots (each start's rows out of recorded_at
    order), and on a busy job's history."""
    prepare(dsn, schema)
    fill(dsn, schema, jobs=50, per_job=40, busy=2000, skip_every=1)
    with tenure.connect(dsn, schema=schema) as client:
        for key in (TYPICAL, BUSY):
            every = query(
                dsn,
                schema,
                "SELECT run_id FROM {schema}.job_runs WHERE job_key = %s ORDER BY run_id DESC",
                (key,),
            )
            for limit in (1, 3, 4, 7, 20):
                got = [r.run_id for r in ops.history(client, key, limit=limit)]
                assert got == [r[0] for r in every[:limit]], (key, limit)


def _slot(dsn: str, schema: str, run_id: int) -> dt.datetime:
    [(slot,)] = query(
        dsn, schema, "SELECT slot FROM {schema}.job_runs WHERE run_id = %s", (run_id,)
    )
    return slot


def test_time_without_success_counts_from_the_newest_success_else_the_oldest_row(
    dsn: str, schema: str
) -> None:
    """The metrics' per-job query (observe_jobs): the newest success by token; for a job
    without one, the oldest history row (a skipped slot's too), else the registration."""
    prepare(dsn, schema)
    query(
        dsn,
        schema,
        "INSERT INTO {schema}.scheduled_jobs (job_key, every, timezone, ttl, misfire, on_crash, "
        "defined_at, defined_by, next_slot) SELECT k, interval '1 minute', 'UTC', "
        "interval '30 s', 'latest', 'retry', now() - interval '1 day', 't', now() "
        "FROM unnest(ARRAY['ok', 'failing', 'new']) AS k",
    )
    query(
        dsn,
        schema,
        "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
        "started_at, finished_at, outcome, recorded_at) VALUES "
        "('ok', now(), 'scheduled', 1, 'w', 'h', 1, now() - interval '300 s', "
        " now() - interval '299 s', 'succeeded', now() - interval '300 s'), "
        "('ok', now(), 'scheduled', 2, 'w', 'h', 1, now() - interval '100 s', "
        " now() - interval '99 s', 'failed', now() - interval '100 s'), "
        "('failing', now(), 'scheduled', 1, 'w', 'h', 1, NULL, now() - interval '600 s', "
        " 'misfire_skipped', now() - interval '600 s'), "
        "('failing', now(), 'scheduled', 2, 'w', 'h', 1, now() - interval '500 s', "
        " now() - interval '499 s', 'failed', now() - interval '500 s')",
    )
    with psycopg.connect(dsn) as conn:
        [(now,)] = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchall()
        rows = conn.execute(named_query(schema, "observe_jobs"), {}).fetchall()
    since = {r[0]: float(now) - float(r[7]) for r in rows}  # the instant each age counts from
    [(success, oldest, defined)] = query(
        dsn,
        schema,
        "SELECT extract(epoch FROM (SELECT finished_at FROM {schema}.job_runs "
        "WHERE job_key = 'ok' AND outcome = 'succeeded')), "
        "extract(epoch FROM (SELECT min(recorded_at) FROM {schema}.job_runs "
        "WHERE job_key = 'failing')), "
        "extract(epoch FROM (SELECT defined_at FROM {schema}.scheduled_jobs "
        "WHERE job_key = 'new'))",
    )
    # The ages were read a moment after `now`: each instant is at most that moment off.
    assert abs(since["ok"] - float(success)) < 5
    assert abs(since["failing"] - float(oldest)) < 5
    assert abs(since["new"] - float(defined)) < 5
