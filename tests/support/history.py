"""A run history to look at plans with (``job_runs`` as workers leave it, at a size where the
planner's choices show), and the scans a plan makes on ``job_runs``."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

#: The busy job: its rows are the newest of the table, as a job running every few seconds
#: has them.
BUSY = "job-000"
#: A typical job: a few dozen rows spread over the week, among every other job's.
TYPICAL = "job-042"

_FILL = """
INSERT INTO {schema}.scheduled_jobs
    (job_key, every, timezone, ttl, misfire, on_crash, defined_at, defined_by, next_slot)
SELECT format('job-%%s', lpad(i::text, 3, '0')), interval '1 minute', 'UTC', interval '30 s',
       'latest', 'retry', now(), 't', now() + interval '1 minute'
FROM generate_series(0, %(jobs)s - 1) AS i;

INSERT INTO {schema}.job_state (job_key, token) SELECT job_key, 1 FROM {schema}.scheduled_jobs;

-- Every job's runs over the last week, round-robin. Some starts also skipped slots: their
-- row is written by the start, recorded just after the run's start; the run's row is written
-- at its end (so the two are in one order by run_id, in the other by recorded_at).
WITH starts AS (
    SELECT n, format('job-%%s', lpad((n %% %(jobs)s)::text, 3, '0')) AS job_key,
           n / %(jobs)s + 1 AS token,
           now() - interval '7 days' * (1 - n::float8 / (%(jobs)s * %(per_job)s)) AS at
    FROM generate_series(0, %(jobs)s * %(per_job)s - 1) AS n
)
INSERT INTO {schema}.job_runs
    (job_key, slot, kind, token, worker_id, host, pid, started_at, finished_at, outcome,
     error, recorded_at)
SELECT x.job_key, CASE WHEN x.skipped THEN x.at - interval '1 minute' ELSE x.at END,
       'scheduled', x.token, 'w', 'h', 1, CASE WHEN NOT x.skipped THEN x.at END,
       x.at + CASE WHEN x.skipped THEN interval '1 ms' ELSE interval '1 s' END,
       CASE WHEN x.skipped THEN 'misfire_skipped' WHEN x.n %% 7 = 0 THEN 'failed'
            ELSE 'succeeded' END,
       CASE WHEN x.skipped THEN 'missed' END,
       x.at + CASE WHEN x.skipped THEN interval '1 ms' ELSE interval '0' END
FROM (
    SELECT s.*, false AS skipped FROM starts AS s
    UNION ALL
    SELECT s.*, true FROM starts AS s WHERE s.token %% %(skip_every)s = 0
) AS x
ORDER BY x.n, x.skipped DESC;

-- The busy job: one run every few seconds, ending now.
INSERT INTO {schema}.job_runs
    (job_key, slot, kind, token, worker_id, host, pid, started_at, finished_at, outcome,
     recorded_at)
SELECT %(busy_key)s, s.at, 'scheduled', 1000 + n, 'w', 'h', 1, s.at, s.at + interval '1 s',
       'succeeded', s.at
FROM generate_series(1, %(busy)s) AS n,
     LATERAL (SELECT now() - (%(busy)s - n + 1) * interval '5 s' AS at) AS s;

-- A run in progress (its 'running' row, written a second after its start).
INSERT INTO {schema}.job_runs
    (job_key, slot, kind, token, worker_id, host, pid, started_at, outcome, recorded_at)
VALUES (%(typical_key)s, now(), 'scheduled', 999999, 'w', 'h', 1, now(), 'running', now())
"""


def fill(
    dsn: str,
    schema: str,
    *,
    jobs: int = 300,
    per_job: int = 40,
    busy: int = 20_000,
    skip_every: int = 10,
) -> None:
    """``jobs`` scheduled jobs with ``per_job`` runs each over the last week (every
    ``skip_every``th start with a skipped slots' row), ``busy`` more on :data:`BUSY`, then
    ``VACUUM ANALYZE`` (a week of history has been through autovacuum). ``schema`` is
    migrated already."""
    params = {
        "jobs": jobs,
        "per_job": per_job,
        "busy": busy,
        "skip_every": skip_every,
        "busy_key": BUSY,
        "typical_key": TYPICAL,
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in _FILL.split(";\n"):
            if statement.strip():
                conn.execute(sql.SQL(statement).format(schema=sql.Identifier(schema)), params)
        for table in ("scheduled_jobs", "job_state", "job_runs"):
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, table)))


def scans(dsn: str, statement: bytes, params: dict[str, Any], table: str = "job_runs") -> set[str]:
    """The indexes of ``table`` the plan of ``statement`` reads (``"Seq Scan"`` for a scan of
    the whole table). Whether an index scan is index-only is left out: that depends on the
    visibility map, which VACUUM cannot set while another session's snapshot is older."""
    with psycopg.connect(dsn) as conn:
        [(doc,)] = conn.execute(b"EXPLAIN (FORMAT JSON) " + statement, params).fetchall()
        conn.rollback()
    found: set[str] = set()
    todo = [doc[0]["Plan"]]
    while todo:
        node = todo.pop()
        todo.extend(node.get("Plans", []))
        index = node.get("Index Name", "")
        # A bitmap index scan names its index only; the heap scan above it, the table.
        if index.startswith(table + "_") or (
            node.get("Relation Name") == table and node["Node Type"] == "Seq Scan"
        ):
            found.add(index or "Seq Scan")
    return found


def rows_read(dsn: str, statement: bytes, params: dict[str, Any], table: str = "job_runs") -> int:
    """How many rows of ``table`` running ``statement`` read (returned or filtered out by its
    scans, over all their loops): what a plan costs whichever index it picked."""
    with psycopg.connect(dsn) as conn:
        [(doc,)] = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchall()
        conn.rollback()
    read = 0
    todo = [doc[0]["Plan"]]
    while todo:
        node = todo.pop()
        todo.extend(node.get("Plans", []))
        if node.get("Relation Name") == table:
            seen = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            read += (seen + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
    return read
