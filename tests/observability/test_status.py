"""`tenure status`: the cluster-wide view read from the database agrees with the run history.

Runs are real: an in-process worker runs jobs that succeed, fail, lose their lease (an
operator expires it mid-run) and have a write rejected as stale (another client takes the job
over mid-run); then `tenure status --json` runs as a child process and is compared with the
job_runs, job_leases, scheduled_jobs and report_results rows.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from typing import Any

import psycopg
import pytest

import tenure
from tenure.db.channels import channel
from tenure.scheduler.jobs import pause
from tests.support.env import run_tenure, tenure_env
from tests.support.fix_proxy import Proxy
from tests.support.scheduler_support import InProcessWorker, query, wait_for

NEVER = "0 0 1 1 *"
OK_SLEEP = 0.02


def percentile_cont(values: list[float], q: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def build_app(dsn: str, schema: str) -> tenure.Scheduler:
    app = tenure.Scheduler(dsn, schema=schema, concurrency=4, shutdown_grace="5s")

    @app.job("st-ok", every="1s", ttl="5s")
    def ok(ctx: tenure.JobContext) -> None:
        time.sleep(OK_SLEEP)
        ctx.results.put({"token": ctx.token})

    @app.job("st-fail", every="1s", ttl="5s")
    def fail(ctx: tenure.JobContext) -> None:
        raise RuntimeError("boom")

    @app.job("st-lost", cron=NEVER, ttl="1.5s")
    def lost(ctx: tenure.JobContext) -> None:
        if ctx.attempt == 1:
            # An operator expires the lease: the next renewal is refused, the run stops.
            with tenure.connect(dsn, schema=schema) as other:
                other.release(ctx.job_key)
            ctx.wait(10)
            ctx.check()

    @app.job("st-stale", cron=NEVER, ttl="1.5s")
    def stale(ctx: tenure.JobContext) -> None:
        if ctx.attempt == 1:
            # Another client expires the lease and takes the job over (token + 1, for half a
            # second; or the worker's retry claims it first): this run's write is refused.
            with tenure.connect(dsn, schema=schema) as other:
                other.release(ctx.job_key)
                other.acquire(ctx.job_key, ttl=0.5)
        ctx.results.put({"token": ctx.token})

    @app.job("st-paused", cron=NEVER, ttl="5s")
    def hourly(ctx: tenure.JobContext) -> None:
        pass

    return app


def history(dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    rows = query(
        dsn,
        schema,
        "SELECT job_key, slot, kind, token, outcome, started_at, finished_at "
        "FROM {schema}.job_runs WHERE started_at IS NOT NULL ORDER BY run_id",
    )
    out: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        out.setdefault(row[0], []).append(row)
    return out


def outcomes(dsn: str, schema: str, key: str) -> list[str]:
    return [r[4] for r in history(dsn, schema).get(key, [])]


@pytest.fixture
def ran(dsn: str, schema: str, client: tenure.Client) -> dict[str, list[tuple[Any, ...]]]:
    """Real runs of every kind, then the worker stops; returns the run history."""
    lease = client.acquire("st-lease-only", ttl=60)
    assert lease is not None
    client.results.put("st-lease-only", {"by": "library"}, token=lease.token)
    app = build_app(dsn, schema)
    env = tenure_env(dsn, schema)
    with InProcessWorker(app):
        pause(client, "st-paused", channel=channel("jobs", schema))
        for key in ("st-lost", "st-stale"):
            done = run_tenure(["jobs", "trigger", key], env)
            assert done.returncode == 0, done.stderr
        for key, want in (
            ("st-lost", ["lease_lost", "succeeded"]),
            ("st-stale", ["stale_rejected", "succeeded"]),
        ):
            wait_for(
                lambda k=key, w=want: outcomes(dsn, schema, k) == w,
                timeout=20,
                what=f"{key} to be retried after its first run",
            )
        wait_for(
            lambda: (
                outcomes(dsn, schema, "st-ok").count("succeeded") >= 3
                and outcomes(dsn, schema, "st-fail").count("failed") >= 2
            ),
            timeout=20,
            what="a few runs of st-ok and st-fail",
        )
    return history(dsn, schema)


def status_json(dsn: str, schema: str, *args: str) -> dict[str, dict[str, Any]]:
    out = run_tenure(["status", "--json", *args], tenure_env(dsn, schema))
    assert out.returncode == 0, out.stderr
    return {row["job"]: row for row in json.loads(out.stdout)}


def test_status_json_agrees_with_the_run_history(
    dsn: str, schema: str, ran: dict[str, list[tuple[Any, ...]]]
) -> None:
    rows = status_json(dsn, schema)
    assert set(rows) == {"st-ok", "st-fail", "st-lost", "st-stale", "st-paused", "st-lease-only"}
    leases = dict(query(dsn, schema, "SELECT job_key, fencing_token FROM {schema}.job_leases"))
    results = dict(
        query(dsn, schema, "SELECT job_key, applied_fencing_token FROM {schema}.report_results")
    )
    slots = dict(query(dsn, schema, "SELECT job_key, next_slot FROM {schema}.scheduled_jobs"))
    for key, row in rows.items():
        runs = ran.get(key, [])
        assert row["token"] == leases.get(key), key
        assert row["result_token"] == results.get(key), key
        assert row["scheduled"] is (key in slots), key
        if key in slots:
            assert dt.datetime.fromisoformat(row["next_slot"]) == slots[key], key
        assert row["window_seconds"] == 3600
        assert row["runs"] == len(runs), key
        assert row["failures"] == sum(r[4] == "failed" for r in runs), key
        assert row["lost_leases"] == sum(r[4] == "lease_lost" for r in runs), key
        assert row["stale_rejections"] == sum(r[4] == "stale_rejected" for r in runs), key
        durations = [
            (r[6] - r[5]).total_seconds()
            for r in runs
            if r[4] in ("succeeded", "failed") and r[6] is not None
        ]
        for q, field in ((0.5, "duration_p50"), (0.95, "duration_p95"), (0.99, "duration_p99")):
            if durations:
                assert row[field] == pytest.approx(percentile_cont(durations, q), abs=1e-6)
            else:
                assert row[field] is None, (key, field)
        if runs:
            _key, slot, kind, token, outcome, started, _finished = runs[-1]
            last = row["last_run"]
            assert (last["token"], last["outcome"], last["kind"]) == (token, outcome, kind), key
            assert dt.datetime.fromisoformat(last["slot"]) == slot
            assert dt.datetime.fromisoformat(last["started_at"]) == started
        else:
            assert row["last_run"] is None, key

    # What the scenario made, spelled out.
    assert (rows["st-lost"]["runs"], rows["st-lost"]["lost_leases"]) == (2, 1)
    assert (rows["st-stale"]["runs"], rows["st-stale"]["stale_rejections"]) == (2, 1)
    stale_runs = ran["st-stale"]
    # The result is the retry's, whose token superseded the stale run's.
    assert rows["st-stale"]["result_token"] == stale_runs[1][3] > stale_runs[0][3]
    assert rows["st-fail"]["failures"] == rows["st-fail"]["runs"] >= 2
    assert rows["st-ok"]["failures"] == 0 and rows["st-ok"]["duration_p50"] >= OK_SLEEP
    assert rows["st-paused"]["paused"] is True and rows["st-paused"]["runs"] == 0
    only = rows["st-lease-only"]
    assert only["scheduled"] is False and only["held"] is True and only["next_slot"] is None
    assert only["runs"] == 0 and only["last_run"] is None and only["duration_p50"] is None
    assert 0 < only["seconds_left"] <= 60 and only["result_token"] == only["token"]
    # Nothing holds the finished scheduled jobs.
    assert rows["st-ok"]["held"] is False


def test_window_limits_the_counts(
    dsn: str, schema: str, ran: dict[str, list[tuple[Any, ...]]]
) -> None:
    time.sleep(1.5)  # the worker has stopped: every run is older than a second now
    rows = status_json(dsn, schema, "--window", "1s")
    assert all(row["runs"] == 0 and row["duration_p50"] is None for row in rows.values())
    assert rows["st-ok"]["last_run"] is not None  # the last run is shown whatever the window
    assert rows["st-ok"]["window_seconds"] == 1


def test_status_table_and_bad_window(
    dsn: str, schema: str, ran: dict[str, list[tuple[Any, ...]]]
) -> None:
    env = tenure_env(dsn, schema)
    table = run_tenure(["status"], env)
    assert table.returncode == 0, table.stderr
    for key in ("st-ok", "st-stale", "st-lease-only"):
        assert key in table.stdout
    bad = run_tenure(["status", "--window", "0"], env)
    assert bad.returncode == 2 and "must be positive" in bad.stderr


def test_status_shows_tenure_exec_runs(client: tenure.Client, dsn: str, schema: str) -> None:
    """`tenure exec` runs count in status like the scheduler's: last run, outcome, counts."""
    env = tenure_env(dsn, schema)
    ok = run_tenure(["exec", "--key", "ex-job", "--", "true"], env)
    assert ok.returncode == 0, ok.stderr
    bad = run_tenure(["exec", "--key", "ex-job", "--", "sh", "-c", "exit 3"], env)
    assert bad.returncode == 3, bad.stderr
    out = run_tenure(["status", "--json"], env)
    assert out.returncode == 0, out.stderr
    [row] = [r for r in json.loads(out.stdout) if r["job"] == "ex-job"]
    assert (row["runs"], row["failures"], row["lost_leases"]) == (2, 1, 0), row
    last = row["last_run"]
    assert last is not None, row
    assert (last["kind"], last["token"], last["outcome"], last["exit_code"]) == (
        "exec",
        2,
        "failed",
        3,
    )
    assert last["finished_at"] is not None and row["duration_p50"] is not None
    table = run_tenure(["status"], env)
    [line] = [line for line in table.stdout.splitlines() if line.startswith("ex-job ")]
    assert "failed (exit 3)" in line and " 2/1/0/0 " in line, table.stdout


