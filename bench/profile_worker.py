#!/usr/bin/env python
"""Where a scheduler worker's time goes: N no-op jobs on M worker processes, one of them
sampled with py-spy, the database's side counted.

    python bench/profile_worker.py                       # 1,500 jobs every 1s, 2 workers, 60 s
    python bench/profile_worker.py --jobs 1000 --duration 30 --profile none
    python bench/profile_worker.py --json > profile.json

It prints, for the measurement window (after a warm-up):

* runs/s, slot lateness p50/p99 and skipped slots (``job_runs``, database clock);
* CPU per run of each worker process and of the PostgreSQL backends serving them (``/proc``,
  so the database must run on this machine for the backend column);
* statements per run, by name and in total: every worker counts the calls of the client's
  single query path (``AsyncClient.fetch``, wrapped here, nothing in ``src/`` changes), the
  claim batch sizes and the wall time of each call; the total is cross-checked with the
  committed transactions of the bench's own database (``pg_stat_database``: every tenure
  statement is one autocommit transaction);
* row writes per run by table (``pg_stat_user_tables``) and WAL bytes per run (server-wide
  LSN delta, so approximate on a shared server);
* the py-spy profile of worker 0 (non-idle samples, all threads), by phase of a run:
  claim, plan, start, launch (lease/context/thread creation), run, finish, renewal,
  event loop, and by layer inside each phase (psycopg, asyncio, tenure, logging/metrics);
* server time per statement: ``EXPLAIN (ANALYZE, BUFFERS)`` of sched_claim, sched_start and
  sched_finish with real parameters (built by the worker's own planning code), each in a
  transaction that is rolled back, so planning and execution without commit are shown.

pg_stat_statements would give the server side directly, but it needs
``shared_preload_libraries`` and a server restart; this script does without it.

The database is ``tenure_profile_<random>``, created here and dropped at the end. py-spy
must be installed (``pip install py-spy``) unless ``--profile none``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import tenure
from tenure.scheduler.claimer import FIRE_AHEAD

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
SCHEMA = "prof"
#: The app name the workers register their jobs under (`tenure worker profile_worker:app`).
APP = "profile_worker:app"
TABLES = ("scheduled_jobs", "job_state", "job_leases", "job_runs")
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: py-spy sampling: "wall" keeps idle samples (the event loop's wall time, waits included),
#: "gil" only samples the thread holding the GIL (where Python CPU goes).
SPY_MODES = {"wall": ("--idle",), "gil": ("--gil",), "active": ()}


# -- the workers' app and the counting wrapper --------------------------------------------------


def _noop(ctx: tenure.JobContext) -> None:
    pass


async def _anoop(ctx: tenure.JobContext) -> None:
    pass


def _build_app() -> tenure.Scheduler | None:
    jobs = int(os.environ.get("PROFILE_JOBS", "0"))
    if not jobs:
        return None
    built = tenure.Scheduler(concurrency=int(os.environ.get("PROFILE_CONCURRENCY", "16")))
    fn = _anoop if os.environ.get("PROFILE_ASYNC") == "1" else _noop
    every = os.environ.get("PROFILE_EVERY", "1s")
    for i in range(jobs):
        built.add_job(f"job-{i:05d}", fn, every=every)
    return built


app = _build_app() if __name__ != "__main__" else None


def _child() -> None:
    """A worker process: ``tenure worker profile_worker:app`` with its statements counted.

    SIGUSR1 appends a snapshot of the counters to $PROFILE_COUNTS (one JSON line)."""
    from tenure.leases._async.client import AsyncClient

    original = AsyncClient.fetch
    calls: dict[str, list[float]] = {}  # name -> [calls, rows, seconds]
    batches: collections.Counter[int] = collections.Counter()

    async def counted(self: Any, name: str, params: dict[str, Any], **kw: Any) -> Any:
        began = time.perf_counter()
        rows = await original(self, name, params, **kw)
        entry = calls.setdefault(name, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += len(rows)
        entry[2] += time.perf_counter() - began
        if name == "sched_claim":
            batches[len(rows) - 1] += 1  # the last row is the "look again at" summary
        return rows

    AsyncClient.fetch = counted  # type: ignore[method-assign]
    path = os.environ["PROFILE_COUNTS"]

    def snapshot(signum: int, frame: Any) -> None:
        with open(path, "a") as out:
            out.write(json.dumps({"calls": calls, "batches": batches}) + "\n")

    signal.signal(signal.SIGUSR1, snapshot)
    from tenure.cli.main import main as tenure_main

    sys.argv = ["tenure", "worker", "profile_worker:app"]
    tenure_main()


# -- measuring ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def snapshot(stats: psycopg.Connection[Any], workers: list[int]) -> dict[str, Any]:
    stats.execute("SELECT pg_stat_clear_snapshot()")
    row = stats.execute(
        "SELECT xact_commit + xact_rollback, clock_timestamp(), pg_current_wal_lsn() "
        "FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    tables = {
        name: (ins, upd, hot, dele)
        for name, ins, upd, hot, dele in stats.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_user_tables WHERE schemaname = %s",
            (SCHEMA,),
        )
    }
    backends = [
        pid
        for (pid,) in stats.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
    ]
    return {
        "xacts": row[0],
        "at": row[1],
        "lsn": row[2],
        "mono": time.monotonic(),
        "tables": tables,
        "workers": {pid: cpu_seconds(pid) for pid in workers},
        "backends": {pid: cpu_seconds(pid) for pid in backends},
    }


def cpu_delta(a: dict[int, float | None], b: dict[int, float | None]) -> float:
    return sum(
        (b[pid] or 0.0) - (a[pid] or 0.0)
        for pid in a
        if pid in b and a[pid] is not None and b[pid] is not None
    )


class Workers:
    def __init__(self, count: int, env: dict[str, str], logdir: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.counts: list[Path] = []
        for i in range(count):
            log, counts = logdir / f"worker-{i}.log", logdir / f"worker-{i}.counts"
            self.logs.append(log)
            self.counts.append(counts)
            with open(log, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(HERE / "profile_worker.py"), "--child"],
                        cwd=HERE,
                        env={**env, "PROFILE_COUNTS": str(counts)},
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait_started(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for proc, log in zip(self.procs, self.logs, strict=True):
            while " started: " not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"worker did not start:\n{log.read_text()}")
                time.sleep(0.2)

    def mark(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGUSR1)

    def stop(self) -> list[int]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes

    def counted(self) -> dict[str, Any]:
        """Calls per statement name and claim batch sizes in the window, all workers."""
        calls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
        batches: collections.Counter[int] = collections.Counter()
        for path in self.counts:
            lines = path.read_text().splitlines() if path.exists() else []
            if len(lines) < 2:
                continue
            first, last = json.loads(lines[0]), json.loads(lines[1])
            for name, (n, rows, secs) in last["calls"].items():
                n0, rows0, secs0 = first["calls"].get(name, (0, 0, 0.0))
                entry = calls[name]
                entry[0] += n - n0
                entry[1] += rows - rows0
                entry[2] += secs - secs0
            for size, n in last["batches"].items():
                batches[int(size)] += n - first["batches"].get(size, 0)
        return {"calls": dict(calls), "batches": dict(sorted(batches.items()))}


# -- the py-spy profile, by phase and layer ----------------------------------------------------


# A main-thread sample's phase: the innermost frame that names one (searched from the leaf).
# py-spy's raw frames read "Class.function (package/file.py:line)".
def _fn(names: str, path: str) -> re.Pattern[str]:
    return re.compile(rf"^(\w+\.)*({names}) \((.*/)?{path}:")


PHASES = (
    (
        "finish (sched_finish)",
        _fn("finish|_finish_batches|_record_finished|_ended", r"tenure/scheduler/finisher\.py"),
    ),
    (
        "lease keeper (spawn, renew, stop)",
        _fn(
            "keep|_start_keeper|stop_keeping|_stop_keeper|_renew_loop|_watch_loop|renew"
            "|mark_released",
            r"tenure/leases/_async/lease\.py",
        ),
    ),
    (
        "thread per sync run",
        _fn("in_thread|submit|_serve|target", r"tenure/scheduler/execution\.py"),
    ),
    ("launch (lease, context, task)", _fn("_launch", r"tenure/scheduler/worker\.py")),
    (
        "plan (rows, cronsim, params)",
        re.compile(
            r"^(\w+\.)*(plan|from_row|start_params|_schedule|policy|differs_from|_report_skipped)"
            r" \((.*/)?tenure/scheduler/(schedules|claim|claimer|starter)\.py:"
        ),
    ),
    ("start (sched_start)", _fn("_start_due|_send_start", r"tenure/scheduler/starter\.py")),
    ("claim (sched_claim)", _fn("claim_loop", r"tenure/scheduler/claimer\.py")),
    ("run (execute, result)", _fn("execute|_run", r"tenure/scheduler/(execution|worker)\.py")),
    ("pool", re.compile(r"\((.*/)?psycopg_pool/")),
    ("listen/prune", re.compile(r"\((.*/)?tenure/scheduler/background\.py:")),
)
EPOLL = re.compile(r"^(\w+\.)*select \((.*/)?selectors\.py:")
LAYERS = (
    ("psycopg", re.compile(r"\((.*/)?psycopg/")),
    ("psycopg_pool", re.compile(r"\((.*/)?psycopg_pool/")),
    ("logging/metrics", re.compile(r"\((.*/)?(logging/|tenure/metrics\.py|prometheus_client/)")),
    ("threading", re.compile(r"\((.*/)?threading\.py:")),
    ("asyncio", re.compile(r"\((.*/)?(asyncio/|selectors\.py:)")),
    ("uuid/datetime/zoneinfo/cronsim", re.compile(r"\((.*/)?(uuid\.py|zoneinfo/|cronsim/)")),
    ("tenure", re.compile(r"\((.*/)?tenure/")),
)


def classify(frames: list[str]) -> tuple[str, str]:
    """(phase, layer) of one main-thread stack, root first."""
    leaf = frames[-1] if frames else ""
    if EPOLL.search(leaf) and not any("tenure/scheduler/" in f for f in frames[-3:]):
        return "idle: waiting in epoll", "asyncio"
    phase = "event loop (callbacks, no tenure frame)"
    for frame in reversed(frames):
        found = next((name for name, pattern in PHASES if pattern.search(frame)), None)
        if found:
            phase = found
            break
    layer = next((name for name, pattern in LAYERS if pattern.search(leaf)), "other")
    return phase, layer


def read_profile(path: Path) -> dict[str, Any]:
    """Aggregate py-spy's raw (collapsed) output: 'thread (tid): name;frame;... count'.
    Main thread (the event loop) by phase and layer; other threads (sync job bodies) apart."""
    by_phase: collections.Counter[str] = collections.Counter()
    by_layer: collections.Counter[str] = collections.Counter()
    by_both: collections.Counter[tuple[str, str]] = collections.Counter()
    by_leaf: collections.Counter[str] = collections.Counter()
    main_total = other_total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        thread, frames = parts[0], parts[1:]
        if "MainThread" not in thread:
            other_total += n
            continue
        main_total += n
        phase, layer = classify(frames)
        by_phase[phase] += n
        by_both[(phase, layer)] += n
        if not phase.startswith("idle"):
            by_layer[layer] += n
            by_leaf[frames[-1] if frames else "?"] += n
    return {
        "main_samples": main_total,
        "other_thread_samples": other_total,
        "phases": dict(by_phase.most_common()),
        "busy_layers": dict(by_layer.most_common()),
        "phase_layer": {f"{p} / {lay}": n for (p, lay), n in by_both.most_common()},
        "top_busy_leaves": dict(by_leaf.most_common(25)),
    }


# -- server time per statement -----------------------------------------------------------------


def claim_and_plan(
    conn: psycopg.Connection[Any], limit: int
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Claim up to ``limit`` due jobs on ``conn`` and plan them with the worker's own code:
    the parameters of sched_start for the batch and of sched_finish for its first run."""
    from tenure.db.channels import channel
    from tenure.db.queries import queries
    from tenure.scheduler.claim import (
        Finished,
        RunIdentity,
        claims_from_rows,
        finish_params,
        start_params,
    )
    from tenure.scheduler.schedules import plan, schedule_from_row

    params = {"limit": limit, "exclude": [], "app": APP, "ahead": FIRE_AHEAD}
    rows = conn.execute(queries(SCHEMA)["sched_claim"], params)
    claims = claims_from_rows(rows.fetchall())[0]
    if not claims:
        return None
    planned = [
        (
            c,
            plan(
                schedule_from_row(c.job_key, c.cron, c.every, c.timezone),
                c.policy(),
                c.state,
                c.at,
                c.token,
            ),
        )
        for c in claims
    ]
    c, d = planned[0]
    assert d.run_slot is not None and d.run_kind is not None
    [(now,)] = conn.execute("SELECT clock_timestamp()").fetchall()
    ident = RunIdentity(c.job_key, c.token, c.owner, d.run_slot, d.run_kind, d.attempt, now)
    ended = Finished(ident, True, "succeeded", None)
    finish = finish_params(
        [ended], channel=channel("jobs", SCHEMA), worker="profile", host="profile", pid=0
    )
    return start_params(planned, worker="profile", host="profile", pid=0), finish


