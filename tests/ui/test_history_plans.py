"""The dashboard's readers of the run history (issue 28): each finds its rows through an index
led by the job's key with a week of history, and a job's last run is its newest run that
started, also when its start recorded a skipped slot after it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tenure.ui.queries import ui_queries
from tests.support.history import BUSY, TYPICAL, fill, rows_read, scans
from tests.support.scheduler_support import prepare, query

RUN = "job_runs_run"
PAGE = {"search": None, "offset": 0, "limit": 50}


def test_the_dashboards_readers_of_the_newest_runs_use_the_window_and_run_indexes(
    dsn: str, schema: str
) -> None:
    """Every job's last run (the overview's counts, the jobs list, its 'failing' filter and
    'last run' sort) is one backward step on job_runs_run per job; a job's newest runs (its
    page's history) the newest of an index read backwards. Never the primary key walked
    backwards from the newest row of the table, nor all of a job's rows read and sorted."""
    prepare(dsn, schema)
    fill(dsn, schema)
    now = dt.datetime.now(dt.UTC)
    q = ui_queries(schema)
    expected: dict[str, tuple[str, dict[str, Any], set[str]]] = {
        "overview": ("ui_overview_jobs", {}, {RUN}),
        "jobs page": (
            "ui_jobs_page",
            {**PAGE, "state": "all", "sort": "key", "desc": False},
            {RUN},
        ),
        "jobs by last run": (
            "ui_jobs_by_last",
            {**PAGE, "state": "all", "sort": "last", "desc": True},
            {RUN},
        ),
        "failing jobs": (
            "ui_jobs_by_last",
            {**PAGE, "state": "failing", "sort": "key", "desc": False},
            {RUN},
        ),
        "throughput": (
            "ui_throughput_job",
            {
                "job_key": TYPICAL,
                "since": now - dt.timedelta(days=7),
                "until": now,
                "stride": dt.timedelta(hours=1),
                "limit": 200,
            },
            {"job_runs_window"},
        ),
    }
    plans = {what: scans(dsn, q[name], params) for what, (name, params, _) in expected.items()}
    assert plans == {what: found for what, (_, _, found) in expected.items()}
    # A job's newest runs (its page's history): about as many rows as shown, whichever index
    # reads them newest first (the busy job's are among the newest of the whole table), not
    # all of its 20,000 sorted.
    for key in (TYPICAL, BUSY):
        params = {"job_key": key, "limit": 50}
        used = scans(dsn, q["ui_history"], params)
        assert not [s for s in used if s == "Seq Scan" or s.endswith("_pkey")], used
        assert rows_read(dsn, q["ui_history"], params) <= 2 * 50 + 10, key


def _last(dsn: str, schema: str) -> dict[str, tuple[Any, ...]]:
    """Each job's last run as the jobs list, its 'failing' filter and the overview see it."""
    q = ui_queries(schema)
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        page = conn.execute(
            q["ui_jobs_page"], {**PAGE, "state": "all", "sort": "key", "desc": False}
        ).fetchall()
        by_last = conn.execute(
            q["ui_jobs_by_last"], {**PAGE, "state": "all", "sort": "last", "desc": True}
        ).fetchall()
        failing = conn.execute(
            q["ui_jobs_by_last"], {**PAGE, "state": "failing", "sort": "key", "desc": False}
        ).fetchall()
        [overview] = conn.execute(q["ui_overview_jobs"], {}).fetchall()
    seen = {r["job_key"]: (r["outcome"], r["token"]) for r in page}
    assert {r["job_key"]: (r["outcome"], r["token"]) for r in by_last} == seen
    assert [r["job_key"] for r in failing] == [
        k for k, (o, _) in sorted(seen.items()) if o == "failed"
    ]
    assert overview["failing"] == len(failing)
    return seen


def test_a_jobs_last_run_is_its_newest_run_that_started(dsn: str, schema: str) -> None:
    """A start that resolves a crashed run writes that run's row (lease_lost), then the row of
    its slot, given up (abandoned: on_crash='skip'), microseconds after the run it starts;
    that run's own row is written when it ends. The jobs list shows the newest run that
    started (by token, as `tenure status` does): the run that start began once it ended (here
    it failed: the job is failing), the crashed run while it goes on. Newest by recorded_at
    the abandoned slot would come first in both."""
    prepare(dsn, schema)
    query(
        dsn,
        schema,
        "INSERT INTO {schema}.scheduled_jobs (job_key, every, timezone, ttl, misfire, on_crash, "
        "defined_at, defined_by, next_slot) SELECT k, interval '1 minute', 'UTC', "
        "interval '30 s', 'latest', 'skip', now(), 't', now() + interval '1 minute' "
        "FROM unnest(ARRAY['ended', 'going']) AS k",
    )
    columns = (
        "job_key, slot, kind, token, worker_id, host, pid, started_at, finished_at, outcome, error"
    )
    for key in ("ended", "going"):
        # Token 1 ran and succeeded; token 2's worker died; token 3's start resolves it.
        query(
            dsn,
            schema,
            f"INSERT INTO {{schema}}.job_runs ({columns}, recorded_at) VALUES "
            "(%s, now() - interval '2 minutes', 'scheduled', 1, 'w', 'h', 1, "
            " now() - interval '2 minutes', now() - interval '2 minutes', 'succeeded', NULL, "
            " now() - interval '2 minutes'), "
            "(%s, now() - interval '1 minute', 'scheduled', 2, 'w', 'h', 1, "
            " now() - interval '1 minute', now(), 'lease_lost', 'its worker is gone', "
            " now() - interval '1 minute')",
            (key, key),
        )
        [(started,)] = query(dsn, schema, "SELECT clock_timestamp()")
        query(
            dsn,
            schema,
            f"INSERT INTO {{schema}}.job_runs ({columns}) VALUES "
            "(%s, now() - interval '1 minute', 'scheduled', 3, 'w', 'h', 1, NULL, "
            " clock_timestamp(), 'abandoned', 'not retried: on_crash=''skip''')",
            (key,),
        )
        if key == "ended":
            query(
                dsn,
                schema,
                f"INSERT INTO {{schema}}.job_runs ({columns}, recorded_at) VALUES "
                "(%s, now(), 'scheduled', 3, 'w', 'h', 1, %s, clock_timestamp(), 'failed', "
                " 'boom', %s)",
                (key, started, started),
            )
    order = query(
        dsn,
        schema,
        "SELECT outcome FROM {schema}.job_runs WHERE job_key = 'ended' "
        "ORDER BY recorded_at DESC LIMIT 2",
    )
    assert order == [("abandoned",), ("failed",)]  # what the two orders disagree on
    assert _last(dsn, schema) == {"ended": ("failed", 3), "going": ("lease_lost", 2)}
