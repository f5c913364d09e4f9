#!/usr/bin/env python
"""Scheduler benchmark: N jobs, each every minute, across M worker processes on this machine.

Reports:

* slot lateness p50/p99/max: a run's ``started_at`` minus its slot, both by the database
  clock (``job_runs``), over every slot of the measurement window;
* runs per second, with a structural check that every slot in the window ran exactly once;
* database statements per second while idle (jobs that are not due for a long time), for a
  small and a large number of jobs: the claim loop's cost must not grow with the jobs.

Statements are counted as committed transactions in ``pg_stat_database`` of a database the
script creates for itself (``tenure_bench_<random>``, dropped at the end): every tenure
statement runs alone in autocommit, so one transaction is one statement, and nothing else
runs there. PostgreSQL publishes those counters with a delay of up to ~10 s for idle
sessions, so the idle windows are long and start after a settling pause.

    python bench/bench_scheduler.py                 # 10,000 jobs, 3 workers (~5 min)
    python bench/bench_scheduler.py --quick         # 1,000 jobs, 2 workers (~1.5 min)
    python bench/bench_scheduler.py --jobs 5000 --workers 2 --duration 90 --json

Exits non-zero only when a structural check fails (a slot ran twice or not at all).
The same file is the workers' app (``bench_scheduler:app``), configured by BENCH_* variables.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import tenure

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
NEVER = "0 0 1 1 *"


# -- the workers' app -------------------------------------------------------------------------


def _noop(ctx: tenure.JobContext) -> None:
    pass


async def _anoop(ctx: tenure.JobContext) -> None:
    pass


def _sleep2(ctx: tenure.JobContext) -> None:
    time.sleep(2.0)


def _burn100(ctx: tenure.JobContext) -> None:
    until = time.process_time() + 0.1
    while time.process_time() < until:
        pass


#: BENCH_BEGAN_DIR (bench_scale.py --body mixed): each no-op body's slot and the time it
#: began (this machine's clock, as the database's: one host), one line per run written at
#: once (a worker that gives up on a sleeper at shutdown exits without flushing buffers),
#: because a run's recorded start precedes any wait for a body slot.
_began_fd: list[int] = []


def _noop_timed(ctx: tenure.JobContext) -> None:
    os.write(_began_fd[0], f"{ctx.slot.timestamp()} {time.time()}\n".encode())


def body_for(i: int, default: Any) -> Any:
    """BENCH_BODY=mixed (bench_scale.py --body mixed): job i % 10 == 0 sleeps 2 s, job
    i % 100 == 1 burns 100 ms of CPU, the rest are no-ops (the SQL in bench_scale.py's
    ``NOOP_KEYS`` picks the same keys) that note when their bodies began."""
    if os.environ.get("BENCH_BODY") != "mixed":
        return default
    if i % 10 == 0:
        return _sleep2
    if i % 100 == 1:
        return _burn100
    began = os.environ.get("BENCH_BEGAN_DIR")
    if began:
        if not _began_fd:
            path = Path(began) / f"began-{os.getpid()}.txt"
            _began_fd.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        return _noop_timed
    return default


def _build_app() -> tenure.Scheduler | None:
    jobs = int(os.environ.get("BENCH_JOBS", "0"))
    if not jobs:
        return None
    # BENCH_CONCURRENCY empty: the library's own default (bench_scale.py without --concurrency).
    concurrency = os.environ.get("BENCH_CONCURRENCY", "16")
    built = tenure.Scheduler(**({"concurrency": int(concurrency)} if concurrency else {}))
    fn = _anoop if os.environ.get("BENCH_ASYNC") == "1" else _noop
    if os.environ.get("BENCH_RUNTIME") == "1":
        # Runtime schedules (issue 27): the code has one task, the driver adds the schedules
        # (add_runtime) under the same keys and triggers as the coded jobs below.
        built.add_task("noop", fn)
        return built
    idle = os.environ.get("BENCH_MODE") == "idle"
    # bench_scale.py: BENCH_CRON (all jobs on one cron) or BENCH_EVERY (default 60s).
    cron = os.environ.get("BENCH_CRON") or None
    every = os.environ.get("BENCH_EVERY") or "60s"
    for i in range(jobs):
        if idle:
            built.add_job(f"job-{i:05d}", fn, cron=NEVER)
        elif cron is not None:
            built.add_job(f"job-{i:05d}", body_for(i, fn), cron=cron)
        else:
            built.add_job(f"job-{i:05d}", body_for(i, fn), every=every)
    return built


app = _build_app()


def add_runtime(
    dsn: str, schema: str, jobs: int, *, cron: str | None = None, every: str | None = None
) -> float:
    """Add ``jobs`` runtime schedules of task "noop" in one statement (the keys and triggers
    the coded jobs above would have); returns the seconds it took by the database clock."""
    with tenure.connect(dsn, schema=schema) as client:
        defs = [
            tenure.schedule_def(f"job-{i:05d}", task="noop", cron=cron, every=every)
            for i in range(jobs)
        ]
        t0 = client.now()
        tenure.add_schedules(client, defs)
        return (client.now() - t0).total_seconds()


# -- the driver -------------------------------------------------------------------------------


def pick_dsn(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("TENURE_DSN"):
        return os.environ["TENURE_DSN"]
    try:
        with psycopg.connect(DEFAULT_DSN, connect_timeout=2):
            return DEFAULT_DSN
    except psycopg.OperationalError:
        from tenure.db.dsn import resolve

        return resolve(None)[0]


class Workers:
    """M ``tenure worker bench_scheduler:app`` processes."""

    def __init__(
        self, count: int, env: dict[str, str], logdir: Path, tag: str, *, stagger: bool = False
    ) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        for i in range(count):
            if stagger and self.procs:
                # One at a time: workers registering 100,000s of jobs at once wait on each
                # other's row locks past the statement timeout.
                self.wait_started(timeout=300)
            path = logdir / f"{tag}-{i}.log"
            self.logs.append(path)
            with open(path, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tenure", "worker", "bench_scheduler:app"],
                        cwd=HERE,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

    def wait_started(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for proc, log in zip(self.procs, self.logs, strict=True):
            while " started: " not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"worker did not start:\n{log.read_text()}")
                time.sleep(0.2)

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

    def warnings(self) -> list[str]:
        found = []
        for log in self.logs:
            found += [ln for ln in log.read_text(errors="replace").splitlines() if "WARNING" in ln]
        return found


def xacts(conn: psycopg.Connection[Any]) -> tuple[int, float]:
    """Committed + rolled back transactions in this database, and the time read."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0]), time.monotonic()


