"""The metrics endpoint of real `tenure worker` and `tenure relay` processes.

One scenario (module fixture) runs two workers and a relay with ``--metrics-port``, drives
scheduled runs, a stale-token rejection provoked with SIGSTOP (the seed's scenario) and
outbox deliveries, and scrapes ``/metrics`` before and after. Further tests: ``/readyz``
through a fault proxy (database stopped, partitioned, back), prometheus_client's
multiprocess mode, and that every metric the shipped dashboard and alerts query exists.

The worker processes run this module's ``app``; the relay its ``HANDLERS``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import tenure
from tenure.db import migrations
from tenure.observability import exporter as observe
from tenure.observability import http
from tenure.outbox import enqueue
from tests.observability.test_alerts import (
    ALERTS,
    ALERTS_TEST,
    dashboard_exprs,
    dashboard_legends,
    printed_labels,
    queried_labels,
    queried_metrics,
    rule_exprs,
)
from tests.support.env import ROOT, run_tenure, tenure_env
from tests.support.fix_proxy import Proxy
from tests.support.scheduler_support import query, wait_for
from tests.support.servers import free_port

# -- what the child processes run ----------------------------------------------------------

NEVER = "0 0 1 1 *"  # once a year: runs only when triggered
TICK_SLEEP = 0.05  # every obs-tick run takes at least this long

app = tenure.Scheduler(concurrency=4)

APP = "tests.observability.test_observe:app"
HANDLERS_SPEC = "tests.observability.test_observe:HANDLERS"


@app.job("obs-tick", every="1s", ttl="5s")
def obs_tick(ctx: tenure.JobContext) -> None:
    time.sleep(TICK_SLEEP)


@app.job("obs-slow", cron=NEVER, ttl=os.environ.get("OBS_TTL", "1.5s"))
def obs_slow(ctx: tenure.JobContext) -> None:
    # time.sleep, not ctx.wait: a stalled holder must carry on and try its write.
    time.sleep(float(os.environ.get("OBS_SLOW", "3")))
    ctx.results.put({"pid": os.getpid(), "token": ctx.token})


def _deliver_ok(message: Any) -> None:
    return None


def _deliver_bad(message: Any) -> None:
    raise RuntimeError("consumer down")


HANDLERS = {"obs-ok": _deliver_ok, "obs-bad": _deliver_bad}

# -- helpers --------------------------------------------------------------------------------

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(port: int, path: str, timeout: float = 20) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def scrape(port: int) -> Samples:
    status, text = get(port, "/metrics")
    assert status == 200, text
    return parse(text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none).

    A label name no sample of ``name`` carries fails: otherwise a renamed label would make
    every ``== 0`` assertion pass."""
    want = set(labels.items())
    carried = {k for (n, lab) in samples if n == name for k, _ in lab}
    assert not carried or set(labels) <= carried, f"{name} has no label {set(labels) - carried}"
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


