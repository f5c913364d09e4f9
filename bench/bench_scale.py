#!/usr/bin/env python
"""Scale-out: runs per second, slot lateness and skipped slots for 1, 2 and 4 worker
processes, with no-op jobs every second, every minute and on a cron, printed as one table.

    python bench/bench_scale.py                       # 2,000/s asked; 1, 2, 4 workers; 1s, 1m, cron
    python bench/bench_scale.py --rates 5000 10000 --workers 2 --schedules 1s
    python bench/bench_scale.py --compare HEAD~3      # each row also on an older commit
    python bench/bench_scale.py --quick               # 500 runs/s, 1s and 1m, 15 s windows
    python bench/bench_scale.py --kinds coded runtime # each row with coded jobs and with
                                                      # as many runtime schedules (issue 27)

A row asks for ``rate`` runs per second: ``rate`` jobs ``every="1s"``, ``rate * 60`` jobs
``every="60s"`` (their slots spread over the minute by the job key's phase), or ``rate * 60``
jobs on ``cron="* * * * *"`` (all due at the top of each minute: a burst). No job-count cap:
the count follows the rate. Everything is read from ``job_runs`` by the database clock, for
the slots in the window (after a warm-up):

* ``runs/s``: runs that started, divided by the window; for ``cron``, the window is one
  minute's burst (slots from 2 s before the minute to 59.5 s after) and runs/s is its runs
  divided by the lateness of the last one to start (its drain rate);
* ``late p50/p99/max``: ``started_at - slot`` of those runs, in ms;
* ``skipped``: slots recorded as misfire-skipped (a run of them is one history row with its
  count);
* ``behind``: slots due in the window with neither a run nor a skip row when the window
  ended (the backlog of a saturated worker, recorded as skipped or run later);
* ``dupes``: slots run twice. Anything but 0 is a failure: the script exits 1;
* ``early``: runs whose start was recorded before their slot by the database clock (a job
  claimed ahead of its slot must still start at it). Anything but 0 is a failure too;
* ``saturated``: the workers' "saturated" log lines (see ``tenure.scheduler.saturation``);
* ``loop s``: a fixed Python loop (``sum(i*i for i in range(10**7))``) timed just before the
  row: how fast this machine was then. The same code's lateness and skips move with it (on
  this 2-core machine it took 0.39 s on a fast day and 0.83 s on a slow one), so compare
  rows measured in one sitting, side by side (``--compare``), not across days.

``--compare REF`` runs every row twice, back to back: once with the workers importing tenure
from ``git archive REF`` (side ``before``), once with this checkout (``after``, or
``--after REF``), so both sides see the same load. The workers run with ``PYTHONPATH`` set to
the unpacked ``src/``, which comes before the editable install of this checkout. Each row
uses its own database, ``tenure_scale_<random>``, dropped after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench_scheduler import HERE, Workers, add_runtime, env_for, pick_dsn

SCHEMA = "scale"
SCHEDULES = {
    "1s": ("every", "1s", 1),
    "1m": ("every", "60s", 60),
    "cron": ("cron", "* * * * *", 60),
    # 100,000 jobs at ~167 runs/s: the scale of issue 27 at a rate a shared machine keeps up.
    "10m": ("every", "600s", 600),
}


def source_tree(ref: str, into: Path) -> Path:
    """``git archive REF src`` unpacked into ``into``; returns the directory to put on the path."""
    repo = HERE.parent
    into.mkdir(parents=True, exist_ok=True)
    tar_path = into / "src.tar"
    with open(tar_path, "wb") as out:
        subprocess.run(["git", "archive", ref, "src"], cwd=repo, stdout=out, check=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def worker_env(
    dsn: str, schedule: str, jobs: int, args: argparse.Namespace, src: Path | None
) -> dict[str, str]:
    kind, value, _period = SCHEDULES[schedule]
    env = env_for(dsn, SCHEMA, jobs, "load", args)
    env.update(
        BENCH_CRON=value if kind == "cron" else "",
        BENCH_EVERY=value if kind == "every" else "",
        BENCH_RUNTIME="1" if args.runtime else "0",
        BENCH_BODY=args.body,
    )
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    return env


#: The tables a worker writes on every run, whose size the timeline follows.
HOT_RELATIONS = ("scheduled_jobs", "scheduled_jobs_due", "job_leases", "job_state", "job_runs")


def sample_window(conn: psycopg.Connection[Any], window: float, every: float | None) -> list[Any]:
    """Sleep through the window; with ``every``, sample every ``every`` seconds the size of
    the hot relations (8 kB pages), their dead rows, and (when pg_stat_statements is loaded)
    each statement's calls and total execution time in this database."""
    if not every:
        time.sleep(window)
        return []
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        statements = True
    except psycopg.Error:
        statements = False
    samples: list[Any] = []
    deadline = time.monotonic() + window
    while True:
        (at,) = conn.execute("SELECT clock_timestamp()").fetchone() or (None,)
        sizes = dict(
            conn.execute(
                "SELECT c.relname, pg_relation_size(c.oid) / 8192 FROM pg_class AS c "
                "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = ANY(%s)",
                (SCHEMA, list(HOT_RELATIONS)),
            ).fetchall()
        )
        dead = dict(
            conn.execute(
                "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = %s",
                (SCHEMA,),
            ).fetchall()
        )
        calls: dict[str, tuple[int, float]] = {}
        if statements:
            for query, n, total in conn.execute(
                "SELECT query, calls, total_exec_time FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall():
                name = statement_name(query)
                if name:
                    before = calls.get(name, (0, 0.0))
                    calls[name] = (before[0] + n, before[1] + total)
        samples.append((at, sizes, dead, calls))
        left = deadline - time.monotonic()
        if left <= 0:
            return samples
        time.sleep(min(every, left))


def statement_name(query: str) -> str | None:
    """Which scheduler statement a pg_stat_statements query text is, by a phrase only that
    statement's text holds (checked in this order); any other statement on the bench's
    schema is "other" (the vacuum, its check, the pruner)."""
    for name, marker in (
        ("claim", "AS ready_at"),
        ("start", "running_started_at = CASE"),
        ("finish", "AS f(job_key text"),
        ("running", "'running'"),
    ):
        if marker in query:
            return name
    return None if "scale" not in query else "other"


def lateness_by_bucket(
    conn: psycopg.Connection[Any],
    t0: dt.datetime,
    end: dt.datetime,
    every: float | None,
    samples: list[Any],
) -> list[dict[str, Any]]:
    """Per bucket of ``every`` seconds of slots: lateness p50/p99/max, and the samples taken
    at the bucket's end (relation pages, dead rows, mean ms per statement in the bucket)."""
    if not every:
        return []
    q = sql.SQL(
        """
        SELECT floor(extract(epoch FROM slot - %s) / %s)::int AS bucket,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - slot)),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - slot)),
               max(extract(epoch FROM started_at - slot))
        FROM {schema}.job_runs
        WHERE slot >= %s AND slot < %s AND kind = 'scheduled' AND started_at IS NOT NULL
        GROUP BY 1 ORDER BY 1
        """
    ).format(schema=sql.Identifier(SCHEMA))
    rows = conn.execute(q, (t0, every, t0, end)).fetchall()
    out = []
    for bucket, p50, p99, worst in rows:
        entry: dict[str, Any] = {
            "from_s": bucket * every,
            "p50_ms": round(float(p50) * 1000, 1),
            "p99_ms": round(float(p99) * 1000, 1),
            "max_ms": round(float(worst) * 1000, 1),
        }
        if bucket + 1 < len(samples):
            (_a0, _s0, _d0, c0), (_a1, sizes, dead, c1) = samples[bucket], samples[bucket + 1]
            entry["pages"] = {k: sizes.get(k) for k in HOT_RELATIONS}
            entry["dead"] = {k: dead.get(k) for k in ("scheduled_jobs", "job_leases")}
            per_call = {}
            for k, (n1, total1) in c1.items():
                n0, total0 = c0.get(k, (0, 0.0))
                if n1 > n0:
                    per_call[k] = round((total1 - total0) / (n1 - n0), 2)
            if per_call:  # pg_stat_statements is loaded
                entry["ms_per_call"] = per_call
        out.append(entry)
    return out


#: --body mixed: the no-op jobs' keys (bench_scheduler.body_for: i % 10 == 0 sleeps 2 s,
#: i % 100 == 1 burns 100 ms of CPU).
NOOP_KEYS = sql.SQL(
    "substring(job_key from 5)::int %% 10 <> 0 AND substring(job_key from 5)::int %% 100 <> 1"
)


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process from /proc/<pid>/stat, in s (None: gone or unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the ")" that ends comm: field 3 (state) is index 0; utime, stime are fields 14, 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def costs_snapshot(conn: psycopg.Connection[Any], worker_pids: list[int]) -> dict[str, Any]:
    """What --costs differences: the workers' CPU, their backends' CPU (every other backend
    on the row's own database), committed transactions in it, row writes in the schema,
    and the server's WAL position (server-wide: other databases' writes count too)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    backends = [
        pid
        for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    ]
    row = conn.execute(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), "
        "(SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
        " FROM pg_stat_user_tables WHERE schemaname = %s), pg_current_wal_lsn()",
        (SCHEMA,),
    ).fetchone()
    assert row is not None
    return {
        "workers": {pid: cpu_seconds(pid) for pid in worker_pids},
        "backends": {pid: cpu_seconds(pid) for pid in backends},
        "xacts": int(row[0]),
        "writes": int(row[1]),
        "lsn": str(row[2]),
    }


def costs_per_run(
    conn: psycopg.Connection[Any], first: dict[str, Any], last: dict[str, Any], runs: int
) -> dict[str, Any]:
    """Per run started in the window. A backend that came or went inside the window counts
    from its first to its last reading (the pools keep theirs: few do)."""

    def spent(a: dict[int, float | None], b: dict[int, float | None]) -> float:
        return sum((b[p] or 0.0) - (a.get(p) or 0.0) for p in b if b[p] is not None)

    (wal,) = conn.execute(
        "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (last["lsn"], first["lsn"])
    ).fetchone() or (0,)
    n = max(runs, 1)
    return {
        "worker_cpu_ms": round(spent(first["workers"], last["workers"]) * 1000 / n, 3),
        "server_cpu_ms": round(spent(first["backends"], last["backends"]) * 1000 / n, 3),
        "xacts": round((last["xacts"] - first["xacts"]) / n, 2),
        "row_writes": round((last["writes"] - first["writes"]) / n, 2),
        "wal_bytes": round(float(wal) / n),
        "backends": len(last["backends"]),
    }


def expected_slots(schedule: str, jobs: int, start: dt.datetime, end: dt.datetime) -> int:
    """Slots of the row's jobs in [start, end), from tenure's own schedule code."""
    from tenure.scheduler.schedules import Schedule

    kind, value, _period = SCHEDULES[schedule]
    total = 0
    for i in range(jobs):
        key = f"job-{i:05d}"
        if kind == "cron":
            s = Schedule.build(key, cron=value)
        else:
            s = Schedule.build(key, every=dt.timedelta(seconds=SCHEDULES[schedule][2]))
        slot = s.next_after(start - dt.timedelta(microseconds=1))
        while slot < end:
            total += 1
            slot = s.next_after(slot)
    return total


def measure(
    base: str,
    rate: int,
    workers: int,
    schedule: str,
    args: argparse.Namespace,
    src: Path | None,
    logdir: Path,
    tag: str,
) -> dict[str, Any]:
    jobs = rate * SCHEDULES[schedule][2]
    window = args.duration if SCHEDULES[schedule][2] == 1 else max(args.duration, 65.0)
    dbname = f"tenure_scale_{secrets.token_hex(4)}"
    dsn = make_conninfo(base, dbname=dbname)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        env = worker_env(dsn, schedule, jobs, args, src)
        began_dir = logdir / f"began-{tag}-{dbname}"
        if args.body == "mixed":
            began_dir.mkdir()
            env["BENCH_BEGAN_DIR"] = str(began_dir)
        # With the side's own tenure: a side older than this checkout refuses a schema that
        # this checkout's migrations made newer than it knows.
        subprocess.run(
            [sys.executable, "-m", "tenure", "migrate", "--dsn", dsn, "--schema", SCHEMA],
            env=env,
            check=True,
            timeout=120,
            stdout=subprocess.DEVNULL,
        )
        added = None
        if args.runtime:  # the same keys and triggers as runtime schedules, in one statement
            kind, value, _period = SCHEDULES[schedule]
            added = add_runtime(
                dsn,
                SCHEMA,
                jobs,
                cron=value if kind == "cron" else None,
                every=value if kind == "every" else None,
            )
        # --stagger: one after another (a worker registering 100,000s of jobs while another
        # claims them may wait on row locks past the 5 s statement timeout; so may several
        # registering at once).
        procs = Workers(workers, env, logdir, tag, stagger=args.stagger)
        try:
            procs.wait_started(timeout=300)
            time.sleep(args.warmup)
            with psycopg.connect(dsn, autocommit=True) as conn:
                if SCHEDULES[schedule][0] == "cron":
                    # One burst: slots from 2 s before a minute to 59.5 s after it (the
                    # window's end minus 1 s; the next minute's slots fall outside).
                    (to_minute,) = conn.execute(
                        "SELECT 60 - extract(epoch FROM clock_timestamp())::numeric % 60"
                    ).fetchone() or (60,)
                    time.sleep(max(0.0, float(to_minute) - 2.0) % 60)
                    window = 62.5
                pids = [proc.pid for proc in procs.procs]
                first = costs_snapshot(conn, pids) if args.costs else None
                (t0,) = conn.execute("SELECT clock_timestamp()").fetchone() or (None,)
                samples = sample_window(conn, window, args.timeline)
                (t1,) = conn.execute("SELECT clock_timestamp()").fetchone() or (None,)
                last = costs_snapshot(conn, pids) if args.costs else None
                costs = None
                if first is not None and last is not None:
                    (started,) = conn.execute(
                        sql.SQL(
                            "SELECT count(*) FROM {}.job_runs WHERE kind = 'scheduled' "
                            "AND started_at >= %s AND started_at < %s"
                        ).format(sql.Identifier(SCHEMA)),
                        (t0, t1),
                    ).fetchone() or (0,)
                    costs = costs_per_run(conn, first, last, started)
        finally:
            codes = procs.stop()
        end = t1 - dt.timedelta(seconds=1)
        seconds = (end - t0).total_seconds()
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A side before schema version 13 has no `slots` column: one row per slot there.
            (has_slots,) = conn.execute(
                "SELECT count(*) > 0 FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = 'job_runs' AND column_name = 'slots'",
                (SCHEMA,),
            ).fetchone() or (False,)
            q = sql.SQL(
                """
                SELECT count(*) FILTER (WHERE started_at IS NOT NULL),
                       count(*) FILTER (WHERE started_at IS NOT NULL)
                           - count(DISTINCT (job_key, slot)) FILTER (WHERE started_at IS NOT NULL),
                       coalesce(sum({slots}) FILTER (WHERE outcome = 'misfire_skipped'), 0),
                       percentile_cont(0.5) WITHIN GROUP (
                           ORDER BY extract(epoch FROM started_at - slot)),
                       percentile_cont(0.99) WITHIN GROUP (
                           ORDER BY extract(epoch FROM started_at - slot)),
                       max(extract(epoch FROM started_at - slot)),
                       count(DISTINCT (job_key, slot)) + coalesce(sum({slots} - 1), 0),
                       count(*) FILTER (WHERE started_at < slot)
                FROM {schema}.job_runs
                WHERE slot >= %s AND slot < %s AND kind = 'scheduled'
                  AND (started_at IS NULL OR started_at <= %s)
                """
            ).format(
                schema=sql.Identifier(SCHEMA),
                slots=sql.SQL("slots" if has_slots else "1"),
            )
            row = conn.execute(q, (t0, end, t1)).fetchone()
            assert row is not None
            runs, dupes, skipped, p50, p99, worst, seen, early = row
            timeline = lateness_by_bucket(conn, t0, end, args.timeline, samples)
            noop = None
            if args.body == "mixed":  # the no-op jobs alone: do slow bodies delay their starts?
                noop = conn.execute(
                    sql.SQL(
                        """
                        SELECT count(*),
                               percentile_cont(0.5) WITHIN GROUP (
                                   ORDER BY extract(epoch FROM started_at - slot)),
                               percentile_cont(0.99) WITHIN GROUP (
                                   ORDER BY extract(epoch FROM started_at - slot)),
                               max(extract(epoch FROM started_at - slot))
                        FROM {schema}.job_runs
                        WHERE slot >= %s AND slot < %s AND kind = 'scheduled'
                          AND started_at IS NOT NULL AND started_at <= %s AND {noop}
                        """
                    ).format(schema=sql.Identifier(SCHEMA), noop=NOOP_KEYS),
                    (t0, end, t1),
                ).fetchone()
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
    body_late = None
    if args.body == "mixed":
        body_late = began_lateness(began_dir, t0.timestamp(), end.timestamp(), args.timeline)
    kept = None
    if any(code != 0 for code in codes):  # keep the logs of a worker that did not stop cleanly
        kept = Path(tempfile.mkdtemp(prefix=f"tenure-scale-{tag}-"))
        for log in procs.logs:
            shutil.copy(log, kept)
    expected = expected_slots(schedule, jobs, t0, end)
    saturated = sum(
        1
        for log in procs.logs
        for line in log.read_text(errors="replace").splitlines()
        if " saturated" in line
    )
    return {
        "rate": rate,
        "workers": workers,
        "schedule": schedule,
        "jobs": jobs,
        "kind": "runtime" if args.runtime else "coded",
        "body": args.body,
        "added_s": None if added is None else round(added, 2),
        "window_s": round(seconds, 1),
        "expected": expected,
        "runs": runs,
        # cron: the burst's drain rate (its runs over the time to start the last of them)
        "runs_per_s": round(
            runs / (float(worst) if SCHEDULES[schedule][0] == "cron" and worst else seconds), 1
        ),
        "skipped": skipped,
        "behind": max(0, expected - seen),
        "dupes": dupes,
        "early": early,
        "p50_ms": round(float(p50 or 0) * 1000, 1),
        "p99_ms": round(float(p99 or 0) * 1000, 1),
        "max_ms": round(float(worst or 0) * 1000, 1),
        "saturated_lines": saturated,
        "exit_codes": codes,
        "logs": None if kept is None else str(kept),
        "timeline": timeline,
        "costs": costs,
        "noop": None
        if noop is None
        else {
            "runs": noop[0],
            "p50_ms": round(float(noop[1] or 0) * 1000, 1),
            "p99_ms": round(float(noop[2] or 0) * 1000, 1),
            "max_ms": round(float(noop[3] or 0) * 1000, 1),
            "body": body_late,
        },
    }


def began_lateness(
    folder: Path, t0: float, end: float, every: float | None = None
) -> dict[str, Any]:
    """The no-op bodies' own starts (bench_scheduler's BENCH_BEGAN_DIR lines): seconds from
    each slot in [t0, end) to its body's first line, as p50 / p99 / max in ms; with
    ``every``, also per bucket of that many seconds of slots (``--timeline``)."""
    late: list[float] = []
    by_bucket: dict[int, list[float]] = {}
    for path in folder.glob("began-*.txt"):
        for line in path.read_text().splitlines():
            slot, began = map(float, line.split())
            if t0 <= slot < end:
                late.append(began - slot)
                if every:
                    by_bucket.setdefault(int((slot - t0) // every), []).append(began - slot)
    if not late:
        return {"runs": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}

    def ms(values: list[float], q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)

    def summary(values: list[float]) -> dict[str, Any]:
        values.sort()
        return {"p50_ms": ms(values, 0.5), "p99_ms": ms(values, 0.99), "max_ms": ms(values, 1.0)}

    out: dict[str, Any] = {"runs": len(late), **summary(late)}
    if every:
        out["buckets"] = [{"from_s": b * every, **summary(by_bucket[b])} for b in sorted(by_bucket)]
    return out


def reference_loop() -> float:
    """Seconds a fixed Python loop takes now (the machine's speed beside each row)."""
    began = time.perf_counter()
    sum(i * i for i in range(10**7))
    return round(time.perf_counter() - began, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: $TENURE_DSN, else local)")
    parser.add_argument("--rates", type=int, nargs="+", default=[2000], help="runs/s asked")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="concurrency per worker (default: the library's own, as a user gets it)",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="window, s (65+ for 1m/cron)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window")
    parser.add_argument("--async-jobs", action="store_true", help="async no-op jobs")
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["coded"],
        choices=["coded", "runtime"],
        help="coded jobs (@app.job) and/or as many runtime schedules of one task",
    )
    parser.add_argument(
        "--bodies",
        nargs="+",
        default=["noop"],
        choices=["noop", "mixed"],
        help="mixed: 10%% of jobs sleep 2 s, 1%% burn 100 ms CPU; the no-ops' lateness apart",
    )
    parser.add_argument(
        "--costs",
        action="store_true",
        help="per run: worker and server CPU ms, transactions, row writes, WAL bytes",
    )
    parser.add_argument("--compare", metavar="REF", help="also run each row on git REF's src/")
    parser.add_argument("--after", metavar="REF", help="the after side from git REF's src/")
    parser.add_argument("--stagger", action="store_true", help="start workers one at a time")
    parser.add_argument("--quick", action="store_true", help="500 runs/s, 1s and 1m, 15 s")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--timeline",
        type=float,
        metavar="SECONDS",
        help="also print lateness, table sizes and statement times per bucket of this many s",
    )
    args = parser.parse_args()
    if args.quick:
        args.rates, args.duration, args.schedules = [500], 15.0, ["1s", "1m"]
    base = pick_dsn(args.dsn)
    say = (lambda *a, **k: None) if args.json else print
    load = [os.getloadavg()]
    results: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="tenure-scale-") as tmp:
        after = None
        if args.after:  # a fixed commit: the checkout may change while the rows run
            after = source_tree(args.after, Path(tmp) / "after")
        sides: list[tuple[str, Path | None]] = [("after", after)]
        if args.compare:
            sides.insert(0, ("before", source_tree(args.compare, Path(tmp) / "before")))
        rows = itertools.product(args.rates, args.schedules, args.workers, args.kinds, args.bodies)
        for n, (rate, schedule, workers, kind, body) in enumerate(rows):
            args.runtime = kind == "runtime"
            args.body = body
            for side, src in sides:
                say(
                    f"{side}: {rate}/s asked, {schedule}, {workers} workers, {kind}, {body} ...",
                    flush=True,
                )
                loop_s = reference_loop()
                result = measure(base, rate, workers, schedule, args, src, Path(tmp), f"{n}-{side}")
                result["side"] = side
                result["loop_s"] = loop_s
                result["load"] = [round(x, 2) for x in os.getloadavg()]
                results.append(result)
                failed = failed or result["dupes"] > 0 or result["early"] > 0
                say("   ", json.dumps(result, default=str), flush=True)
    load.append(os.getloadavg())
    if args.json:
        print(json.dumps({"rows": results, "load": load}, indent=2, default=str))
    else:
        head = (
            "| side | kind | asked/s | schedule | workers | jobs | runs/s "
            "| late p50 / p99 / max ms "
            "| skipped | behind | dupes | early | saturated lines | load 1m | loop s |"
        )
        print()
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for r in results:
            kind = r["kind"] + (", mixed" if r["body"] == "mixed" else "")
            print(
                f"| {r['side']} | {kind} | {r['rate']:,} | {r['schedule']} | {r['workers']} | "
                f"{r['jobs']:,} | {r['runs_per_s']:,} | {r['p50_ms']:,} / {r['p99_ms']:,} / "
                f"{r['max_ms']:,} | {r['skipped']:,} | {r['behind']:,} | {r['dupes']} | "
                f"{r['early']} | {r['saturated_lines']} | {r['load'][0]} | {r['loop_s']} |"
            )
        if any(r["costs"] or r["noop"] for r in results):
            head = (
                "| side | body | asked/s | workers | no-op late p50 / p99 / max ms "
                "| no-op bodies began late p50 / p99 / max ms "
                "| worker CPU ms/run | server CPU ms/run | cores asked | xacts/run "
                "| row writes/run | WAL B/run | loop s |"
            )
            print()
            print(head)
            print("|" + "---|" * (head.count("|") - 1))
            for r in results:
                c, o = r["costs"] or {}, r["noop"]
                late = "-" if o is None else f"{o['p50_ms']:,} / {o['p99_ms']:,} / {o['max_ms']:,}"
                b = (o or {}).get("body")
                began = (
                    "-"
                    if not b or not b["runs"]
                    else (f"{b['p50_ms']:,} / {b['p99_ms']:,} / {b['max_ms']:,}")
                )
                # Where the time goes at the asked rate: the cores that many runs a second need
                # at this row's CPU per run, the workers' and their backends' together (this
                # machine has os.cpu_count()).
                need = (
                    "-"
                    if "worker_cpu_ms" not in c
                    else f"{r['rate'] * (c['worker_cpu_ms'] + c['server_cpu_ms']) / 1000:.2f}"
                )
                print(
                    f"| {r['side']} | {r['body']} | {r['rate']:,} | {r['workers']} | {late} | "
                    f"{began} | "
                    f"{c.get('worker_cpu_ms', '-')} | {c.get('server_cpu_ms', '-')} | {need} | "
                    f"{c.get('xacts', '-')} | {c.get('row_writes', '-')} | "
                    f"{c.get('wal_bytes', '-')} | {r['loop_s']} |"
                )
        for r in results:
            if r["timeline"]:
                print(f"\n{r['side']}, {r['rate']:,}/s, {r['schedule']}, {r['workers']} workers:")
                for b in r["timeline"]:
                    print("   ", json.dumps(b))
                body = (r["noop"] or {}).get("body") or {}
                if body.get("buckets"):
                    print("  no-op bodies began late, by slot:")
                    for b in body["buckets"]:
                        print("   ", json.dumps(b))
        if any(r["costs"] for r in results):
            print(
                f"\ncores asked: the asked runs/s times the row's worker and server CPU per run; "
                f"this machine has {os.cpu_count()}"
            )
        print(f"\nload average at start {load[0]}, at end {load[-1]}")
        print("check", "FAILED (a slot ran twice or before its time)" if failed else "ok")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