def env_for(
    dsn: str, schema: str, jobs: int, mode: str, args: argparse.Namespace
) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env.update(
        TENURE_DSN=dsn,
        TENURE_SCHEMA=schema,
        TENURE_LOG_LEVEL="info",
        BENCH_JOBS=str(jobs),
        BENCH_MODE=mode,
        BENCH_CONCURRENCY="" if args.concurrency is None else str(args.concurrency),
        BENCH_ASYNC="1" if args.async_jobs else "0",
        BENCH_RUNTIME="1" if getattr(args, "runtime", False) else "0",
    )
    return env


def migrate(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass


def measure_idle(
    dsn: str, jobs: int, args: argparse.Namespace, logdir: Path, stats: psycopg.Connection[Any]
) -> float:
    schema = f"idle_{jobs}"
    migrate(dsn, schema)
    if args.runtime:
        add_runtime(dsn, schema, jobs, cron=NEVER)
    workers = Workers(args.workers, env_for(dsn, schema, jobs, "idle", args), logdir, schema)
    try:
        workers.wait_started()
        time.sleep(args.settle)
        before, t0 = xacts(stats)
        time.sleep(args.idle)
        after, t1 = xacts(stats)
    finally:
        workers.stop()
    # Our own two reads are transactions too.
    return max(0, after - before - 2) / (t1 - t0)


def measure_load(
    dsn: str, args: argparse.Namespace, logdir: Path, stats: psycopg.Connection[Any]
) -> dict[str, Any]:
    schema = "load"
    migrate(dsn, schema)
    if args.runtime:
        add_runtime(dsn, schema, args.jobs, every="60s")
    workers = Workers(args.workers, env_for(dsn, schema, args.jobs, "load", args), logdir, schema)
    try:
        workers.wait_started()
        time.sleep(2)  # all registered, every worker in its loop
        (t0,) = stats.execute("SELECT clock_timestamp()").fetchone() or (None,)
        before, m0 = xacts(stats)
        time.sleep(args.duration)
        after, m1 = xacts(stats)
        (t1,) = stats.execute("SELECT clock_timestamp()").fetchone() or (None,)
    finally:
        codes = workers.stop()
    # The window: slots from t0 to 3 s before t1 (a slot at t1 may not have run yet).
    end = t1 - dt.timedelta(seconds=3)
    window = (end - t0).total_seconds()
    q = sql.SQL(
        """
        SELECT count(*),
               count(*) - count(DISTINCT (job_key, slot)),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - slot)),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - slot)),
               max(extract(epoch FROM started_at - slot)),
               count(*) FILTER (WHERE outcome <> 'succeeded')
        FROM {schema}.job_runs
        WHERE started_at IS NOT NULL AND slot >= %s AND slot < %s
        """
    ).format(schema=sql.Identifier(schema))
    runs, dupes, p50, p99, worst, not_ok = stats.execute(q, (t0, end)).fetchone() or ()
    skipped_q = sql.SQL(
        "SELECT count(*) FROM {schema}.job_runs WHERE started_at IS NULL AND slot >= %s "
        "AND slot < %s"
    ).format(schema=sql.Identifier(schema))
    (skipped,) = stats.execute(skipped_q, (t0, end)).fetchone() or (0,)
    expected = expected_slots(args.jobs, t0, end)
    return {
        "jobs": args.jobs,
        "workers": args.workers,
        "window_s": round(window, 1),
        "expected_slots": expected,
        "runs": runs,
        "duplicate_runs": dupes,
        "skipped_slots": skipped,
        "not_succeeded": not_ok,
        "lateness_p50_ms": round((p50 or 0) * 1000, 1),
        "lateness_p99_ms": round((p99 or 0) * 1000, 1),
        "lateness_max_ms": round((worst or 0) * 1000, 1),
        "runs_per_s": round(runs / window, 1),
        "statements_per_s": round((after - before - 2) / (m1 - m0), 1),
        "exit_codes": codes,
        "warnings": workers.warnings()[:5],
    }


def expected_slots(jobs: int, start: dt.datetime, end: dt.datetime) -> int:
    """How many slots of the N every-minute jobs fall in [start, end)."""
    from tenure.scheduler.schedules import Schedule

    total = 0
    for i in range(jobs):
        schedule = Schedule.build(f"job-{i:05d}", every=dt.timedelta(minutes=1))
        slot = schedule.next_after(start - dt.timedelta(microseconds=1))
        while slot < end:
            total += 1
            slot += dt.timedelta(minutes=1)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: $TENURE_DSN, else local)")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs, each every minute")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=16, help="--concurrency per worker")
    parser.add_argument("--duration", type=float, default=120.0, help="load window, seconds")
    parser.add_argument("--idle", type=float, default=30.0, help="idle window, seconds")
    parser.add_argument("--settle", type=float, default=12.0, help="pause before idle window")
    parser.add_argument(
        "--idle-jobs", type=int, nargs=2, default=(10, 10_000), metavar=("SMALL", "LARGE")
    )
    parser.add_argument("--async-jobs", action="store_true", help="async no-op jobs")
    parser.add_argument(
        "--runtime", action="store_true", help="runtime schedules of one task, not coded jobs"
    )
    parser.add_argument("--quick", action="store_true", help="1,000 jobs, 2 workers, short")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.workers, args.duration = 1000, 2, 40.0
        args.idle, args.settle, args.idle_jobs = 15.0, 11.0, (10, 1000)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    base = pick_dsn(args.dsn)
    dbname = f"tenure_bench_{secrets.token_hex(4)}"
    dsn = make_conninfo(base, dbname=dbname)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    report: dict[str, Any] = {"database": conninfo_to_dict(dsn).get("host"), "quick": args.quick}
    failed = False
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tenure-bench-") as tmp,
            psycopg.connect(dsn, autocommit=True) as stats,
        ):
            logdir = Path(tmp)
            small, large = args.idle_jobs
            say = (lambda *a: None) if args.json else print
            say(f"idle: {args.workers} workers, {small} jobs not due ...", flush=True)
            report["idle_statements_per_s"] = {
                small: round(measure_idle(dsn, small, args, logdir, stats), 2)
            }
            say(f"idle: {args.workers} workers, {large} jobs not due ...", flush=True)
            report["idle_statements_per_s"][large] = round(
                measure_idle(dsn, large, args, logdir, stats), 2
            )
            say(
                f"load: {args.jobs} jobs every minute, {args.workers} workers, "
                f"{args.duration:.0f}s ...",
                flush=True,
            )
            report["load"] = load = measure_load(dsn, args, logdir, stats)
            failed = (
                load["duplicate_runs"] > 0
                or load["runs"] + load["skipped_slots"] != (load["expected_slots"])
            )
            report["check"] = "FAILED" if failed else "ok"
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        load = report["load"]
        idle = report["idle_statements_per_s"]
        print()
        print(f"idle statements/s    {', '.join(f'{n} jobs: {v}' for n, v in idle.items())}")
        print(
            f"lateness             p50 {load['lateness_p50_ms']} ms, "
            f"p99 {load['lateness_p99_ms']} ms, max {load['lateness_max_ms']} ms"
        )
        print(
            f"runs                 {load['runs']} in {load['window_s']}s = "
            f"{load['runs_per_s']}/s; expected slots {load['expected_slots']}, "
            f"duplicates {load['duplicate_runs']}, skipped {load['skipped_slots']}, "
            f"not succeeded {load['not_succeeded']}"
        )
        print(f"statements/s (load)  {load['statements_per_s']}")
        if load["warnings"]:
            print("worker warnings      " + "\n                     ".join(load["warnings"]))
        print(f"check                {report['check']}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
