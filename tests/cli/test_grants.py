"""`tenure grants`: the least privilege an application role needs, proved by a real role.

The schema is migrated by the test's superuser (the owner); a fresh login role gets exactly
the statements `tenure grants` prints, and runs `tenure exec`, `tenure worker`, `tenure
relay`, `tenure status` and `tenure doctor` as real processes under that role.
"""

from __future__ import annotations

import datetime as dt
import json
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tenure
from tenure.db.privileges import TABLES
from tests.support.env import run_tenure, tenure_env
from tests.support.roles import app_role

PY = sys.executable

WORKER_APP = """
import tenure

app = tenure.Scheduler()


@app.job("ticker", every="1s", ttl="10s")
def ticker(ctx):
    ctx.results.put({"token": ctx.token})
"""

HANDLERS = """
import os, pathlib

import psycopg

import tenure

OUT = pathlib.Path(os.environ["GRANTS_TEST_OUT"])


def mail(message):
    # The consumer's side too, as the application role: the inbox makes it apply once.
    with psycopg.connect(os.environ["TENURE_DSN"]) as conn, conn.transaction():
        schema = os.environ["TENURE_SCHEMA"]
        if tenure.inbox.claim(conn, "mailer", message.idempotency_key, schema=schema):
            with open(OUT, "a") as f:
                f.write(message.key + "\\n")


HANDLERS = {"mail": mail}
"""


def _wait(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as err:
        return subprocess.Popen(
            [PY, "-m", "tenure", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
        )


def _stop(proc: subprocess.Popen[str], log: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0, log.read_text()
    assert "permission denied" not in log.read_text()


def test_grants_prints_quoted_statements_for_every_table(dsn: str, schema: str) -> None:
    out = run_tenure(
        ["grants", "--role", 'app"x', "--schema", "my schema"], tenure_env(dsn, schema)
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(line.startswith(("--", "GRANT ")) for line in lines)
    assert 'GRANT USAGE ON SCHEMA "my schema" TO "app""x";' in lines
    assert 'GRANT SELECT, INSERT, DELETE ON "my schema"."exec_slots" TO "app""x";' in lines
    assert len([line for line in lines if line.startswith("GRANT")]) == 1 + len(TABLES)
    bad = run_tenure(["grants", "--role", "x" * 64], tenure_env(dsn, schema))
    assert bad.returncode == 2 and "63 bytes" in bad.stderr


@pytest.mark.slow
def test_a_role_with_exactly_the_printed_grants_runs_exec_worker_relay_and_status(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass  # migrated by the owner, never by the application role
    (tmp_path / "grants_app.py").write_text(WORKER_APP)
    (tmp_path / "grants_handlers.py").write_text(HANDLERS)
    delivered = tmp_path / "delivered"
    with app_role(dsn, schema) as role:
        env = tenure_env(role, schema, PYTHONPATH=str(tmp_path), GRANTS_TEST_OUT=str(delivered))
        with psycopg.connect(role) as conn:
            [(who,)] = conn.execute("SELECT current_user").fetchall()
            assert who == psycopg.conninfo.conninfo_to_dict(role)["user"]

        # tenure exec: a slot, a strict result write from the command, then "already done".
        put = f"""echo '{{"by": "exec"}}' | {PY} -m tenure result put"""
        run = ["exec", "--key", "nightly", "--every", "1h", "--", "sh", "-c", put]
        first = run_tenure(run, env)
        assert first.returncode == 0, first.stderr
        again = run_tenure(run, env)
        assert again.returncode == 0 and "already done" in again.stderr, again.stderr

        # The library as the role: a lease, a fenced transaction that enqueues a message.
        with tenure.connect(role, schema=schema) as client, psycopg.connect(role) as conn:
            lease = client.acquire("producer", ttl=30)
            assert lease is not None
            with conn.transaction():
                tenure.fence(conn, "producer", lease.token, schema=schema)
                tenure.outbox.enqueue(
                    conn, "mail", "m-1", {"to": "ops"}, job_key="producer", token=lease.token,
                    schema=schema,
                )  # fmt: skip
            lease.release()

        # tenure relay delivers it.
        relay_log = tmp_path / "relay.log"
        relay = _start(["relay", "--handlers", "grants_handlers:HANDLERS"], env, relay_log)
        try:
            assert relay.stdout is not None
            ready, _, _ = select.select([relay.stdout], [], [], 60)
            assert ready and "delivering" in relay.stdout.readline(), relay_log.read_text()
            _wait(lambda: delivered.exists() and delivered.read_text(), "the delivery")
        finally:
            _stop(relay, relay_log)
        assert delivered.read_text().split() == ["m-1"]
        purge = run_tenure(["outbox", "purge", "--older-than", "0s"], env)
        assert purge.returncode == 0, purge.stderr

        # tenure worker registers its job, runs it and stores a strict result.
        worker_log = tmp_path / "worker.log"
        worker = _start(["worker", "grants_app:app"], env, worker_log)
        try:
            with tenure.connect(dsn, schema=schema) as owner:
                _wait(lambda: owner.results.get("ticker"), "the worker's first run")
        finally:
            _stop(worker, worker_log)
        with tenure.connect(role, schema=schema) as client:
            # The workers' history pruning (it runs at a random moment in a worker's life):
            # the same statement, as the role.
            client.fetch(
                "sched_prune",
                {"retention": dt.timedelta(0), "batch": 10},
                doing="pruning",
                wrote=True,
            )

        # tenure status and doctor, as the role.
        status = run_tenure(["status", "--json"], env)
        assert status.returncode == 0, status.stderr
        jobs = {row["job"] for row in json.loads(status.stdout)}
        assert {"nightly", "producer", "ticker"} <= jobs
        doctor = run_tenure(["doctor", "--json"], env)
        report = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert report["privileges"]["status"] == "ok", report["privileges"]

    with tenure.connect(dsn, schema=schema) as owner:
        stored = owner.results.get("nightly")
        assert stored is not None and stored.payload == {"by": "exec"}
