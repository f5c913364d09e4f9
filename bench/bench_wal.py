#!/usr/bin/env python
"""WAL bytes per operation: what one primary (and every replica) must write and ship.

    python bench/bench_wal.py                 # a private throwaway server (exact), ~3 min
    python bench/bench_wal.py --n 500 --runs-for 20
    python bench/bench_wal.py --history-only  # issue 28's cases alone, ~2 min
    python bench/bench_wal.py --dsn postgresql://...   # an existing server (server-wide LSN
                                                      # delta: others' writes count too)

Without ``--dsn`` it starts its own PostgreSQL (tests/support/servers.py: initdb in a temp
dir, the machine's newest server binaries, as the ``postgres`` user when run as root) with
``full_page_writes=on``, autovacuum off and no checkpoint during a case, so the LSN delta
of a case is exactly the WAL of that case's statements: commit records included, full-page
images after a checkpoint excluded (they add up to a page per first touch of a page after
each checkpoint). Each case runs ``--n`` times on one connection after a warm-up; the
figure is the LSN delta divided by the count.

Cases: a takeover (acquire of an expired lease), a first acquire (new key), a renewal, a
release, ``results.put`` (strict), a fenced empty transaction, an outbox message enqueued
in a fenced transaction and then delivered by ``tenure relay``, and a scheduler run (jobs
every second on one ``tenure worker`` for ``--runs-for`` seconds: claim, start, finish and
whatever the worker writes meanwhile, divided by the runs it recorded).

Then a run's history row (issue 28): rows as ``sched_finish`` inserts them, ten per
statement, each for the next of ``HISTORY_JOBS`` jobs (the end of each job's key range in
the job_key-led indexes), with job_runs' indexes as the schema has them and with
``job_runs_history (job_key, run_id)`` created again (the index set before migration 19),
in alternating rounds: WAL bytes and microseconds per row, and, from ``pg_waldump`` on the
private server, the index entries written per row in each of job_runs' indexes. The
scheduler run case alternates the two index sets too, each side after a checkpoint, with its
entries per run. A fixed Python loop (``sum(i*i for i in range(10**7))``) is timed before
and after the timed rows.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

import tenure  # noqa: E402
from tenure import outbox  # noqa: E402

JOBS = int(os.environ.get("BENCH_WAL_JOBS", "20"))
#: The history row case's jobs, and its rows per statement (a finisher's batch).
HISTORY_JOBS = 200
HISTORY_BATCH = 10
#: job_runs' index before migration 19, created again for the "before" side.
HISTORY_INDEX = "CREATE INDEX job_runs_history ON {schema}.job_runs (job_key, run_id)"
#: A run's history row as sched_finish inserts it (recorded_at: the run's start).
HISTORY_ROWS = """
INSERT INTO {schema}.job_runs
    (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
     finished_at, outcome, recorded_at)
SELECT k.job_key, now(), 'scheduled', 1, %(token)s, gen_random_uuid(), 'w', 'h', 1,
       clock_timestamp(), clock_timestamp(), 'succeeded', clock_timestamp()