def explain(dsn: str, rounds: int, limits: tuple[int, ...]) -> dict[str, Any]:
    """Planning and execution time (ms, median of ``rounds``) and buffers touched by claim,
    start and finish with real parameters, each round in a transaction that is rolled back."""
    from tenure.db.queries import queries

    q = queries(SCHEMA)
    opts = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as conn:
        for limit in limits:
            times: dict[str, list[tuple[float, float, float, int]]] = collections.defaultdict(list)
            for _ in range(rounds):
                with conn.transaction(force_rollback=True):
                    claim = {"limit": limit, "exclude": [], "app": APP, "ahead": FIRE_AHEAD}
                    times["sched_claim"].append(_explained(conn, opts + q["sched_claim"], claim))
                with conn.transaction(force_rollback=True):
                    batch = claim_and_plan(conn, limit)
                    if batch is None:
                        continue
                    start, finish = batch
                    # EXPLAIN ANALYZE runs the statement: the runs start in this transaction.
                    times["sched_start"].append(_explained(conn, opts + q["sched_start"], start))
                    times["sched_finish"].append(_explained(conn, opts + q["sched_finish"], finish))
            out[str(limit)] = {
                name: {
                    "planning_ms": round(statistics.median(t[0] for t in ts), 3),
                    "execution_ms": round(statistics.median(t[1] for t in ts), 3),
                    "round_trip_ms": round(statistics.median(t[2] for t in ts), 3),
                    "buffers": statistics.median(t[3] for t in ts),
                    "rounds": len(ts),
                }
                for name, ts in times.items()
            }
    out["plan_cache"] = plan_cache(dsn, rounds)
    return out


