#!/usr/bin/env python
"""Retention benchmark: history at its retention size, 5,000 runs/s more of it, the pruner
running alongside a run loop. Do the table and the run path's latency stay flat?

A scaled day: the retention is shortened from days to ``--retention`` seconds (default 120)
and the history is filled to its steady-state size for that retention at ``--rate`` rows per
second (default 5,000: 600,000 job_runs rows), spread evenly over the window. Then, for
``--duration`` seconds (default twice the retention, so every row present at the start is
replaced), three things run at once, each on its own connection:

* the writer: ``--rate`` new job_runs rows per second (the history of 5,000 runs/s), in
  batches every 0.1 s, plus a tenth of that in each of exec_runs, delivered outbox
  messages and inbox claims;
* the run loop: one run after another, as a worker records it: the lease takeover
  (``client.acquire``), the run's start record (INSERT into job_runs) and its finish
  (UPDATE), then the release; its latency per run is what a claim pays;
* the pruner: :func:`tenure.db.pruning.prune` over every table every ``--prune-every``
  seconds (default 10; a worker's is 600 s against a 7-day retention), batches of 5,000.

Deleted rows' space is reused once VACUUM has passed: autovacuum's job on a real server. A
test server often runs with autovacuum off; then (``--vacuum auto``) the pruner runs a plain
VACUUM of the tables after each pass, as autovacuum would, and says so.

Then a control of ``--control`` seconds (default 60) with the pruner stopped, and as long
again with it back (it catches up with the control's backlog). Every
``--slice`` seconds one line: rows (exact), table + index size,
rows pruned, and the run loop's p50 / p99 / max latency. Then the operator's read queries on
the table at its retention size: `tenure status` (observability.status.overview) and the
dashboard's job list, p50 of repeated calls.

    python bench/bench_retention.py                       # ~6 minutes
    python bench/bench_retention.py --retention 30 --duration 60 --control 30   # ~2 minutes

Works in its own schema (bench_retention_<random>), dropped at the end (--keep keeps it).
Never fails because something is slow; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

import tenure
from tenure.db import pruning
from tenure.db import retention as rt
from tenure.observability.status import overview

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
JOBS = 1000

FILL_RUNS = """
INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, started_at,
                               finished_at, outcome, recorded_at)
SELECT 'job-' || (n %% {jobs}), t, 'scheduled', n, 'bench', 'bench', 1, t, t, 'succeeded', t
FROM generate_series(1, %(n)s) AS n,
     LATERAL (SELECT clock_timestamp() - %(window)s::interval
                     + (n::float8 / %(n)s) * %(window)s::interval AS t) AS s
"""
FILL_SIDE = """
INSERT INTO {schema}.exec_runs (job_key, token, host, pid, started_at, outcome, recorded_at)
SELECT 'exec-' || (n %% 100), n + %(base)s, 'bench', 1, t, 'succeeded', t
FROM generate_series(1, %(n)s) AS n,
     LATERAL (SELECT clock_timestamp() - %(window)s::interval
                     + (n::float8 / %(n)s) * %(window)s::interval AS t) AS s;
INSERT INTO {schema}.outbox (topic, key, payload, state, delivered_at, created_at)
SELECT 'bench', 'm-' || (n + %(base)s), '{{}}', 'delivered', t, t
FROM generate_series(1, %(n)s) AS n,
     LATERAL (SELECT clock_timestamp() - %(window)s::interval
                     + (n::float8 / %(n)s) * %(window)s::interval AS t) AS s;
INSERT INTO {schema}.inbox (consumer, key, applied_at)
SELECT 'bench', 'm-' || (n + %(base)s), t
FROM generate_series(1, %(n)s) AS n,
     LATERAL (SELECT clock_timestamp() - %(inbox_window)s::interval
                     + (n::float8 / %(n)s) * %(inbox_window)s::interval AS t) AS s
"""
WRITE_RUNS = """
INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, started_at,
                               finished_at, outcome)
SELECT 'job-' || (n %% {jobs}), now(), 'scheduled', n + %(base)s, 'bench', 'bench', 1, now(),
       now(), 'succeeded'
FROM generate_series(1, %(n)s) AS n
"""
JOB_DEFS = """
INSERT INTO {schema}.scheduled_jobs (job_key, every, timezone, ttl, misfire, on_crash,
                                     defined_at, defined_by, next_slot)
