"""`tenure verify` as a user runs it: the real command in a child process, real worker
processes, real signals, against the test server (never restarted), and through PgBouncer
in transaction mode. Durations are a few seconds: the figures are in README.md."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.env import ROOT
from tests.support.servers import PgBouncer, PgServer, ServerError, pg_bindir, pgbouncer_binary

SHORT = ["--duration", "6s", "--workers", "4", "--keys", "2"]


def _env(dsn: str) -> dict[str, str]:
    env = dict(os.environ, TENURE_DSN=dsn)
    for var in ("DATABASE_URL", "TENURE_VERIFY_THROUGH", "TENURE_PREPARE_THRESHOLD"):
        env.pop(var, None)
    return env


def _verify(
    dsn: str, tmp_path: Path, *args: str, timeout: float = 90
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "verify.json"
    out = subprocess.run(
        [sys.executable, "-m", "tenure", "verify", "--json", str(report), *args],
        env=_env(dsn),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert report.exists(), out.stdout + out.stderr
    return out, json.loads(report.read_text())


def _schema_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,))
        return row.fetchone() == (1,)


def _assert_ran_everything(report: dict[str, Any]) -> None:
    ops = report["ops"]
    # Library leases, results.put, fence() on the app's own connection, the scheduler.
    assert ops["acquire"].get("ok", 0) >= 1, ops
    assert ops["result"].get("ok", 0) >= 1 and ops["ledger"].get("ok", 0) >= 1, ops
    assert ops["claim"].get("ok", 0) >= 1, ops
    assert report["takeovers"] >= ops["acquire"]["ok"] + ops["claim"]["ok"]


def test_verify_passes_on_the_test_server_and_drops_its_schema(dsn: str, tmp_path: Path) -> None:
    out, report = _verify(dsn, tmp_path, *SHORT)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "verdict: PASS"
    assert report["verdict"] == "PASS" and report["violations"] == []
    _assert_ran_everything(report)
    for fault in ("pause", "kill", "terminate"):
        assert report["faults"].get(fault, 0) >= 1, report["faults"]
    assert report["faults_skipped"] == {} and report["backends_terminated"] >= 1
    # Progress while it ran, on stderr; counts and margins in the report.
    assert "operations" in out.stderr and "takeovers" in out.stderr
    assert any(line.startswith("timing margins") for line in lines)
    margin = report["margins"]["deadline_before_expiry"]
    assert margin is not None and margin[0] > 0
    assert report["schema"].startswith("tenure_verify_")
    assert not _schema_exists(dsn, report["schema"])


def test_unsafe_no_fence_fails_with_the_violated_invariant(dsn: str, tmp_path: Path) -> None:
    html = tmp_path / "verify.html"
    out, report = _verify(
        dsn, tmp_path, *SHORT, "--faults", "pause", "--unsafe-no-fence", "--report", str(html)
    )
    print(out.stdout)
    assert out.returncode == 1, out.stdout + out.stderr
    verdict = out.stdout.splitlines()[-1]
    assert verdict.startswith("verdict: FAIL: invariant 3 (no stale commit) violated"), verdict
    kinds = set(report["violations_by_kind"])
    assert kinds & {"ledger-regressed", "result-regressed", "ledger-after-takeover"}, kinds
    # The shortest excerpt: the stale token's grant, the pause that made it stale, and the
    # stale write that was accepted.
    excerpt = "\n".join(report["excerpt"])
    assert "acquired" in excerpt or "claimed" in excerpt, excerpt
    assert "with token" in excerpt and "shortest history excerpt" in out.stdout
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "verdict: FAIL" in page
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )  # self-contained
    assert not _schema_exists(dsn, report["schema"])


@pytest.fixture
def unprivileged(dsn: str) -> Iterator[str]:
    """A role that may create schemas but is neither superuser nor in pg_signal_backend."""
    role = f"verify_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()
        assert db is not None
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(db[0]), sql.Identifier(role)
            )
        )
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["user"] = role
    params.pop("password", None)
    yield psycopg.conninfo.make_conninfo(**params)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_without_pg_signal_backend_terminate_is_skipped_and_reported(
    unprivileged: str, dsn: str, tmp_path: Path
) -> None:
    out, report = _verify(unprivileged, tmp_path, *SHORT)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "verdict: PASS"
    assert "terminate" not in report["faults"]
    assert "pg_signal_backend" in report["faults_skipped"]["terminate"]
    assert "fault skipped: terminate" in out.stdout
    assert report["faults"].get("pause", 0) >= 1 and report["faults"].get("kill", 0) >= 1
    assert not _schema_exists(dsn, report["schema"])


def _worker_processes(schema: str) -> list[int]:
    """Live processes whose command line names the run's schema (its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"tenure.verify.worker" in cmdline and schema.encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_ctrl_c_stops_the_workers_drops_the_schema_and_prints_a_partial_verdict(
    dsn: str, tmp_path: Path
) -> None:
    report_path = tmp_path / "verify.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tenure",
            "verify",
            "--duration",
            "120s",
            "--workers",
            "4",
            "--keys",
            "2",
            "--json",
            str(report_path),
        ],
        env=_env(dsn),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the first progress line: workers are running
            if "takeovers" in line:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(stdout)
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted: stopping the workers" in stderr
    verdict = stdout.splitlines()[-1]
    assert verdict.startswith("verdict: PASS (partial: interrupted after"), verdict
    report = json.loads(report_path.read_text())
    assert report["partial"] is True and report["elapsed"] < 60
    assert report["operations"] > 0
    assert _worker_processes(report["schema"]) == []
    assert not _schema_exists(dsn, report["schema"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--faults", "pause,frobnicate"], "unknown fault 'frobnicate'"),
        (["--duration", "soon"], "not a duration"),
        (["--ttl", "0"], "out of range"),
        (["--workers", "0"], "--workers"),
        (["--report", "out.txt"], "name it .html"),
        (["--frobnicate"], "No such option"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(dsn: str, args: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tenure", "verify", *args],
        env=_env(dsn),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 2, out
    assert message in out.stderr and out.stderr.startswith("tenure: error: ")
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_help_teaches_and_shows_env_twins(dsn: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tenure", "verify", "--help"],
        env=_env(dsn),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0
    for text in (
        "TENURE_VERIFY_THROUGH",
        "TENURE_VERIFY_DURATION",
        "--unsafe-no-fence",
        "pg_signal_backend",
        "verdict: PASS",
    ):
        assert text in out.stdout, text


# -- through PgBouncer in transaction mode ------------------------------------------------------


@pytest.fixture(scope="module")
def bounced() -> Iterator[tuple[PgServer, PgBouncer]]:
    if pgbouncer_binary() is None or pg_bindir() is None:
        pytest.skip("pgbouncer or PostgreSQL server binaries are not installed")
    try:
        server = PgServer(name="verify").start()
    except ServerError as exc:
        pytest.skip(f"cannot start a throwaway PostgreSQL server: {exc}")
    try:
        with PgBouncer(server, pool_mode="transaction", pool_size=4) as bouncer:
            yield server, bouncer
    finally:
        server.close()


def test_verify_passes_through_pgbouncer_in_transaction_mode(
    bounced: tuple[PgServer, PgBouncer], tmp_path: Path
) -> None:
    server, bouncer = bounced
    out, report = _verify(server.dsn, tmp_path, *SHORT, "--through", bouncer.dsn)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "verdict: PASS"
    assert f":{bouncer.port}/" in report["through"]
    assert "workers through" in out.stdout.splitlines()[0]
    _assert_ran_everything(report)
    for fault in ("pause", "kill", "terminate"):
        assert report["faults"].get(fault, 0) >= 1, report["faults"]
    assert report["backends_terminated"] >= 1  # the pooler's server connections
    assert not _schema_exists(server.dsn, report["schema"])


def test_a_pooler_in_front_of_another_database_is_a_clear_error(
    bounced: tuple[PgServer, PgBouncer], dsn: str, tmp_path: Path
) -> None:
    _, bouncer = bounced  # in front of the throwaway server, not of `dsn`
    out = subprocess.run(
        [sys.executable, "-m", "tenure", "verify", *SHORT, "--through", bouncer.dsn],
        env=_env(dsn),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1, out
    assert "does not lead to the database of --dsn" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    schema = out.stderr.split("run's schema ")[1].split()[0]
    assert not _schema_exists(dsn, schema)
