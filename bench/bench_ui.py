#!/usr/bin/env python
"""Dashboard benchmark: how fast the pages answer with a big history.

Builds a schema with N scheduled jobs (default 10,000) and M runs in their history (default
1,000,000: 90 % spread evenly over the last 7 days, 10 % on one busy job, one run every few
seconds), plus failures, lost leases and refused writes. Then, for each page, requests it
through the dashboard's ASGI app in this process (no network: routing, queries, rendering)
and, side by side, runs the page's main named query alone through plain psycopg.

    python bench/bench_ui.py                    # 10,000 jobs, 1,000,000 runs (~2-3 min)
    python bench/bench_ui.py --quick            # 1,000 jobs, 100,000 runs (~20 s)
    python bench/bench_ui.py --requests 100 --dsn postgresql://user@host/db
    python bench/bench_ui.py --no-write-cost    # the readers only
    python bench/bench_ui.py --no-write-cost --compare 1d97c61   # readers, old and new text

Prints p50 / p95 / max in milliseconds per page, then the readers of the same history
outside the dashboard (`tenure jobs list` and `history`, the metrics' per-job query, `tenure
status`: their named query alone, p50 / p95), with a fixed Python loop (``sum(i*i for i in
range(10**7))``) timed before and after those rows. ``--compare REF``: the same readers' named
statements as git REF has them and as this tree has them, alternating on the same history
(REF's side with ``job_runs_history``, created for it if this tree's schema dropped it, and
then also without it: REF's processes on this schema; issue 28). Then the write-side cost of
the dashboard's live updates: migration 6's statement triggers on job_runs (one NOTIFY per
statement), measured as a run's start and finish statements (INSERT + UPDATE, autocommit)
with the triggers enabled and disabled, in alternating rounds; and the same with migration
9's timeline indexes and with migration 6's, alternating. Times are what the server spends; a
browser adds the network and its own rendering. Exits non-zero only when a page does not
answer 200. Works in its own schema (bench_ui_<random>), dropped at the end (--keep keeps it).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import tenure
from tenure.db.queries import compose, named, queries
from tenure.ui import Dashboard
from tenure.ui.queries import ui_queries

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"

FILL = """
INSERT INTO {schema}.scheduled_jobs
    (job_key, every, timezone, ttl, misfire, on_crash, defined_at, defined_by, next_slot,
     paused)
SELECT format('job-%%s', lpad(i::text, 5, '0')), interval '1 minute', 'UTC', interval '30 s',
       'latest', 'retry', now(), 'bench', now() + (i %% 60) * interval '1 s', i %% 50 = 7
FROM generate_series(0, %(jobs)s - 1) AS i;

INSERT INTO {schema}.job_state (job_key, token)
SELECT job_key, 1000000 FROM {schema}.scheduled_jobs;

INSERT INTO {schema}.job_leases
    (job_key, lease_owner, lease_until, fencing_token, lease_ttl, acquired_at, renewed_at)
SELECT job_key, gen_random_uuid(),
       CASE WHEN right(job_key, 1) = '3' THEN now() + interval '20 s'
            ELSE now() - interval '10 s' END,
       1000000, interval '30 s', now() - interval '10 s', now() - interval '10 s'
FROM {schema}.scheduled_jobs;

-- Even history: %(even)s runs, round-robin over the jobs, one slot every 7 days / per-job.
INSERT INTO {schema}.job_runs
    (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
     finished_at, outcome, error, recorded_at)
SELECT format('job-%%s', lpad((n %% %(jobs)s)::text, 5, '0')), s.slot, 'scheduled', 1,
       n / %(jobs)s + 1, gen_random_uuid(), 'worker-' || (n %% 3), 'bench', 1000 + n %% 3,
       s.slot + interval '15 ms', s.slot + interval '1.2 s',
       CASE WHEN n %% 97 = 0 THEN 'failed' WHEN n %% 991 = 0 THEN 'lease_lost'
            ELSE 'succeeded' END,
       CASE WHEN n %% 97 = 0 THEN 'RuntimeError: upstream answered 502' END,
       s.slot + interval '15 ms'
FROM generate_series(0, %(even)s - 1) AS n,
     LATERAL (SELECT date_trunc('minute', now())
                     - (%(even)s / %(jobs)s - n / %(jobs)s) * (interval '7 days'
                        / greatest(1, %(even)s / %(jobs)s)) AS slot) AS s;

-- The busy job: %(busy)s runs ending now, one every %(step)s seconds.
INSERT INTO {schema}.job_runs
    (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
     finished_at, outcome, error, recorded_at)