#: A fragment of each statement's text, to find it in pg_prepared_statements.
MARKERS = {
    "sched_claim": "FOR UPDATE OF j, s SKIP LOCKED",
    "sched_start": "AS p(job_key text, token bigint, owner uuid",
    "sched_finish": "concat_ws",
}


def plan_cache(dsn: str, rounds: int) -> dict[str, Any]:
    """Does the server reuse a plan for the prepared statements, as psycopg prepares them in
    the worker (prepare_threshold 5)? Run claim/start/finish ``rounds`` times as prepared
    statements and read pg_prepared_statements' generic_plans/custom_plans (PostgreSQL 14+)."""
    from tenure.db.queries import queries

    q = queries(SCHEMA)
    # Committed, not rolled back: psycopg forgets statements prepared in a failed or rolled
    # back transaction. The workers have stopped; these are ordinary claims, starts and
    # finishes on the bench's own database.
    with psycopg.connect(dsn, prepare_threshold=0, autocommit=True) as conn:
        for _ in range(max(rounds, 12)):
            with conn.transaction():
                batch = claim_and_plan(conn, 16)
                if batch is None:
                    continue
                start, finish = batch
                conn.execute(q["sched_start"], start)
                conn.execute(q["sched_finish"], finish)
        found = conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE from_sql IS false"
        ).fetchall()
    result = {}
    for name, marker in MARKERS.items():
        for text, generic, custom in found:
            if marker in text:
                result[name] = {"generic_plans": generic, "custom_plans": custom}
    return result