SELECT 'job-' || n, interval '1 s', 'UTC', interval '30 s', 'latest', 'retry', now(), 'bench',
       now() + interval '1 hour'
FROM generate_series(0, {jobs} - 1) AS n
"""


RUN_COLUMNS = {
    "job_runs": "run_id, job_key, kind, attempt, token, owner, worker_id, host, pid, outcome, "
    "error",
    "exec_runs": "run_id, job_key, token, slot, host, pid, outcome, exit_code, error",
}
SPREAD = {
    table: [
        f"CREATE TEMP TABLE spread_{table} AS SELECT {cols}, now() - interval '7 days' * "
        f"(1 - row_number() OVER (ORDER BY run_id) / count(*) OVER ()::float8) AS t "
        f"FROM {{schema}}.{table}",
        f"TRUNCATE {{schema}}.{table}",
        f"INSERT INTO {{schema}}.{table} ({cols}, started_at, finished_at, recorded_at"
        + (", slot" if table == "job_runs" else "")
        + f") OVERRIDING SYSTEM VALUE SELECT {cols}, t, t + interval '50 ms', t"
        + (", t" if table == "job_runs" else "")
        + f" FROM spread_{table} ORDER BY run_id",
        f"DROP TABLE spread_{table}",
    ]
    for table, cols in RUN_COLUMNS.items()
}


def stmt(text: str, schema: str) -> sql.Composed:
    return sql.SQL(text.replace("{jobs}", str(JOBS))).format(schema=sql.Identifier(schema))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Shared:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.pruned = 0
        self.written = 0
        self.prune_on = threading.Event()
        #: What the pruner is doing now ("" idle, "deleting", "vacuuming"), and every run's
        #: latency by what the pruner was doing when the run started (whole run).
        self.activity = ""
        self.by_activity: dict[str, list[float]] = {"": [], "deleting": [], "vacuuming": []}


def writer(dsn: str, schema: str, rate: int, side: int, state: Shared) -> None:
    """``rate`` job_runs rows/s and ``side`` rows/s in each side table, every 0.1 s."""
    base = 10**9
    with psycopg.connect(dsn, autocommit=True) as conn:
        runs = stmt(WRITE_RUNS, schema)
        sides = [stmt(part, schema) for part in FILL_SIDE.split(";")]
        tick = time.monotonic()
        while not state.stop.is_set():
            per = max(1, rate // 10)
            conn.execute(runs, {"n": per, "base": base})
            base += per
            if side:
                params = {"n": max(1, side // 10), "base": base, "window": "0 s"}
                for part in sides:
                    conn.execute(part, {**params, "inbox_window": "0 s"})
            with state.lock:
                state.written += per
            tick += 0.1
            time.sleep(max(0.0, tick - time.monotonic()))


def run_loop(dsn: str, schema: str, state: Shared) -> None:
    """One run after another on rotating keys: takeover, start record, finish, release."""
    with (
        tenure.connect(dsn, schema=schema, pool_size=2) as client,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        insert = stmt(
            "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
            "started_at, outcome) VALUES (%(k)s, now(), 'scheduled', %(t)s, 'loop', 'bench', 1, "
            "now(), 'running') RETURNING run_id",
            schema,
        )
        finish = stmt(
            "UPDATE {schema}.job_runs SET outcome = 'succeeded', finished_at = now() "
            "WHERE run_id = %(id)s",
            schema,
        )
        i = 0
        while not state.stop.is_set():
            key = f"loop-{i % 50}"
            i += 1
            activity = state.activity
            t0 = time.perf_counter()
            lease = client.acquire(key, ttl=30)
            assert lease is not None
            [(run_id,)] = conn.execute(insert, {"k": key, "t": lease.token}).fetchall()
            conn.execute(finish, {"id": run_id})
            lease.release()
            elapsed = (time.perf_counter() - t0) * 1000
            with state.lock:
                state.latencies.append(elapsed)
                if activity == state.activity:  # the pruner did not change course meanwhile
                    state.by_activity[activity].append(elapsed)


def pruner(
    dsn: str, schema: str, policy: rt.Retention, every: float, vacuum: bool, state: Shared
) -> None:
    """A retention pass every ``every`` seconds; with ``vacuum``, a plain VACUUM of the
    pruned tables after it: what autovacuum does on a server where it is on (it reuses the
    deleted rows' space; it takes no lock that a claim or an insert would wait for)."""
    with (
        tenure.connect(dsn, schema=schema, pool_size=2) as client,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        while not state.stop.is_set():
            if state.prune_on.is_set():
                state.activity = "deleting"
                counts = pruning.prune(client, policy)
                state.activity = ""
                with state.lock:
                    state.pruned += sum(counts.values())
                if vacuum:
                    state.activity = "vacuuming"
                    for table in rt.NAMES:
                        conn.execute(
                            sql.SQL("VACUUM {}.{}").format(
                                sql.Identifier(schema), sql.Identifier(table)
                            )
                        )
                    state.activity = ""
            state.stop.wait(every)


def sizes(conn: psycopg.Connection[Any], schema: str) -> tuple[int, int]:
    """Exact rows of job_runs, and its size with indexes (what the disk holds)."""
    [(rows, size)] = conn.execute(
        stmt(
            "SELECT (SELECT count(*) FROM {schema}.job_runs), "
            "pg_total_relation_size(%(table)s::regclass)",
            schema,
        ),
        {"table": f"{sql.Identifier(schema).as_string()}.job_runs"},
    ).fetchall()
    return int(rows), int(size)


def timed(fn: Any, n: int) -> float:
    """Median milliseconds of ``n`` calls; NaN if one fails (tenure's 5 s statement timeout
    on a saturated machine), which the table then shows."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            fn()
        except (tenure.TenureError, psycopg.Error) as exc:
            print(f"  ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})")
            return float("nan")
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("TENURE_DSN", DEFAULT_DSN))
    ap.add_argument("--rate", type=int, default=5000, help="job_runs rows per second")
    ap.add_argument("--retention", type=float, default=120.0, help="scaled retention, seconds")
    ap.add_argument("--duration", type=float, default=None, help="with pruning [2x retention]")
    ap.add_argument("--control", type=float, default=60.0, help="without pruning, seconds")
    ap.add_argument("--prune-every", type=float, default=10.0)
    ap.add_argument("--slice", type=float, default=20.0)
    ap.add_argument(
        "--vacuum",
        choices=["auto", "yes", "no"],
        default="auto",
        help="VACUUM after each prune pass (auto: when the server's autovacuum is off)",
    )
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    duration = args.duration if args.duration is not None else 2 * args.retention
    schema = f"bench_retention_{secrets.token_hex(4)}"
    side = args.rate // 10
    # The inbox's floor is a day; the scaled inbox window is the history's, times 30/7.
    policy = rt.Retention(args.retention, args.retention * 30 / 7)
    with tenure.connect(args.dsn, schema=schema) as client:
        client.migrate()
    try:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            t0 = time.monotonic()
            n = int(args.rate * args.retention)
            window = f"{args.retention} s"
            conn.execute(stmt(JOB_DEFS, schema))
            conn.execute(stmt(FILL_RUNS, schema), {"n": n, "window": window})
            side_fill = {
                "n": int(side * args.retention),
                "base": 0,
                "window": window,
                "inbox_window": f"{policy.inbox} s",
            }
            for part in FILL_SIDE.split(";"):
                conn.execute(stmt(part, schema), side_fill)
            conn.execute(stmt("VACUUM ANALYZE {schema}.job_runs", schema))
            print(
                f"filled {n:,} job_runs rows (retention {args.retention:g}s at {args.rate:,}/s) "
                f"and {int(side * args.retention):,} in each side table in "
                f"{time.monotonic() - t0:.1f}s; schema {schema}"
            )
            report(args, duration, schema, policy, side, conn)
            read_side(args.dsn, schema, conn)
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )


def report(
    args: argparse.Namespace,
    duration: float,
    schema: str,
    policy: rt.Retention,
    side: int,
    conn: psycopg.Connection[Any],
) -> None:
    [(autovacuum,)] = conn.execute("SHOW autovacuum").fetchall()
    vacuum = {"auto": autovacuum != "on", "yes": True, "no": False}[args.vacuum]
    print(
        f"server autovacuum: {autovacuum}; the pruner "
        f"{'runs a plain VACUUM after each pass' if vacuum else 'leaves space to autovacuum'}"
    )
    state = Shared()
    state.prune_on.set()
    threads = [
        threading.Thread(target=writer, args=(args.dsn, schema, args.rate, side, state)),
        threading.Thread(target=run_loop, args=(args.dsn, schema, state)),
        threading.Thread(
            target=pruner,
            args=(args.dsn, schema, policy, args.prune_every, vacuum, state),
        ),
    ]
    for t in threads:
        t.start()
    print(
        f"\n{'phase':<10} {'t (s)':>6} {'job_runs rows':>14} {'size (MB)':>10} "
        f"{'written':>9} {'pruned':>9} {'runs':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}"
    )
    start = time.monotonic()
    # The control sits between two pruning stretches, so its latency is compared with
    # neighbours under the same outside load; the last stretch also eats its backlog.
    phases = [("pruning", duration), ("no prune", args.control), ("pruning", args.control)]
    try:
        elapsed = 0.0
        for phase, length in phases:
            if phase == "no prune":
                state.prune_on.clear()
            else:
                state.prune_on.set()
            end = elapsed + length
            while elapsed < end - 1e-6:
                step = min(args.slice, end - elapsed)
                time.sleep(max(0.0, start + elapsed + step - time.monotonic()))
                elapsed += step
                with state.lock:
                    lat, state.latencies = state.latencies, []
                    pruned, state.pruned = state.pruned, 0
                    written, state.written = state.written, 0
                rows, size = sizes(conn, schema)
                print(
                    f"{phase:<10} {elapsed:>6.0f} {rows:>14,} {size / 2**20:>10.1f} "
                    f"{written:>9,} {pruned:>9,} {len(lat):>6} {pct(lat, 0.5):>7.2f} "
                    f"{pct(lat, 0.99):>7.2f} {max(lat, default=float('nan')):>7.2f}",
                    flush=True,
                )
    finally:
        state.stop.set()
        for t in threads:
            t.join()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    # Runs interleaved at a fine grain with the pruner's work, so outside load hits all rows
    # alike: the fair comparison of what the pruner costs a run.
    print(
        f"\n{'runs, by what the pruner was doing':<36} {'runs':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7}"
    )
    names = {
        "": "nothing (idle or stopped)",
        "deleting": "a prune pass (batches)",
        "vacuuming": "VACUUM after the pass",
    }
    for activity, label in names.items():
        lat = state.by_activity[activity]
        print(
            f"{label:<36} {len(lat):>6} {pct(lat, 0.5):>7.2f} {pct(lat, 0.99):>7.2f} "
            f"{max(lat, default=float('nan')):>7.2f}"
        )


def read_side(dsn: str, schema: str, conn: psycopg.Connection[Any]) -> None:
    """The operator's reads on the table at its retention size: first as the scaled run
    left it (every row within the last hour, the window `tenure status` counts: its worst
    case), then with the same rows spread over a 7-day retention, as they would be."""
    from tenure.ui.queries import ui_queries

    [(rows,)] = conn.execute(stmt("SELECT count(*) FROM {schema}.job_runs", schema)).fetchall()
    queries = ui_queries(schema)
    by_last = {
        "state": "all",
        "sort": "last",
        "desc": True,
        "search": None,
        "offset": 0,
        "limit": 50,
    }
    print(f"\nreads on job_runs at {rows:,} rows ({JOBS:,} jobs), p50 of 5, ms:")
    print(f"{'history':<28} {'tenure status':>14} {'ui overview':>12} {'ui by last run':>15}")
    for shape in ("all in the last hour", "spread over 7 days"):
        if shape != "all in the last hour":
            # Rewritten in run_id order, as 7 days of appends would have laid them out (an
            # UPDATE would scatter the newest rows over the whole heap).
            for table in ("job_runs", "exec_runs"):
                for text in SPREAD[table]:
                    conn.execute(stmt(text, schema))
        for table in ("job_runs", "exec_runs"):
            conn.execute(stmt(f"VACUUM ANALYZE {{schema}}.{table}", schema))
        with tenure.connect(dsn, schema=schema, pool_size=2) as client:
            status_ms = timed(lambda: overview(client), 5)
        overview_ms = timed(lambda: conn.execute(queries["ui_overview_jobs"], {}).fetchall(), 5)
        last_ms = timed(lambda: conn.execute(queries["ui_jobs_by_last"], by_last).fetchall(), 5)
        print(f"{shape:<28} {status_ms:>14.1f} {overview_ms:>12.1f} {last_ms:>15.1f}")


if __name__ == "__main__":
    main()