SELECT 'job-00000', s.slot, 'scheduled', 1, 100000 + n, gen_random_uuid(),
       'worker-' || (n %% 3), 'bench', 1000 + n %% 3, s.slot + interval '40 ms',
       s.slot + interval '2 s',
       CASE WHEN n %% 500 = 1 THEN 'stale_rejected' ELSE 'succeeded' END,
       CASE WHEN n %% 500 = 1 THEN 'stale fencing token (bench)' END,
       s.slot + interval '40 ms'
FROM generate_series(1, %(busy)s) AS n,
     LATERAL (SELECT now() - (%(busy)s - n + 1) * %(step)s * interval '1 s' AS slot) AS s;
ANALYZE {schema}.scheduled_jobs;
ANALYZE {schema}.job_leases;
"""

# A week of history has been through autovacuum (insert-driven since PostgreSQL 13): the
# visibility map lets a dense timeline count from the index alone (migration 9).
SETTLE = "VACUUM (ANALYZE) {schema}.job_runs"


async def asgi_get(app: Any, path: str, query: str) -> tuple[int, int]:
    """One GET through the ASGI app, in process: (status, body bytes)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1),
        "server": ("bench", 80),
    }
    status = 0
    size = 0
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, size
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            size += len(message.get("body", b""))

    await app(scope, receive, send)
    return status, size


def reference_loop() -> float:
    """Seconds a fixed Python loop takes now (the machine's speed beside timed rows)."""
    began = time.perf_counter()
    sum(i * i for i in range(10**7))
    return round(time.perf_counter() - began, 2)


def other_readers(dsn: str, schema: str, requests: int) -> None:
    """The history's readers outside the dashboard, their named query alone."""
    q = queries(schema)
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("tenure jobs list", "sched_list", {}),
        ("tenure jobs history, typical job", "sched_history", {"job_key": "job-00042"}),
        ("tenure jobs history, busy job", "sched_history", {"job_key": "job-00000"}),
        ("metrics: every job's last success", "observe_jobs", {}),
        ("tenure status (1 h)", "status_jobs", {"window": dt.timedelta(hours=1)}),
    ]
    print(f"{'reader':<34} {'sql p50':>8} {'sql p95':>8}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for label, name, params in cases:
            params = {"limit": 20, **params}
            conn.execute(q[name], params).fetchall()  # warm-up
            ms: list[float] = []
            for _ in range(requests):
                t0 = time.perf_counter()
                conn.execute(q[name], params).fetchall()
                ms.append((time.perf_counter() - t0) * 1000)
            print(f"{label:<34} {statistics.median(ms):>8.1f} {pct(ms, 0.95):>8.1f}", flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


#: The history's readers, as (label, statement, parameters), for --compare.
READERS: list[tuple[str, str, dict[str, Any]]] = [
    ("overview (job counts)", "ui_overview_jobs", {}),
    (
        "jobs: page 1, by key",
        "ui_jobs_page",
        {"state": "all", "sort": "key", "desc": False, "search": None, "offset": 0},
    ),
    (
        "jobs: by last run",
        "ui_jobs_by_last",
        {"state": "all", "sort": "last", "desc": True, "search": None, "offset": 0},
    ),
    (
        "jobs: failing only",
        "ui_jobs_by_last",
        {"state": "failing", "sort": "key", "desc": False, "search": None, "offset": 0},
    ),
    ("job page history, typical job", "ui_history", {"job_key": "job-00042"}),
    ("job page history, busy job", "ui_history", {"job_key": "job-00000"}),
    ("tenure jobs list", "sched_list", {}),
    ("tenure jobs history, typical job", "sched_history", {"job_key": "job-00042", "limit": 20}),
    ("tenure jobs history, busy job", "sched_history", {"job_key": "job-00000", "limit": 20}),
    ("metrics: every job's last success", "observe_jobs", {}),
]
_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)


def statements_at(ref: str) -> dict[str, str]:
    """git REF's named statements of tenure.db and tenure.ui, fragments filled in, as
    tenure.db.queries.named reads them from the installed package."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, check=True
        ).stdout

    found: dict[str, str] = {}
    for package in ("db", "ui"):
        own: dict[str, str] = {}
        fragments: dict[str, str] = {}
        for path in sorted(
            git("ls-tree", "--name-only", ref, f"src/tenure/{package}/sql/").split()
        ):
            if not path.endswith(".sql"):
                continue
            parts = _BLOCK.split(git("show", f"{ref}:{path}"))
            for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
                text = "\n".join(
                    line for line in body.strip().splitlines() if not line.lstrip().startswith("--")
                )
                (own if kind == "name" else fragments)[name] = text
        for name, body in own.items():
            for fragment, text in fragments.items():
                body = body.replace("{" + fragment + "}", text)
            found[name] = body
    return found


def compare_readers(dsn: str, schema: str, ref: str, requests: int, rounds: int) -> None:
    """Each reader's statement as git REF has it and as this tree has it, on the same history,
    in alternating rounds; REF's side with job_runs_history (created for it when this tree's
    migrations dropped it), this tree's side with the schema as migrated. Where the index was
    created, REF's statements are also timed without it (a process of REF's version on this
    tree's schema), three times a round."""
    old = statements_at(ref)
    new = {**named("tenure.db"), **named("tenure.ui")}
    index = sql.Identifier(schema, "job_runs_history")
    per: dict[tuple[str, str], list[float]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        has_index = bool(
            conn.execute(
                "SELECT FROM pg_indexes WHERE schemaname = %s AND indexname = 'job_runs_history'",
                (schema,),
            ).fetchall()
        )
        sides = [("before", old), ("after", new)] + ([] if has_index else [("old code", old)])
        for _ in range(rounds):
            for side, texts in sides:
                if not has_index:
                    if side == "before":
                        conn.execute(
                            sql.SQL("CREATE INDEX {} ON {} (job_key, run_id)").format(
                                sql.Identifier("job_runs_history"),
                                sql.Identifier(schema, "job_runs"),
                            )
                        )
                    else:
                        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(index))
                for label, name, params in READERS:
                    statement = compose(texts[name], schema)
                    params = {"limit": 50, **params}
                    conn.execute(statement, params).fetchall()  # warm-up
                    for _ in range(3 if side == "old code" else requests):
                        t0 = time.perf_counter()
                        conn.execute(statement, params).fetchall()
                        per.setdefault((label, side), []).append((time.perf_counter() - t0) * 1000)
        if not has_index:
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(index))
    late = "" if has_index else f" {ref + ' p50 here':>18}"
    print(
        f"{'reader (sql alone, ms)':<34} {ref + ' p50':>14} {'p95':>7} {'this p50':>9} "
        f"{'p95':>7} {'p50 ratio':>9}{late}"
    )
    for label, _name, _params in READERS:
        a, b = per[(label, "before")], per[(label, "after")]
        here = per.get((label, "old code"))
        print(
            f"{label:<34} {statistics.median(a):>14.1f} {pct(a, 0.95):>7.1f} "
            f"{statistics.median(b):>9.1f} {pct(b, 0.95):>7.1f} "
            f"{statistics.median(b) / statistics.median(a):>9.2f}"
            + (f" {statistics.median(here):>18.1f}" if here else ""),
            flush=True,
        )