class Proc:
    """A `python -m tenure ...` child with its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tenure", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for_line(self, text: str, timeout: float = 30) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited with {self.proc.returncode}:\n{self.log()}")
            return text in self.log()

        wait_for(seen, timeout=timeout, what=f"{text!r} from pid {self.pid}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()


def migrated_schema(dsn: str) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with tenure.connect(dsn, schema=name, migrate=True):
        pass
    return name


def drop_schema(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(name))
        )


def runs(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT token, pid, outcome FROM {schema}.job_runs "
        "WHERE job_key = %s AND started_at IS NOT NULL ORDER BY run_id",
        (key,),
    )


# -- the scenario ---------------------------------------------------------------------------


@dataclass
class Scenario:
    dsn: str
    schema: str
    ports: dict[str, int]
    baseline: dict[str, Samples] = field(default_factory=dict)
    final: dict[str, Samples] = field(default_factory=dict)
    stalled: str = ""  # "w1" or "w2": the worker that was SIGSTOPped
    successor: str = ""
    slow_token: int = 0


@pytest.fixture(scope="module")
def scenario(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    tmp = tmp_path_factory.mktemp("observe")
    schema = migrated_schema(dsn)
    ports = {"w1": free_port(), "w2": free_port(), "relay": free_port()}
    env = tenure_env(dsn, schema, OBS_SLOW="3", OBS_TTL="1.5s")
    procs: dict[str, Proc] = {}
    try:
        for name in ("w1", "w2"):
            procs[name] = Proc(
                [
                    "worker",
                    APP,
                    "--metrics-port",
                    str(ports[name]),
                ],
                env,
                tmp / f"{name}.log",
            )
        procs["relay"] = Proc(
            [
                *("relay", "--handlers", HANDLERS_SPEC),
                *("--topic", "obs-ok", "--topic", "obs-bad", "--max-attempts", "2"),
                *("--backoff", "0.1s", "--backoff-max", "0.2s", "--poll", "0.5s"),
                *("--metrics-port", str(ports["relay"])),
            ],
            env,
            tmp / "relay.log",
        )
        for name in ("w1", "w2"):
            procs[name].wait_for_line(" started: ")
        procs["relay"].wait_for_line("delivering obs-bad, obs-ok")
        sc = Scenario(dsn, schema, ports)
        for name, port in ports.items():
            assert get(port, "/healthz") == (200, "ok\n")
            sc.baseline[name] = scrape(port)

        # Outbox: three deliveries, one message that fails twice (then dead), one that no
        # relay claims (its topic is not served: it stays pending).
        with psycopg.connect(dsn) as conn, conn.transaction():
            for i in range(3):
                enqueue(conn, "obs-ok", f"k{i}", {"i": i}, schema=schema)
            enqueue(conn, "obs-bad", "b0", {}, schema=schema)
            enqueue(conn, "obs-idle", "i0", {}, schema=schema)

        # The seed's scenario: the holder of obs-slow is frozen past its TTL, the other
        # worker takes over (token + 1), the frozen one resumes and its write is rejected.
        done = run_tenure(["jobs", "trigger", "obs-slow"], env)
        assert done.returncode == 0, done.stderr
        [(token, pid, _)] = wait_for(
            lambda: runs(dsn, schema, "obs-slow"), timeout=15, what="obs-slow to start"
        )
        sc.slow_token = token
        sc.stalled = next(n for n in ("w1", "w2") if procs[n].pid == pid)
        sc.successor = "w2" if sc.stalled == "w1" else "w1"
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: len(runs(dsn, schema, "obs-slow")) == 2,
                timeout=20,
                what="the other worker to take obs-slow over",
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(
            lambda: (
                [r[2] for r in runs(dsn, schema, "obs-slow")] == ["stale_rejected", "succeeded"]
            ),
            timeout=20,
            what="both obs-slow runs to end",
        )
        wait_for(
            lambda: [r for r in runs(dsn, schema, "obs-tick") if r[2] == "succeeded"][3:],
            timeout=20,
            what="a few obs-tick runs",
        )

        def settled() -> bool:
            sc.final = {name: scrape(port) for name, port in ports.items()}
            relay = sc.final["relay"]
            stalled = sc.final[sc.stalled]
            slow = {"job_key": "obs-slow"}
            return (
                value(relay, "tenure_outbox_delivery_attempts_total", outcome="delivered") == 3
                and value(relay, "tenure_outbox_delivery_attempts_total", outcome="dead") == 1
                and value(relay, "tenure_outbox_dead_messages", topic="obs-bad") == 1
                and value(relay, "tenure_outbox_pending_messages", topic="obs-idle") == 1
                and value(stalled, "tenure_job_runs_total", **slow) == 1
                and value(sc.final[sc.successor], "tenure_job_runs_total", **slow) == 1
                # The database snapshot (cached a few seconds) is newer than the success.
                and value(stalled, "tenure_job_last_success_timestamp_seconds", **slow) > 0
            )

        wait_for(settled, timeout=30, interval=0.5, what="the metrics to show the scenario")
        yield sc
    finally:
        for proc in procs.values():
            proc.stop()
        drop_schema(dsn, schema)


def test_job_runs_and_their_duration_buckets_moved(scenario: Scenario) -> None:
    before = sum(
        value(scenario.baseline[w], "tenure_job_runs_total", job_key="obs-tick")
        for w in ("w1", "w2")
    )
    after = {w: scenario.final[w] for w in ("w1", "w2")}
    succeeded = sum(
        value(s, "tenure_job_runs_total", job_key="obs-tick", outcome="succeeded")
        for s in after.values()
    )
    assert succeeded >= 3 and succeeded > before
    [(in_db,)] = query(
        scenario.dsn,
        scenario.schema,
        "SELECT count(*) FROM {schema}.job_runs WHERE job_key = 'obs-tick' "
        "AND outcome = 'succeeded'",
    )
    assert succeeded <= in_db  # a run is recorded in the database before it is counted
    for s in after.values():
        tick = {"job_key": "obs-tick", "outcome": "succeeded"}
        count = value(s, "tenure_job_duration_seconds_count", **tick)
        assert value(s, "tenure_job_duration_seconds_bucket", le="+Inf", **tick) == count
        assert value(s, "tenure_job_duration_seconds_bucket", le="60.0", **tick) == count
        # Every run sleeps TICK_SLEEP: none lands at or below 25 ms.
        assert value(s, "tenure_job_duration_seconds_bucket", le="0.025", **tick) == 0
        assert value(s, "tenure_job_duration_seconds_sum", **tick) >= count * TICK_SLEEP
    # The successor's obs-slow run slept 3 s: above the 2.5 s bucket, within 10 s.
    slow = {"job_key": "obs-slow", "outcome": "succeeded"}
    successor = scenario.final[scenario.successor]
    assert value(successor, "tenure_job_duration_seconds_count", **slow) == 1
    assert value(successor, "tenure_job_duration_seconds_bucket", le="2.5", **slow) == 0
    assert value(successor, "tenure_job_duration_seconds_bucket", le="30.0", **slow) == 1


def test_a_stale_rejection_provoked_with_sigstop_is_counted(scenario: Scenario) -> None:
    stalled = scenario.final[scenario.stalled]
    successor = scenario.final[scenario.successor]
    job = {"job_key": "obs-slow"}
    assert value(scenario.baseline[scenario.stalled], "tenure_stale_token_rejections_total") == 0
    # The frozen holder's result write went through ctx.results.put, a strict result write
    # (fence()'s rule in the result statement): refused, and counted as a result write.
    assert value(stalled, "tenure_stale_token_rejections_total", site="result", **job) == 1
    assert value(stalled, "tenure_stale_token_rejections_total", site="fence", **job) == 0
    assert value(stalled, "tenure_job_runs_total", outcome="stale_rejected", **job) == 1
    assert value(stalled, "tenure_lease_lost_total", **job) == 1
    # Counted out once (lost), not once more at the end of its run.
    assert value(stalled, "tenure_leases_held", **job) == 0
    assert value(successor, "tenure_stale_token_rejections_total", **job) == 0
    assert value(successor, "tenure_job_runs_total", outcome="succeeded", **job) == 1
    assert value(successor, "tenure_lease_acquire_total", outcome="acquired", **job) == 1
    assert value(successor, "tenure_leases_held", **job) == 0
    [(result_token,)] = query(
        scenario.dsn,
        scenario.schema,
        "SELECT applied_fencing_token FROM {schema}.report_results WHERE job_key = 'obs-slow'",
    )
    assert result_token == scenario.slow_token + 1


def test_schedule_lateness_histogram(scenario: Scenario) -> None:
    total = 0.0
    for w in ("w1", "w2"):
        s = scenario.final[w]
        tick = {"job_key": "obs-tick"}
        count = value(s, "tenure_schedule_lateness_seconds_count", **tick)
        assert value(s, "tenure_schedule_lateness_seconds_bucket", le="+Inf", **tick) == count
        assert value(s, "tenure_schedule_lateness_seconds_sum", **tick) >= 0
        total += count
    assert total >= 3
    # Triggered runs are not late for a slot: no lateness for obs-slow.
    assert all(
        value(scenario.final[w], "tenure_schedule_lateness_seconds_count", job_key="obs-slow") == 0
        for w in ("w1", "w2")
    )


def test_outbox_metrics(scenario: Scenario) -> None:
    relay = scenario.final["relay"]
    attempts = "tenure_outbox_delivery_attempts_total"
    assert value(scenario.baseline["relay"], attempts) == 0
    assert value(relay, attempts, topic="obs-ok", outcome="delivered") == 3
    assert value(relay, attempts, topic="obs-bad", outcome="retry") == 1
    assert value(relay, attempts, topic="obs-bad", outcome="dead") == 1
    assert value(relay, "tenure_outbox_delivery_duration_seconds_count", topic="obs-bad") == 2
    assert value(relay, "tenure_outbox_pending_messages", topic="obs-idle") == 1
    assert value(relay, "tenure_outbox_pending_messages", topic="obs-ok") == 0
    assert value(relay, "tenure_outbox_dead_messages", topic="obs-bad") == 1
    assert value(relay, "tenure_outbox_oldest_pending_age_seconds", topic="obs-idle") > 0
    # obs-idle has no handler on the running relay: it waits, counted as unhandled.
    assert value(relay, "tenure_outbox_unhandled_messages", topic="obs-idle") == 1
    assert value(relay, "tenure_outbox_unhandled_messages", topic="obs-ok") == 0
    # Cluster-wide gauges: a worker serves the same outbox view.
    worker = scenario.final["w1"]
    assert value(worker, "tenure_outbox_pending_messages", topic="obs-idle") == 1


def test_database_gauges(scenario: Scenario) -> None:
    s = scenario.final["w1"]
    assert value(s, "tenure_database_up") == 1
    assert value(s, "tenure_schema_version") == migrations.latest()
    assert value(s, "tenure_job_interval_seconds", job_key="obs-tick") == 1.0
    # Once a year: 365 or 366 days.
    assert value(s, "tenure_job_interval_seconds", job_key="obs-slow") in (365 * 86400, 366 * 86400)
    assert value(s, "tenure_job_paused", job_key="obs-tick") == 0
    assert value(s, "tenure_job_quarantined", job_key="obs-tick") == 0
    since = value(s, "tenure_job_seconds_since_success", job_key="obs-tick")
    assert 0 < since < 60
    [(first, last)] = query(
        scenario.dsn,
        scenario.schema,
        "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at)) "
        "FROM {schema}.job_runs WHERE job_key = 'obs-tick' AND outcome = 'succeeded'",
    )
    stamp = value(s, "tenure_job_last_success_timestamp_seconds", job_key="obs-tick")
    assert float(first) <= stamp <= float(last)


def test_no_owner_or_token_labels(scenario: Scenario) -> None:
    for samples in scenario.final.values():
        for name, labels in samples:
            if name.startswith("tenure_"):
                assert {k for k, _ in labels} <= {
                    "job_key",
                    "outcome",
                    "reason",
                    "site",
                    "topic",
                    "le",
                    # tenure_worker_saturated{app}: shown only once a worker has reported
                    # saturation (a loaded machine can make one late here).
                    "app",
                }


def test_every_metric_the_dashboard_and_alerts_query_exists(
    scenario: Scenario, tmp_path: Path
) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    queried = queried_metrics("\n".join(exprs))
    in_rules = queried_metrics("\n".join(rule_exprs(ALERTS.read_text()).values()))
    assert len(in_rules) >= 8
    exported: set[str] = set()
    for samples in scenario.final.values():
        exported |= names(samples)
    # tenure exec's gauges reach Prometheus through node_exporter's textfile collector.
    textfile = tmp_path / "exec.prom"
    ran = run_tenure(
        ["exec", "--key", "obs-exec", "--metrics-textfile", str(textfile), "--", "true"],
        tenure_env(scenario.dsn, scenario.schema),
    )
    assert ran.returncode == 0, ran.stderr
    exported |= names(parse(textfile.read_text()))
    assert queried - exported == set(), "the dashboard queries metrics nobody exports"
    assert in_rules - exported == set(), "the alerts query metrics nobody exports"


def test_every_label_the_dashboard_and_alerts_use_is_exported(scenario: Scenario) -> None:
    exported = {
        k
        for samples in scenario.final.values()
        for name, labels in samples
        if name.startswith("tenure_")
        for k, _ in labels
    }
    assert "job_key" in exported and "job" not in exported
    target = {"job", "instance"}  # Prometheus' own, set on every series at scrape time
    rules = ALERTS.read_text()
    used = {
        "dashboard queries": queried_labels("\n".join(dashboard_exprs())),
        "dashboard legends": printed_labels("\n".join(dashboard_legends())),
        "alert rules": queried_labels("\n".join(rule_exprs(rules).values())),
        "alert annotations": printed_labels(rules),
        # The promtool tests' input series must look like what Prometheus stores.
        "alert tests' series": queried_labels(
            "\n".join(re.findall(r"series: '([^']*)'", ALERTS_TEST.read_text()))
        ),
    }
    for where, labels in used.items():
        assert labels, where
        assert labels - exported - target == set(), f"{where} use labels nobody exports"


# -- readiness through network faults --------------------------------------------------------


def test_readyz_fails_while_the_database_is_unreachable_and_recovers(
    dsn: str, tmp_path: Path
) -> None:
    schema = migrated_schema(dsn)
    port = free_port()
    try:
        with Proxy.from_dsn(dsn) as proxy:
            # The port from the environment this time (TENURE_METRICS_PORT).
            env = tenure_env(proxy.dsn(dsn), schema, TENURE_METRICS_PORT=str(port))
            worker = Proc(["worker", APP], env, tmp_path / "worker.log")
            try:
                worker.wait_for_line(" started: ")
                status, body = get(port, "/readyz")
                assert status == 200, body
                assert f"at version {migrations.latest()}" in body

                proxy.stop()  # connection refused: the database is down
                status, body = wait_for(
                    lambda: (r := get(port, "/readyz"))[0] == 503 and r,
                    timeout=20,
                    what="/readyz to fail",
                )
                assert body.startswith("not ready: database") and "unreachable" in body, body
                assert get(port, "/healthz") == (200, "ok\n")  # alive all the same
                wait_for(
                    lambda: value(scrape(port), "tenure_database_up") == 0,
                    timeout=20,
                    what="tenure_database_up to drop",
                )

                proxy.start()
                wait_for(lambda: get(port, "/readyz")[0] == 200, timeout=20, what="recovery")
                wait_for(
                    lambda: value(scrape(port), "tenure_database_up") == 1,
                    timeout=20,
                    what="tenure_database_up to come back",
                )

                proxy.blackhole()  # a partition: probes must answer anyway, not hang
                status, body = wait_for(
                    lambda: (r := get(port, "/readyz"))[0] == 503 and r,
                    timeout=30,
                    what="/readyz to fail in a partition",
                )
                assert "unreachable" in body
                proxy.heal()
                wait_for(
                    lambda: get(port, "/readyz")[0] == 200, timeout=30, what="partition healed"
                )
                assert worker.proc.poll() is None, worker.log()
            finally:
                worker.stop()
    finally:
        drop_schema(dsn, schema)


def test_readyz_wants_the_expected_schema_version(dsn: str, schema: str) -> None:
    db = observe.Database(dsn, schema)
    server = http.MetricsServer(
        http.App(observe.exposition_registry(CollectorRegistry()), db)
    ).start()
    try:
        status, body = get(server.port, "/readyz")
        assert status == 503 and "no tenure tables" in body and "tenure migrate" in body
        with tenure.connect(dsn, schema=schema, migrate=True):
            pass
        time.sleep(observe.READY_CACHE + 0.1)
        status, body = get(server.port, "/readyz")
        assert status == 200 and f"version {migrations.latest()}" in body
        assert get(server.port, "/nope")[0] == 404
    finally:
        server.close()


def test_a_busy_metrics_port_is_one_clear_line(dsn: str, schema: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run_tenure(
            [
                "relay",
                "--handlers",
                HANDLERS_SPEC,
                "--metrics-port",
                str(port),
            ],
            tenure_env(dsn, schema),
        )
    assert out.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


# -- prometheus_client's multiprocess mode ---------------------------------------------------

_MP_CHILD = textwrap.dedent(
    """
    import sys
    import tenure
    from tenure import metrics
    from tenure.observability import http

    dsn, schema, key, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    metrics.install_prometheus()
    with tenure.connect(dsn, schema=schema) as client:
        lease = client.acquire(key, ttl=60)
        assert lease is not None
        if port:
            server = http.serve(dsn=dsn, schema=schema, port=port)
        print("ready", flush=True)
        sys.stdin.read()  # until the test closes stdin
    """
)


def test_multiprocess_mode_merges_processes(dsn: str, schema: str, tmp_path: Path) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    mpdir = tmp_path / "prom"
    mpdir.mkdir()
    env = {**tenure_env(dsn, schema), "PROMETHEUS_MULTIPROC_DIR": str(mpdir)}
    port = free_port()

    def child(key: str, serve_port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", _MP_CHILD, dsn, schema, key, str(serve_port)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc

    server, other = child("mp-a", port), child("mp-b", 0)
    try:
        assert other.stdin is not None
        other.stdin.close()
        assert other.wait(timeout=30) == 0
        s = scrape(port)
        # Both processes' counters, through one endpoint.
        assert value(s, "tenure_lease_acquire_total", job_key="mp-a", outcome="acquired") == 1
        assert value(s, "tenure_lease_acquire_total", job_key="mp-b", outcome="acquired") == 1
        assert value(s, "tenure_database_up") == 1
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(other.pid, str(mpdir))  # gunicorn's child_exit hook
        s = scrape(port)
        assert value(s, "tenure_leases_held", job_key="mp-a") == 1
        assert value(s, "tenure_leases_held", job_key="mp-b") == 0  # a dead process holds nothing
        assert value(s, "tenure_lease_acquire_total", job_key="mp-b") == 1  # counters stay
    finally:
        for proc in (server, other):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
