"""A claim answered after its lease's local deadline must not start its run.

Found by the Patroni partition test (tests/ha/test_patroni_async.py): a claim sent to a
primary that was being partitioned was answered 9 s later by the database, which then
gave the lease its full TTL. The worker counts the lease's local deadline from when it sent
the claim (it cannot know how long the request waited before the database saw it), so the
lease was already lost locally when the run began: the run started anyway, its fenced
write committed (the database's lease was live), the run ended as ``lease_lost``, and the
slot was claimed and run again: two committed runs of one slot.

Here the stall is made on purpose, without a cluster: one worker reaches the shared server
through a TCP proxy that stops moving bytes for longer than the TTL while the worker's
claims (one a second at least, the jobs run every second) are in flight, then delivers
them. Nothing in this test waits on a clock for its verdict: it reads what the runs were
told (their local deadline) and what committed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

import tenure
from tests.support.fix_proxy import Proxy

from .apps import EVIDENCE
from .workload import REPO, read_lines

STALL = 8.0  # seconds: longer than the jobs' 6 s TTL


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_late_claim_answer_never_starts_its_run(dsn: str, schema: str, tmp_path: Path) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True, pool_size=1):
        pass
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(EVIDENCE).format(schema=sql.Identifier(schema)))
    with Proxy.from_dsn(dsn) as proxy:
        env = {
            "TENURE_DSN": proxy.dsn(dsn),
            "TENURE_SCHEMA": schema,
            "HA_LOG": str(tmp_path),
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
        }
        with (tmp_path / "worker.stderr").open("ab") as err:
            worker = subprocess.Popen(
                [sys.executable, "-m", "tenure", "worker", "tests.ha.apps:sched"],
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:

            def oks() -> int:
                return sum(
                    1 for r in read_lines(list(tmp_path.glob("sched-*.jsonl"))) if r["ph"] == "ok"
                )

            _wait(lambda: oks() >= 3, 60, "the first runs")
            proxy.blackhole()
            time.sleep(STALL)
            proxy.heal()
            after = oks()
            _wait(lambda: oks() >= after + 6, 60, "runs after the stall")
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
    lines = read_lines(list(tmp_path.glob("sched-*.jsonl")))
    late = [r for r in lines if r["ph"] == "begin" and r["left"] < 0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        twice = conn.execute(
            sql.SQL(
                "SELECT job_key, slot, count(*) FROM {}.ha_evidence"
                " GROUP BY 1, 2 HAVING count(*) > 1"
            ).format(sql.Identifier(schema))
        ).fetchall()
    assert not late, f"runs started after their lease's local deadline: {late}"
    assert not twice, f"slots with two committed runs: {twice}"