def test_status_names_the_member_that_answered_and_its_timeline(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """Through an HA endpoint (HAProxy, a multi-host DSN) status says which server answered,
    as the server sees itself (not the endpoint it was given), and the WAL timeline its
    tokens are floored on, as doctor's server check does (issue 30). A proxy stands in for
    the endpoint; tests/ha checks the member is Patroni's leader."""
    proxy = Proxy.from_dsn(dsn)
    proxy.start()
    try:
        env = tenure_env(proxy.dsn(dsn), schema)
        empty = run_tenure(["status"], env)  # migrated, nothing leased yet
        lease = client.acquire("st-member", ttl=60)
        assert lease is not None
        as_json = run_tenure(["status", "--json"], env)
        table = run_tenure(["status"], env)
    finally:
        proxy.stop()
    with psycopg.connect(dsn) as conn:
        [(address, port, timeline)] = conn.execute(
            "SELECT host(inet_server_addr()), inet_server_port(),"
            " ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
        ).fetchall()
    member = f"{address}:{port}" if address is not None else f"socket, port {port}"
    assert member != f"127.0.0.1:{proxy.port}"
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)
    assert (row["answered_by"], row["timeline"], row["standby"]) == (member, timeline, False)
    assert table.returncode == 0, table.stderr
    said = f"answered by {member} (primary, timeline {timeline})"
    assert said in table.stdout.splitlines()[0], table.stdout
    assert empty.returncode == 0 and said in empty.stdout, empty.stdout