FROM unnest(%(keys)s::text[]) AS k(job_key)
"""
#: Leaf-level B-tree records that add an index entry (a split carries the new entry).
LEAF_INSERTS = {"INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R"}


def _noop(ctx: tenure.JobContext) -> None:
    pass


#: The scheduler case's app (``tenure worker bench.bench_wal:sched``).
sched = tenure.Scheduler(concurrency=16)
for _i in range(JOBS):
    sched.add_job(f"wal-{_i:03d}", _noop, every="1s", ttl="10s")


def _deliver(msg: outbox.Message) -> None:
    pass


#: The outbox case's handlers (``tenure relay --handlers bench.bench_wal:handlers``).
handlers = {"wal": _deliver}


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[tuple[str, Any]]:
    """The DSN, and the private server (None with ``--dsn``)."""
    if dsn is not None:
        yield dsn, None
        return
    from tests.support.servers import PgServer

    settings = {
        "full_page_writes": "on",
        "autovacuum": "off",
        "checkpoint_timeout": "1h",
        "max_wal_size": "4GB",
    }
    with PgServer(name="bench-wal", settings=settings) as pg:
        yield pg.dsn, pg


def reference_loop() -> float:
    """Seconds a fixed Python loop takes now (the machine's speed beside timed rows)."""
    began = time.perf_counter()
    sum(i * i for i in range(10**7))
    return round(time.perf_counter() - began, 2)


def _lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def index_entries(
    pg: Any, probe: psycopg.Connection[Any], schema: str, start: int, end: int
) -> collections.Counter[str]:
    """Index entries written into each of job_runs' indexes between two WAL positions, read
    from the WAL itself (``pg_waldump``): leaf-level B-tree inserts, by relation."""
    names = {
        str(node): name
        for node, name in probe.execute(
            b"SELECT c.relfilenode, c.relname FROM pg_index AS i "
            b"JOIN pg_class AS c ON c.oid = i.indexrelid "
            b"JOIN pg_class AS t ON t.oid = i.indrelid "
            b"WHERE t.relname = 'job_runs' AND t.relnamespace = %s::regnamespace",
            (schema,),
        )
    }
    probe.execute(b"SELECT pg_switch_wal()")  # the segment pg_waldump reads is complete
    out = subprocess.run(
        [
            str(pg.bindir / "pg_waldump"),
            "-p",
            str(pg.datadir / "pg_wal"),
            "-s",
            _lsn_text(start),
            "-e",
            _lsn_text(end),
            "-r",
            "Btree",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found: collections.Counter[str] = collections.Counter()
    for line in out.splitlines():
        what = re.search(r"desc: (\w+)", line)
        rel = re.search(r"blkref #0: rel \d+/\d+/(\d+)", line)
        if what and rel and what.group(1) in LEAF_INSERTS and rel.group(1) in names:
            found[names[rel.group(1)]] += 1
    return found


def history_rows(
    dsn: str, pg: Any, schema: str, n: int, rounds: int
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """WAL bytes, microseconds and index entries per history row, without job_runs_history
    and with it, in alternating rounds (see the module docstring)."""
    keys = [f"hist-{i:04d}" for i in range(HISTORY_JOBS)]
    batches = [keys[i : i + HISTORY_BATCH] for i in range(0, len(keys), HISTORY_BATCH)]
    insert = HISTORY_ROWS.format(schema=schema).encode()
    sides = ("schema as migrated", "with job_runs_history")
    per: dict[str, dict[str, list[float]]] = {s: {"wal": [], "us": []} for s in sides}
    entries: dict[str, collections.Counter[str]] = {s: collections.Counter() for s in sides}
    measured = dict.fromkeys(sides, 0)
    token = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Each job has a week's worth of rows first, so every index has its depth.
        conn.execute(
            f"INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
            "started_at, finished_at, outcome, recorded_at) "
            "SELECT k, now() - n * interval '1 minute', 'scheduled', -n, 'w', 'h', 1, "
            "now() - n * interval '1 minute', now(), 'succeeded', now() - n * interval '1 minute' "
            "FROM unnest(%s::text[]) AS k, generate_series(1, 500) AS n".encode(),
            (keys,),
        )
        for _ in range(rounds):
            for side in sides:
                conn.execute(f"DROP INDEX IF EXISTS {schema}.job_runs_history".encode())
                if side == "with job_runs_history":
                    conn.execute(HISTORY_INDEX.format(schema=schema).encode())
                conn.execute(b"CHECKPOINT")
                for batch in batches:  # warm-up: every job's pages get their full-page image
                    token += 1
                    conn.execute(insert, {"token": token, "keys": batch})
                start = lsn(conn)
                began = time.perf_counter()
                statements = max(1, n // HISTORY_BATCH)
                for i in range(statements):
                    token += 1
                    conn.execute(insert, {"token": token, "keys": batches[i % len(batches)]})
                took = time.perf_counter() - began
                end = lsn(conn)
                rows = statements * HISTORY_BATCH
                per[side]["wal"].append((end - start) / rows)
                per[side]["us"].append(took / rows * 1e6)
                measured[side] += rows
                if pg is not None:
                    entries[side].update(index_entries(pg, conn, schema, start, end))
        conn.execute(f"DROP INDEX IF EXISTS {schema}.job_runs_history".encode())
    medians = {
        side: {what: statistics.median(values) for what, values in d.items()}
        for side, d in per.items()
    }
    per_row = {
        side: {k: v / measured[side] for k, v in found.items()} for side, found in entries.items()
    }
    return medians, per_row


def lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(b"SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def measure(conn: psycopg.Connection[Any], n: int, step: Callable[[int], None]) -> float:
    conn.execute(b"CHECKPOINT")  # the case's pages get their full-page image in the warm-up
    for i in range(min(n, 20)):
        step(-1 - i)
    before = lsn(conn)
    for i in range(n):
        step(i)
    return (lsn(conn) - before) / n


def run_process(
    dsn: str,
    schema: str,
    args: list[str],
    seconds: float,
    until: Callable[[], bool] = lambda: False,
) -> None:
    """Run ``tenure ARGS`` for ``seconds``, or until ``until()`` (polled), then SIGTERM it."""
    env = {**os.environ, "TENURE_DSN": dsn, "TENURE_SCHEMA": schema, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tenure", *args], env=env, cwd=REPO, stderr=err
        )
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not until():
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def scheduler_run(
    dsn: str, pg: Any, probe: psycopg.Connection[Any], schema: str, seconds: float
) -> tuple[float, int, dict[str, float]]:
    """``tenure worker`` on the ``sched`` app for ``seconds``: WAL bytes per run recorded, the
    runs, and index entries per run in each of job_runs' indexes (private server only)."""
    count = f"SELECT count(*) FROM {schema}.job_runs".encode()
    [(before_runs,)] = probe.execute(count).fetchall()
    before = lsn(probe)
    run_process(dsn, schema, ["worker", "bench.bench_wal:sched"], seconds)
    end = lsn(probe)
    [(after_runs,)] = probe.execute(count).fetchall()
    runs = int(after_runs) - int(before_runs)
    if not runs:
        return 0.0, 0, {}
    found = index_entries(pg, probe, schema, before, end) if pg is not None else {}
    return (end - before) / runs, runs, {k: v / runs for k, v in found.items()}


def _entries_text(entries: dict[str, float]) -> str:
    if not entries:
        return "(index entries: only on a private server)"
    total = sum(entries.values())
    each = ", ".join(f"{k.removeprefix('job_runs_')} {v:.2f}" for k, v in sorted(entries.items()))
    return f"{total:.2f} job_runs index entries ({each})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="an existing server (default: a private one)")
    parser.add_argument("--n", type=int, default=300, help="operations per case")
    parser.add_argument("--runs-for", type=float, default=15.0, help="seconds of scheduler load")
    parser.add_argument(
        "--history-rounds", type=int, default=3, help="alternating rounds of the history case"
    )
    parser.add_argument(
        "--history-only",
        action="store_true",
        help="only the history row and scheduler run cases, with and without job_runs_history",
    )
    args = parser.parse_args()
    schema = f"bench_wal_{uuid.uuid4().hex[:8]}"
    rows: list[tuple[str, float]] = []
    loops: list[float] = []
    history: dict[str, dict[str, float]] = {}
    entries: dict[str, dict[str, float]] = {}
    runs_by_side: list[tuple[str, float, int, dict[str, float]]] = []
    with (
        server(args.dsn) as (dsn, pg),
        tenure.connect(dsn, schema=schema, migrate=True, pool_size=1) as client,
        psycopg.connect(dsn, autocommit=True) as probe,
        psycopg.connect(dsn) as conn,
    ):
        try:
            if not args.history_only:
                rows.extend(lease_and_outbox(client, probe, conn, dsn, schema, args.n))
            loops.append(reference_loop())
            history, entries = history_rows(dsn, pg, schema, args.n, args.history_rounds)
            loops.append(reference_loop())
            # A first worker registers the jobs and warms the tables; then the two index
            # sets alternate, each after a checkpoint (so each pays its full-page images).
            scheduler_run(dsn, pg, probe, schema, min(5.0, args.runs_for))
            for _ in range(args.history_rounds):
                for side in ("schema as migrated", "with job_runs_history"):
                    probe.execute(f"DROP INDEX IF EXISTS {schema}.job_runs_history".encode())
                    if side == "with job_runs_history":
                        probe.execute(HISTORY_INDEX.format(schema=schema).encode())
                    probe.execute(b"CHECKPOINT")
                    wal, runs, per_run = scheduler_run(dsn, pg, probe, schema, args.runs_for)
                    if runs:
                        runs_by_side.append((side, wal, runs, per_run))
        finally:
            probe.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())
    where = "an existing server (server-wide, approximate)" if args.dsn else "a private server"
    print(f"WAL bytes per operation, {where}, n={args.n}:")
    for name, value in rows:
        print(f"  {name:55s} {value:8.0f}")
    print(
        f"A run's history row ({HISTORY_BATCH} rows per statement over {HISTORY_JOBS} jobs, "
        f"{args.history_rounds} alternating rounds of {args.n} rows, medians):"
    )
    for side, d in history.items():
        print(
            f"  {side:25s} {d['wal']:6.0f} B/row {d['us']:7.1f} us/row  "
            f"{_entries_text(entries[side])}"
        )
    print(
        f"  reference: sum(i*i for i in range(10**7)) took {loops[0]:.2f} s before these rows "
        f"and {loops[1]:.2f} s after them"
    )
    print(
        f"Scheduler run ({JOBS} jobs every 1s, --runs-for {args.runs_for:g}, alternating, each "
        "after a checkpoint):"
    )
    for side, wal, runs, per_run in runs_by_side:
        print(f"  {side:25s} {wal:6.0f} B/run ({runs} runs)  {_entries_text(per_run)}")
    return 0


def lease_and_outbox(
    client: tenure.Client,
    probe: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
    dsn: str,
    schema: str,
    n: int,
) -> list[tuple[str, float]]:
    """The lease, results, fence and outbox cases: (name, WAL bytes per operation)."""
    rows: list[tuple[str, float]] = []
    rows.append(("acquire, new key", measure(probe, n, lambda i: _acq(client, i))))
    time.sleep(0.1)  # every key's 50 ms lease has expired: the next acquire takes over
    rows.append(("acquire, takeover", measure(probe, n, lambda i: _acq(client, i))))
    held = client.acquire("wal-held", ttl=600)
    assert held is not None
    rows.append(("renew", measure(probe, n, lambda i: held.renew())))

    leases = [client.acquire(f"wal-rel-{i}", ttl=600) for i in range(n + 20)]
    to_release = iter(leases)

    def release(i: int) -> None:
        lease = next(to_release)
        assert lease is not None
        lease.release()

    rows.append(("release", measure(probe, n, release)))
    rows.append(
        (
            "results.put strict",
            measure(
                probe,
                n,
                lambda i: client.results.put("wal-held", {"i": i}, token=held.token, strict=True),
            ),
        )
    )

    def fenced(i: int) -> None:
        with conn.transaction():
            tenure.fence(conn, "wal-held", held.token, schema=schema)

    rows.append(("fence, empty transaction", measure(probe, n, fenced)))

    def enqueue(i: int) -> None:
        with conn.transaction():
            tenure.fence(conn, "wal-held", held.token, schema=schema)
            outbox.enqueue(conn, "wal", f"m{i}", {"i": i}, schema=schema)

    rows.append(("outbox: fence + enqueue", measure(probe, n, enqueue)))
    pending = n + 20

    def delivered_count() -> int:
        row = probe.execute(
            f"SELECT count(*) FROM {schema}.outbox WHERE state = 'delivered'".encode()
        ).fetchone()
        return int(row[0]) if row else 0

    before = lsn(probe)
    run_process(
        dsn,
        schema,
        ["relay", "--handlers", "bench.bench_wal:handlers"],
        120.0,
        until=lambda: delivered_count() >= pending,
    )
    delivered = delivered_count()
    if delivered:
        rows.append(("outbox: delivery (relay)", (lsn(probe) - before) / delivered))
    return rows


def _acq(client: tenure.Client, i: int, ttl: float = 0.05) -> None:
    lease = client.acquire(f"wal-{i}", ttl=ttl)
    assert lease is not None


if __name__ == "__main__":
    sys.exit(main())