async def measure(dsn: str, schema: str, requests: int) -> int:
    dashboard = Dashboard(dsn, schema=schema)
    q = ui_queries(schema)
    now = dt.datetime.now(dt.UTC)
    cases: list[tuple[str, str, str, str, dict[str, Any]]] = [
        ("overview", "/", "", "ui_overview_jobs", {}),
        (
            "jobs: page 1, by key",
            "/jobs",
            "",
            "ui_jobs_page",
            {"state": "all", "sort": "key", "desc": False, "search": None, "offset": 0},
        ),
        (
            "jobs: page 150, by key",
            "/jobs",
            "page=150",
            "ui_jobs_page",
            {"state": "all", "sort": "key", "desc": False, "search": None, "offset": 7450},
        ),
        (
            "jobs: by next slot, desc",
            "/jobs",
            "sort=next&desc=1",
            "ui_jobs_page",
            {"state": "all", "sort": "next", "desc": True, "search": None, "offset": 0},
        ),
        (
            "jobs: by last run",
            "/jobs",
            "sort=last&desc=1",
            "ui_jobs_by_last",
            {"state": "all", "sort": "last", "desc": True, "search": None, "offset": 0},
        ),
        (
            "jobs: failing only",
            "/jobs",
            "state=failing",
            "ui_jobs_by_last",
            {"state": "failing", "sort": "key", "desc": False, "search": None, "offset": 0},
        ),
        (
            "jobs: search '123'",
            "/jobs",
            "q=123",
            "ui_jobs_page",
            {"state": "all", "sort": "key", "desc": False, "search": "123", "offset": 0},
        ),
    ]
    for label, window, seconds in (
        ("newest runs", "", None),
        ("1h", "&window=1h", 3600),
        ("7d", "&window=7d", 7 * 86400),
    ):
        since = now - dt.timedelta(seconds=seconds or 28 * 86400)
        for key, what in (("job-00000", "busy job"), ("job-00042", "typical job")):
            # The SQL side: the window's first rows; a dense window's one-pass query too
            # (the busy job's 1h and 7d).
            dense = seconds is not None and key == "job-00000"
            cases.append(
                (
                    f"timeline: {what}, {label}",
                    "/job",
                    f"key={key}{window}",
                    "ui_timeline+dense" if dense else "ui_timeline",
                    {
                        "job_key": key,
                        "since": since,
                        "limit": 401,
                        "stride": (now - since) / 200,
                        # What the dense query took before migration 9 (to bench that code).
                        "lo": since.timestamp(),
                        "hi": now.timestamp(),
                        "buckets": 200,
                    },
                )
            )
    cases.append(
        (
            "leases: page 1",
            "/leases",
            "",
            "ui_leases",
            {"search": None, "offset": 0, "limit": 200},
        )
    )
    failures = 0
    print(f"{'page':<34} {'bytes':>8} {'app p50':>8} {'app p95':>8} {'app max':>8} {'sql p95':>8}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for label, path, query, name, params in cases:
            params = {"limit": 50, **params}
            for _ in range(3):  # warm-up: pool, caches, templates
                await asgi_get(dashboard.app, path, query)
            app_ms: list[float] = []
            size = 0
            for _ in range(requests):
                t0 = time.perf_counter()
                status, size = await asgi_get(dashboard.app, path, query)
                app_ms.append((time.perf_counter() - t0) * 1000)
                if status != 200:
                    failures += 1
            sql_ms: list[float] = []
            for _ in range(requests):
                t0 = time.perf_counter()
                for part in name.split("+"):
                    conn.execute(
                        q[part if part.startswith("ui_") else f"ui_timeline_{part}"], params
                    ).fetchall()
                sql_ms.append((time.perf_counter() - t0) * 1000)
            print(
                f"{label:<34} {size:>8} {statistics.median(app_ms):>8.1f} "
                f"{pct(app_ms, 0.95):>8.1f} {max(app_ms):>8.1f} {pct(sql_ms, 0.95):>8.1f}",
                flush=True,
            )
    await dashboard.close()
    return failures


class RunPairs:
    """A run's start (INSERT) and finish (UPDATE) on ``job_runs``, as a worker sends them,
    timed in microseconds per statement over ``statements`` statements."""

    def __init__(self, schema: str, job_key: str, kind: str) -> None:
        ident = sql.Identifier(schema)
        self.insert = sql.SQL(
            "INSERT INTO {}.job_runs (job_key, slot, kind, token, owner, worker_id, host, pid, "
            "started_at, outcome) VALUES ({}, clock_timestamp(), {}, %s, "
            "gen_random_uuid(), 'w', 'h', 1, clock_timestamp(), 'running')"
        ).format(ident, sql.Literal(job_key), sql.Literal(kind))
        self.update = sql.SQL(
            "UPDATE {}.job_runs SET outcome = 'succeeded', finished_at = clock_timestamp() "
            "WHERE job_key = {} AND token = %s AND started_at IS NOT NULL"
        ).format(ident, sql.Literal(job_key))
        self.token = 0

    def time(self, conn: psycopg.Connection[Any], statements: int) -> float:
        t0 = time.perf_counter()
        for _ in range(statements // 2):
            self.token += 1
            conn.execute(self.insert, (self.token,))
            conn.execute(self.update, (self.token,))
        return (time.perf_counter() - t0) / statements * 1e6


def trigger_cost(dsn: str, schema: str, statements: int = 1000, rounds: int = 4) -> None:
    ident = sql.Identifier(schema)
    pairs = RunPairs(schema, "trigger-bench", "manual")
    per_side: dict[str, list[float]] = {"triggers on": [], "triggers off": []}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(rounds):
            for side in per_side:
                verb = "ENABLE" if side == "triggers on" else "DISABLE"
                for name in ("job_runs_ui_insert", "job_runs_ui_update"):
                    conn.execute(
                        sql.SQL("ALTER TABLE {}.job_runs {} TRIGGER {}").format(
                            ident, sql.SQL(verb), sql.Identifier(name)
                        )
                    )
                per_side[side].append(pairs.time(conn, statements))
        for name in ("job_runs_ui_insert", "job_runs_ui_update"):
            conn.execute(
                sql.SQL("ALTER TABLE {}.job_runs ENABLE TRIGGER {}").format(
                    ident, sql.Identifier(name)
                )
            )
    on, off = (statistics.median(per_side[k]) for k in ("triggers on", "triggers off"))
    print(
        f"run start/finish statement: {on:.0f} us with the notify triggers, {off:.0f} us "
        f"without ({on / off:.2f}x; median of {rounds} rounds of {statements} statements)"
    )


def index_cost(dsn: str, schema: str, statements: int = 1000, rounds: int = 3) -> None:
    """The same start/finish pair with migration 9's timeline indexes and with migration 6's
    (job_runs_timeline alone), alternating: outcome is now in an index, so a run's finishing
    UPDATE can no longer be a HOT update (no index entry) even when its page has room."""
    ident = sql.Identifier(schema)
    pairs = RunPairs(schema, "index-bench", "scheduled")
    new = sql.SQL(
        "CREATE INDEX job_runs_window ON {0}.job_runs (job_key, recorded_at) "
        "INCLUDE (outcome, kind, slot); CREATE INDEX job_runs_notable ON {0}.job_runs "
        "(job_key, recorded_at) WHERE outcome <> 'succeeded' OR attempt > 1; "
        "DROP INDEX {0}.job_runs_timeline"
    ).format(ident)
    old = sql.SQL(
        "CREATE INDEX job_runs_timeline ON {0}.job_runs (job_key, recorded_at); "
        "DROP INDEX {0}.job_runs_window; DROP INDEX {0}.job_runs_notable"
    ).format(ident)
    per_side: dict[str, list[float]] = {"migration 9": [], "migration 6": []}
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not conn.execute(
            "SELECT FROM pg_indexes WHERE schemaname = %s AND indexname = 'job_runs_window'",
            (schema,),
        ).fetchall():
            print("(no migration 9 here: index write cost not measured)")
            return
        for _ in range(rounds):
            for side in per_side:
                if side == "migration 6":
                    conn.execute(old)
                per_side[side].append(pairs.time(conn, statements))
                if side == "migration 6":
                    conn.execute(new)
    now, before = (statistics.median(per_side[k]) for k in per_side)
    print(
        f"run start/finish statement: {now:.0f} us with migration 9's indexes, {before:.0f} us "
        f"with migration 6's ({now / before:.2f}x; median of {rounds} rounds of {statements} "
        "statements)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TENURE_DSN") or DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40, help="requests per page")
    parser.add_argument("--quick", action="store_true", help="1,000 jobs, 100,000 runs")
    parser.add_argument("--keep", action="store_true", help="keep the schema afterwards")
    parser.add_argument(
        "--compare",
        metavar="REF",
        help="also run the history's readers as git REF has them, side by side, alternating",
    )
    parser.add_argument("--compare-rounds", type=int, default=3, help="rounds of --compare")
    parser.add_argument(
        "--no-write-cost",
        action="store_true",
        help="leave out the triggers' and indexes' write-side cost (the readers only)",
    )
    parser.add_argument(
        "--no-vacuum",
        action="store_true",
        help="skip the VACUUM after the fill (history that autovacuum has not reached yet)",
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.runs = 1000, 100_000
    schema = f"bench_ui_{secrets.token_hex(4)}"
    busy = args.runs // 10
    even = args.runs - busy
    step = 7 * 86400 / busy
    with tenure.connect(args.dsn, schema=schema, migrate=True):
        pass
    try:
        t0 = time.monotonic()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            params = {"jobs": args.jobs, "even": even, "busy": busy, "step": step}
            for statement in FILL.split(";\n"):
                if statement.strip():
                    text = sql.SQL(statement).format(schema=sql.Identifier(schema))  # type: ignore[arg-type]
                    conn.execute(text, params)
            if not args.no_vacuum:
                conn.execute(sql.SQL(SETTLE).format(schema=sql.Identifier(schema)))
            else:
                conn.execute(sql.SQL("ANALYZE {}.job_runs").format(sql.Identifier(schema)))
            [(runs,)] = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.job_runs").format(sql.Identifier(schema))
            ).fetchall()
        print(
            f"schema {schema}: {args.jobs:,} jobs, {runs:,} runs "
            f"({busy:,} on job-00000, one every {step:.1f}s), built in "
            f"{time.monotonic() - t0:.0f}s; {args.requests} requests per page, in process",
            flush=True,
        )
        before = reference_loop()
        failures = asyncio.run(measure(args.dsn, schema, args.requests))
        other_readers(args.dsn, schema, args.requests)
        if args.compare:
            compare_readers(args.dsn, schema, args.compare, args.requests, args.compare_rounds)
        after = reference_loop()
        print(
            f"reference: sum(i*i for i in range(10**7)) took {before:.2f} s before these rows "
            f"and {after:.2f} s after them",
            flush=True,
        )
        if not args.no_write_cost:
            trigger_cost(args.dsn, schema)
            index_cost(args.dsn, schema)
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    if failures:
        print(f"{failures} request(s) did not answer 200", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
