#!/usr/bin/env python
"""WAL bytes per operation: what one primary (and every replica) must write and ship.

    python bench/bench_wal.py                 # a private throwaway server (exact), ~1 min
    python bench/bench_wal.py --n 500 --runs-for 20
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
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
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
def server(dsn: str | None) -> Iterator[str]:
    if dsn is not None:
        yield dsn
        return
    from tests.support.servers import PgServer

    settings = {
        "full_page_writes": "on",
        "autovacuum": "off",
        "checkpoint_timeout": "1h",
        "max_wal_size": "4GB",
    }
    with PgServer(name="bench-wal", settings=settings) as pg:
        yield pg.dsn


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="an existing server (default: a private one)")
    parser.add_argument("--n", type=int, default=300, help="operations per case")
    parser.add_argument("--runs-for", type=float, default=15.0, help="seconds of scheduler load")
    args = parser.parse_args()
    schema = f"bench_wal_{uuid.uuid4().hex[:8]}"
    rows: list[tuple[str, float]] = []
    with (
        server(args.dsn) as dsn,
        tenure.connect(dsn, schema=schema, migrate=True, pool_size=1) as client,
        psycopg.connect(dsn, autocommit=True) as probe,
        psycopg.connect(dsn) as conn,
    ):
        try:
            rows.append(("acquire, new key", measure(probe, args.n, lambda i: _acq(client, i))))
            time.sleep(0.1)  # every key's 50 ms lease has expired: the next acquire takes over
            rows.append(("acquire, takeover", measure(probe, args.n, lambda i: _acq(client, i))))
            held = client.acquire("wal-held", ttl=600)
            assert held is not None
            rows.append(("renew", measure(probe, args.n, lambda i: held.renew())))

            leases = [client.acquire(f"wal-rel-{i}", ttl=600) for i in range(args.n + 20)]
            to_release = iter(leases)

            def release(i: int) -> None:
                lease = next(to_release)
                assert lease is not None
                lease.release()

            rows.append(("release", measure(probe, args.n, release)))
            rows.append(
                (
                    "results.put strict",
                    measure(
                        probe,
                        args.n,
                        lambda i: client.results.put(
                            "wal-held", {"i": i}, token=held.token, strict=True
                        ),
                    ),
                )
            )

            def fenced(i: int) -> None:
                with conn.transaction():
                    tenure.fence(conn, "wal-held", held.token, schema=schema)

            rows.append(("fence, empty transaction", measure(probe, args.n, fenced)))

            def enqueue(i: int) -> None:
                with conn.transaction():
                    tenure.fence(conn, "wal-held", held.token, schema=schema)
                    outbox.enqueue(conn, "wal", f"m{i}", {"i": i}, schema=schema)

            enq = measure(probe, args.n, enqueue)
            rows.append(("outbox: fence + enqueue", enq))
            pending = args.n + 20

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
            before = lsn(probe)
            run_process(dsn, schema, ["worker", "bench.bench_wal:sched"], args.runs_for)
            row = probe.execute(f"SELECT count(*) FROM {schema}.job_runs".encode()).fetchone()
            runs = int(row[0]) if row else 0
            if runs:
                rows.append(
                    (
                        f"scheduler run ({JOBS} jobs every 1s, {runs} runs)",
                        (lsn(probe) - before) / runs,
                    )
                )
        finally:
            probe.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())
    where = "an existing server (server-wide, approximate)" if args.dsn else "a private server"
    print(f"WAL bytes per operation, {where}, n={args.n}:")
    for name, value in rows:
        print(f"  {name:55s} {value:8.0f}")
    return 0


def _acq(client: tenure.Client, i: int, ttl: float = 0.05) -> None:
    lease = client.acquire(f"wal-{i}", ttl=ttl)
    assert lease is not None


if __name__ == "__main__":
    sys.exit(main())