def _explained(
    conn: psycopg.Connection[Any], query: bytes, params: dict[str, Any]
) -> tuple[float, float, float, int]:
    began = time.perf_counter()
    row = conn.execute(query, params).fetchone()
    took = (time.perf_counter() - began) * 1000
    assert row is not None
    doc = row[0][0]
    top = doc["Plan"]
    blocks = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return doc["Planning Time"], doc["Execution Time"], took, blocks


# -- the driver -------------------------------------------------------------------------------


def py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else "py-spy"


def pick_dsn(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("TENURE_DSN"):
        return os.environ["TENURE_DSN"]
    return DEFAULT_DSN


def measure(dsn: str, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    with tenure.connect(dsn, schema=SCHEMA, migrate=True):
        pass
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env.update(
        TENURE_DSN=dsn,
        TENURE_SCHEMA=SCHEMA,
        TENURE_LOG_LEVEL="info",
        PROFILE_JOBS=str(args.jobs),
        PROFILE_EVERY=args.every,
        PROFILE_CONCURRENCY=str(args.concurrency),
        PROFILE_ASYNC="1" if args.async_jobs else "0",
    )
    report: dict[str, Any] = {}
    workers = Workers(args.workers, env, logdir)
    spy: subprocess.Popen[bytes] | None = None
    spy_out = Path(args.out + ".txt")
    try:
        with psycopg.connect(dsn, autocommit=True) as stats:
            workers.wait_started()
            time.sleep(args.warmup)
            workers.mark()
            a = snapshot(stats, workers.pids)
            if args.profile == "py-spy":
                spy = subprocess.Popen(
                    [
                        *(py_spy(), "record", "--pid", str(workers.pids[0])),
                        *("--duration", str(int(args.duration)), "--rate", str(args.rate)),
                        *(
                            "--format",
                            "raw",
                            "--threads",
                            *SPY_MODES[args.spy_mode],
                            "-o",
                            str(spy_out),
                        ),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            time.sleep(args.duration)
            b = snapshot(stats, workers.pids)
            workers.mark()
            if spy is not None:
                said, _ = spy.communicate(timeout=60)
                report["py_spy"] = [
                    ln for ln in said.decode(errors="replace").splitlines() if "Samples" in ln
                ]
            time.sleep(0.5)  # the workers write their counters
            report.update(window(stats, a, b, args))
            report["statements"] = workers.counted()
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        report["exit_codes"] = workers.stop()
        report["warnings"] = [
            ln
            for log in workers.logs
            for ln in log.read_text(errors="replace").splitlines()
            if "WARNING" in ln
        ][:5]
    if spy is not None and spy_out.exists():
        report["profile"] = read_profile(spy_out)
        report["profile_file"] = str(spy_out)
        report["spy_mode"] = args.spy_mode
    if args.explain_rounds:
        report["explain"] = explain(dsn, args.explain_rounds, tuple(args.explain_limits))
    return report


def window(
    stats: psycopg.Connection[Any], a: dict[str, Any], b: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    t0, t1 = a["at"], b["at"]
    seconds = (t1 - t0).total_seconds()
    runs_q = sql.SQL(
        """
        SELECT count(*),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - slot)),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - slot)),
               count(*) FILTER (WHERE outcome <> 'succeeded'),
               percentile_cont(0.5) WITHIN GROUP (
                   ORDER BY extract(epoch FROM finished_at - started_at)),
               count(*) FILTER (WHERE started_at < slot)
        FROM {s}.job_runs WHERE started_at >= %s AND started_at < %s
        """
    ).format(s=sql.Identifier(SCHEMA))
    runs, p50, p99, not_ok, held, early = stats.execute(runs_q, (t0, t1)).fetchone() or (0,) * 6
    skipped_q = sql.SQL(
        "SELECT count(*) FROM {s}.job_runs WHERE started_at IS NULL "
        "AND recorded_at >= %s AND recorded_at < %s"
    ).format(s=sql.Identifier(SCHEMA))
    (skipped,) = stats.execute(skipped_q, (t0, t1)).fetchone() or (0,)
    (wal,) = stats.execute("SELECT %s::pg_lsn - %s::pg_lsn", (b["lsn"], a["lsn"])).fetchone() or (
        0,
    )
    runs = max(runs, 1)
    statements = b["xacts"] - a["xacts"] - 3  # this connection's own reads in between
    rows = {}
    for table in TABLES:
        before, after = a["tables"].get(table), b["tables"].get(table)
        if before and after:
            ins, upd, hot, dele = (y - x for x, y in zip(before, after, strict=True))
            rows[table] = {
                "inserted": round(ins / runs, 2),
                "updated": round(upd / runs, 2),
                "hot_updated": round(hot / runs, 2),
                "deleted": round(dele / runs, 2),
            }
    worker_cpu = {
        str(pid): round((b["workers"][pid] - a["workers"][pid]) / seconds, 3)
        for pid in a["workers"]
        if a["workers"][pid] is not None and b["workers"].get(pid) is not None
    }
    backend_cpu = cpu_delta(a["backends"], b["backends"])
    return {
        "jobs": args.jobs,
        "every": args.every,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "window_s": round(seconds, 1),
        "asked_per_s": round(args.jobs / _seconds(args.every), 1),
        "runs": runs,
        "runs_per_s": round(runs / seconds, 1),
        "skipped_slots": skipped,
        "not_succeeded": not_ok,
        "started_early": early,
        "lateness_p50_ms": round((p50 or 0) * 1000, 1),
        "lateness_p99_ms": round((p99 or 0) * 1000, 1),
        "start_to_finish_p50_ms": round((held or 0) * 1000, 1),
        "statements_per_run_pg": round(statements / runs, 3),
        "wal_bytes_per_run_approx": round(float(wal) / runs),
        "rows_per_run": rows,
        "worker_cpu_cores": worker_cpu,
        "worker_cpu_ms_per_run": round(
            sum(b["workers"][p] - a["workers"][p] for p in a["workers"]) / runs * 1000, 3
        ),
        "backend_cpu_cores": round(backend_cpu / seconds, 3),
        "backend_cpu_ms_per_run": round(backend_cpu / runs * 1000, 3),
        "backends_seen": len(set(a["backends"]) & set(b["backends"])),
        "loadavg": os.getloadavg(),
    }


def _seconds(every: str) -> float:
    from tenure.validation import parse_duration

    return float(parse_duration(every, what="every"))


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        _child()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: $TENURE_DSN, else local)")
    parser.add_argument("--jobs", type=int, default=1500, help="no-op jobs")
    parser.add_argument("--every", default="1s", help="each job's interval")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrency per worker")
    parser.add_argument("--async-jobs", action="store_true", help="async no-op jobs")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before the window")
    parser.add_argument("--duration", type=float, default=60.0, help="window, seconds")
    parser.add_argument("--profile", choices=("py-spy", "none"), default="py-spy")
    parser.add_argument("--spy-mode", choices=tuple(SPY_MODES), default="wall")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument(
        "--out",
        default=os.path.join(tempfile.gettempdir(), "tenure-worker"),
        help="py-spy output, without the .txt (collapsed stacks)",
    )
    parser.add_argument("--explain-rounds", type=int, default=15, help="0: skip EXPLAIN")
    parser.add_argument("--explain-limits", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep-db", action="store_true", help="keep the database, print its DSN")
    args = parser.parse_args()

    base = pick_dsn(args.dsn)
    dbname = f"tenure_profile_{secrets.token_hex(4)}"
    dsn = make_conninfo(base, dbname=dbname)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        with tempfile.TemporaryDirectory(prefix="tenure-profile-") as tmp:
            report = measure(dsn, args, Path(tmp))
    finally:
        if args.keep_db:
            print(f"kept database: {dsn}", file=sys.stderr)
        else:
            with psycopg.connect(base, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(dbname)
                    )
                )
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)


def print_report(r: dict[str, Any]) -> None:
    runs = r["runs"]
    print(
        f"load        {r['jobs']} jobs every {r['every']} ({r['asked_per_s']}/s asked), "
        f"{r['workers']} workers, concurrency {r['concurrency']}, window {r['window_s']} s, "
        f"loadavg {' '.join(f'{x:.1f}' for x in r['loadavg'])}"
    )
    print(
        f"runs        {runs} = {r['runs_per_s']}/s, skipped {r['skipped_slots']}, "
        f"not succeeded {r['not_succeeded']}, started before the slot {r['started_early']}, "
        f"lateness p50 {r['lateness_p50_ms']} ms "
        f"p99 {r['lateness_p99_ms']} ms; started->finished p50 {r['start_to_finish_p50_ms']} ms"
    )
    print(
        f"cpu         workers {r['worker_cpu_cores']} cores, {r['worker_cpu_ms_per_run']} "
        f"ms/run; backends ({r['backends_seen']}) {r['backend_cpu_cores']} cores, "
        f"{r['backend_cpu_ms_per_run']} ms/run"
    )
    st = r["statements"]
    total = sum(c[0] for c in st["calls"].values())
    print(
        f"statements  {total / runs:.3f}/run counted by the workers, "
        f"{r['statements_per_run_pg']}/run by pg_stat_database"
    )
    for name, (n, rows, secs) in sorted(st["calls"].items(), key=lambda kv: -kv[1][0]):
        print(
            f"  {name:14} {n / runs:7.3f}/run  {rows / max(n, 1):6.2f} rows/call  "
            f"{secs / max(n, 1) * 1000:7.2f} ms/call (wall, in the worker)"
        )
    batches = st["batches"]
    claims = sum(batches.values())
    mean = sum(int(k) * v for k, v in batches.items()) / max(claims, 1)
    print(f"claim batch mean {mean:.2f}; sizes {batches}")
    print(f"rows/run    {r['rows_per_run']}")
    print(f"WAL         ~{r['wal_bytes_per_run_approx']} bytes/run (server-wide)")
    if "profile" in r:
        p = r["profile"]
        main = p["main_samples"]
        busy = main - p["phases"].get("idle: waiting in epoll", 0)
        print(
            f"profile     worker 0, main thread (event loop): {main} samples, mode "
            f"{r.get('spy_mode')}; {r.get('py_spy')}; other threads {p['other_thread_samples']}"
        )
        for name, n in p["phases"].items():
            print(f"  {name:40} {100 * n / main:5.1f}% of samples")
        print(f"  busy main thread by layer (leaf frame), {busy} samples:")
        for name, n in p["busy_layers"].items():
            print(f"  {name:40} {100 * n / max(busy, 1):5.1f}% of busy")
        print("  phase / layer (% of main-thread samples):")
        for name, n in list(p["phase_layer"].items())[:25]:
            print(f"  {name:60} {100 * n / main:5.1f}%")
        print("  top busy leaf frames (% of busy):")
        for name, n in list(p["top_busy_leaves"].items())[:15]:
            print(f"  {100 * n / max(busy, 1):5.1f}%  {name}")
    if "explain" in r:
        print("server time per statement (EXPLAIN ANALYZE, median ms; rolled back):")
        for limit, names in r["explain"].items():
            if limit == "plan_cache":
                print(f"  prepared statements' plans: {names}")
                continue
            for name, t in names.items():
                print(
                    f"  limit {limit:>3} {name:13} planning {t['planning_ms']:7.3f}  "
                    f"execution {t['execution_ms']:7.3f}  round trip {t['round_trip_ms']:7.3f}  "
                    f"buffers {t['buffers']}"
                )
    print(f"exit codes  {r['exit_codes']}; warnings {r['warnings']}")


if __name__ == "__main__":
    main()
