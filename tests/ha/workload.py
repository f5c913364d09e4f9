"""The load the HA faults run under, and the checks that judge its history afterwards.

Real processes through the cluster's HA endpoint (HAProxy): two scheduler workers and a
relay (``tests/ha/apps.py``), a ``tenure exec`` loop whose command stores its result with
``tenure result put``, and, in this process, a prober that acquires and releases a lease
every 0.1 s (the time to the first successful acquire after a fault).

The evidence is both what the processes were told (JSON lines under ``HA_LOG``, which
survive a failover that loses commits) and what the surviving primary holds afterwards.
:meth:`Workload.check` returns violations of:

* ``token-reissued``: one (key, token) told to two executions (two scheduler runs of
  different slots or workers, two probe acquires, two exec runs);
* ``stale-write``: a job's evidence rows, in commit order, with a token that goes down, or
  ``tenure result put`` accepted for a token below the stored one;
* ``slot-twice``: two committed evidence rows for one (job, slot), or two acknowledged
  runs of it, except where the earlier run's COMMIT was sent and never answered (the run
  failed as far as it knows, so the slot is retried: at least once, counted apart);
* ``late-start``: a scheduled run that started after its lease's local deadline;
* ``outbox-lost`` / ``outbox-phantom``: a committed run's message never delivered, or a
  delivered message whose run is not committed (its transaction rolled back or lost);
* ``ack-lost``: a run whose commit was acknowledged is missing (asserted in synchronous mode
  only: asynchronous replication may lose the last commits, Patroni's
  ``maximum_lag_on_failover`` only bounds how many).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import tenure

from .apps import EVIDENCE, TOPIC

REPO = Path(__file__).resolve().parents[2]
TIMELINE_SHIFT = 40
EXEC_KEY = "ha-exec"
PROBE_KEY = "ha-probe"
DRAIN_TIMEOUT = 60.0

EXEC_CHILD = (
    'printf \'{"token": %s, "t": %s}\\n\' "$TENURE_FENCING_TOKEN" "$(date +%s.%N)" '
    '>> "$HA_LOG/exec-child.jsonl" && '
    'printf \'{"token": %s}\' "$TENURE_FENCING_TOKEN" | '
    f'"{sys.executable}" -m tenure result put --key {EXEC_KEY} '
    '--token "$TENURE_FENCING_TOKEN"'
)


def timeline_of(token: int) -> int:
    return (token >> TIMELINE_SHIFT) + 1


def read_lines(paths: list[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        with path.open(encoding="utf-8") as f:
            for raw in f:
                with contextlib.suppress(ValueError):  # a line torn by a kill
                    out.append(json.loads(raw))
    out.sort(key=lambda r: r["t"])
    return out


@dataclass
class Recovery:
    """Seconds from a fault to the first success of each kind after it."""

    writable: float | None  # a fresh connection through the endpoint writes on the timeline
    acquire: float | None
    claim: float | None
    delivery: float | None

    def describe(self) -> str:
        def f(v: float | None) -> str:
            return "never" if v is None else f"{v:.1f}s"

        return (
            f"writable {f(self.writable)}, acquire {f(self.acquire)}, claim {f(self.claim)}, "
            f"delivery {f(self.delivery)}"
        )


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    lost_acks: list[str] = field(default_factory=list)
    #: Slots run again after a commit whose outcome the run never learnt (at least once).
    retried: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


class Workload:
    def __init__(self, dsn: str, schema: str, log_dir: Path) -> None:
        self.dsn = dsn
        self.schema = schema
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "TENURE_DSN": dsn,
            "TENURE_SCHEMA": schema,
            "HA_LOG": str(log_dir),
            "PYTHONPATH": str(REPO),
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.probes: list[dict[str, Any]] = []
        self.execs: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []

    # -- lifecycle ------------------------------------------------------------------------

    def prepare(self) -> None:
        """tenure's tables and the evidence table in the workload's schema."""
        with tenure.connect(self.dsn, schema=self.schema, migrate=True, pool_size=1):
            pass
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL(EVIDENCE).format(schema=sql.Identifier(self.schema)))

    def start(self) -> Workload:
        self.prepare()
        app = "tests.ha.apps:sched"
        for i in range(2):
            self._spawn(f"worker{i}", [sys.executable, "-m", "tenure", "worker", app])
        self._spawn(
            "relay",
            [sys.executable, "-m", "tenure", "relay", "--handlers", "tests.ha.apps:handlers"],
        )
        for target in (self._exec_loop, self._probe_loop, self._write_loop):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with (self.log_dir / f"{name}.stderr").open("ab") as err:
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    env=self.env,
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                )
            )

    def _exec_loop(self) -> None:
        while not self.stop_event.is_set():
            t0 = time.time()
            try:
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "tenure",
                        "exec",
                        "--key",
                        EXEC_KEY,
                        "--ttl",
                        "6s",
                        "--grace",
                        "2s",
                        "--",
                        "sh",
                        "-c",
                        EXEC_CHILD,
                    ],
                    env=self.env,
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                rec = {"t0": t0, "t": time.time(), "rc": proc.returncode, "err": proc.stderr}
            except subprocess.TimeoutExpired:
                rec = {"t0": t0, "t": time.time(), "rc": None, "err": "timeout"}
            self.execs.append(rec)
            self.stop_event.wait(0.2)

    def _probe_loop(self) -> None:
        with tenure.connect(self.dsn, schema=self.schema, pool_size=1) as client:
            while not self.stop_event.is_set():
                t0 = time.time()
                try:
                    lease = client.acquire(PROBE_KEY, ttl=2)
                    if lease is not None:
                        # left: seconds to the local deadline; an acquire answered late (a
                        # request held in a cut network) is lost on arrival.
                        left = lease.deadline_in
                        self.probes.append(
                            {"t0": t0, "t": time.time(), "token": lease.token, "left": left}
                        )
                        with contextlib.suppress(tenure.TenureError):
                            lease.release()
                except tenure.TenureError as exc:
                    self.probes.append({"t0": t0, "t": time.time(), "error": type(exc).__name__})
                self.stop_event.wait(0.1)

    def _write_loop(self) -> None:
        """A fresh connection every 0.1 s that writes (a temp table) and reads the timeline:
        when the endpoint leads to a writable primary again, apart from tenure's clients."""
        while not self.stop_event.is_set():
            t0 = time.time()
            with contextlib.suppress(psycopg.Error):
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=1) as conn:
                    conn.execute(b"CREATE TEMP TABLE w ()")
                    row = conn.execute(
                        b"SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
                        b"::bit(32)::int"
                    ).fetchone()
                if row is not None:
                    self.writes.append({"t0": t0, "t": time.time(), "timeline": row[0]})
            self.stop_event.wait(0.1)

    def running(self) -> list[str]:
        """Processes that died on their own (a workload that crashed tests nothing)."""
        return [f"{p.args} exited {p.returncode}" for p in self.procs if p.poll() is not None]

    def stop(self) -> None:
        """Stop the scheduler workers and loops; let the relay deliver what is committed,
        then stop it too."""
        self.stop_event.set()
        workers, relay = self.procs[:2], self.procs[2]
        for p in workers:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in workers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for t in self.threads:
            t.join(70)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while time.monotonic() < deadline and relay.poll() is None:
            with contextlib.suppress(psycopg.Error):
                if self._pending() == 0:
                    break
            time.sleep(0.2)
        self.kill()

    def kill(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)

    def _pending(self) -> int:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.outbox WHERE state = 'pending'").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()
        return int(row[0]) if row else -1

    # -- evidence -------------------------------------------------------------------------

    def sched_lines(self) -> list[dict[str, Any]]:
        return read_lines(sorted(self.log_dir.glob("sched-*.jsonl")))

    def relay_lines(self) -> list[dict[str, Any]]:
        return read_lines(sorted(self.log_dir.glob("relay-*.jsonl")))

    def exec_lines(self) -> list[dict[str, Any]]:
        path = self.log_dir / "exec-child.jsonl"
        return read_lines([path]) if path.exists() else []

    def recovery(self, fault_t: float, timeline: int) -> Recovery:
        """Seconds from ``fault_t`` to the first acquire, claim and delivery made after it
        on ``timeline`` (the new primary's, read from the tokens' high bits) and after the
        first failure the prober saw (a crash restart may keep the timeline)."""
        errors = [p["t"] for p in self.probes if "error" in p and p["t"] >= fault_t]
        since = errors[0] if errors else fault_t

        def first(times: list[float]) -> float | None:
            return min(times) - fault_t if times else None

        writable = first(
            [w["t"] for w in self.writes if w["t0"] >= since and w["timeline"] == timeline]
        )
        acquire = first(
            [
                p["t"]
                for p in self.probes
                if "token" in p
                and p["t0"] >= since
                and p["left"] > 0
                and timeline_of(p["token"]) == timeline
            ]
        )
        runs = [
            r
            for r in self.sched_lines()
            if r["ph"] == "begin" and r["t"] >= since and timeline_of(r["token"]) == timeline
        ]
        claim = first([r["t"] for r in runs])
        new_keys = {f"{r['job']}@{r['slot']}@{r['token']}" for r in runs}
        delivery = first([d["t"] for d in self.relay_lines() if d["key"] in new_keys])
        return Recovery(writable=writable, acquire=acquire, claim=claim, delivery=delivery)

    def done_between(self, t1: float, t2: float, *, grace: float, exec_grace: float) -> list[str]:
        """What succeeded through the endpoint between ``t1`` and ``t2``: probe acquires and
        writes attempted after ``t1`` and answered before ``t2``, runs begun more than
        ``grace`` and exec children started more than ``exec_grace`` after ``t1`` (their
        claim or acquire may have been answered just before it) and before ``t2``."""
        done = [f"acquire {p}" for p in self.probes if "token" in p and t1 <= p["t0"] < p["t"] < t2]
        done += [f"write {w}" for w in self.writes if t1 <= w["t0"] < w["t"] < t2]
        done += [
            f"run begun {r}"
            for r in self.sched_lines()
            if r["ph"] == "begin" and t1 + grace < r["t"] < t2
        ]
        done += [f"exec child {e}" for e in self.exec_lines() if t1 + exec_grace < e["t"] < t2]
        return done

    def cut_outcomes(self, t1: float, t2: float) -> str:
        """How the load's attempts that ended between ``t1`` and ``t2`` failed: the probe's
        errors and tenure exec's exit codes."""
        errors: dict[str, int] = defaultdict(int)
        for p in self.probes:
            if "error" in p and t1 <= p["t"] < t2:
                errors[p["error"]] += 1
        late = [p for p in self.probes if "token" in p and p["left"] <= 0 and p["t"] >= t1]
        codes: dict[Any, int] = defaultdict(int)
        for e in self.execs:
            if t1 <= e["t"] < t2 + 1:
                codes[e["rc"]] += 1
        first = min((p["t"] for p in self.probes if "error" in p and p["t"] >= t1), default=None)
        since = "never" if first is None else f"{first - t1:.1f}s"
        return (
            f"first probe error after {since}; probe errors {dict(errors)}; acquires answered "
            f"after their local deadline {len(late)}; tenure exec exit codes {dict(codes)}"
        )

    def check(self) -> Report:
        report = Report()
        v = report.violations
        lines = self.sched_lines()
        begins = [r for r in lines if r["ph"] == "begin"]
        oks = [r for r in lines if r["ph"] == "ok"]
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            # Slots as the jobs' ctx.slot.isoformat() spells them: the app's jobs are in UTC.
            conn.execute(b"SET TimeZone TO 'UTC'")
            ident = sql.Identifier(self.schema)
            rows = conn.execute(
                sql.SQL("SELECT job_key, slot, token, pid FROM {}.ha_evidence ORDER BY id").format(
                    ident
                )
            ).fetchall()
            # Runs whose end the database recorded as a lost lease: for a run that committed
            # and was acknowledged, its end arrived after another claim had taken the job.
            lost_end = {
                (key, token)
                for key, token in conn.execute(
                    sql.SQL(
                        "SELECT job_key, token FROM {}.job_runs WHERE outcome = 'lease_lost'"
                    ).format(ident)
                ).fetchall()
            }
            msgs = conn.execute(
                sql.SQL(
                    "SELECT key, delivered_at IS NOT NULL FROM {}.outbox WHERE topic = %s"
                ).format(ident),
                (TOPIC,),
            ).fetchall()
            result = conn.execute(
                sql.SQL(
                    "SELECT applied_fencing_token FROM {}.report_results WHERE job_key = %s"
                ).format(ident),
                (EXEC_KEY,),
            ).fetchone()

        # token-reissued: a (key, token) told to two executions.
        told: dict[tuple[str, int], set[Any]] = defaultdict(set)
        for r in begins:
            told[(r["job"], r["token"])].add((r["pid"], r["slot"]))
        for i, p in enumerate(self.probes):
            if "token" in p:
                told[(PROBE_KEY, p["token"])].add(i)
        for i, e in enumerate(self.exec_lines()):
            told[(EXEC_KEY, e["token"])].add(i)
        for (key, token), who in sorted(told.items()):
            if len(who) > 1:
                v.append(f"token-reissued: {key} token {token} told to {sorted(who)}")

        # stale-write: evidence tokens per job never go down in commit order. Commits of one
        # job are serialised by fence()'s row lock, so id order is commit order per job.
        last: dict[str, int] = {}
        slots: dict[tuple[str, str], int] = defaultdict(int)
        committed = set()
        for job, slot, token, _pid in rows:
            if token < last.get(job, 0):
                v.append(f"stale-write: {job} token {token} committed after {last[job]}")
            last[job] = max(token, last.get(job, 0))
            slots[(job, slot.isoformat())] += 1
            committed.add(f"{job}@{slot.isoformat()}@{token}")
        # A run whose COMMIT went out and never came back (the connection died) may have
        # committed; its body failed as far as the worker knows, so the slot is retried
        # (docs/safety.md). Such a slot may commit twice: at least once, not a violation.
        phases: dict[tuple[str, str, int], set[str]] = defaultdict(set)
        for r in lines:
            phases[(r["job"], r["slot"], r["token"])].add(r["ph"])
        tokens_of: dict[tuple[str, str], list[int]] = defaultdict(list)
        for job, slot, token, _pid in rows:
            tokens_of[(job, slot.isoformat())].append(token)
        # A run whose end reached the database after its lease expired, when another worker
        # took the job over first, is retried there (docs/safety.md, "A run whose end reached
        # the database late"): at least once, counted apart. Its own worker never reruns it
        # (tests/scheduler/test_late_finish.py): a second run by the same process stays a
        # violation.
        pid_of = {(job, slot.isoformat(), token): pid for job, slot, token, pid in rows}
        late_end: set[tuple[str, str]] = set()
        for (job, slot), n in slots.items():
            if n < 2:
                continue
            ordered = sorted(tokens_of[(job, slot)])
            earlier, last_token = ordered[:-1], ordered[-1]
            if all(phases[(job, slot, t)] >= {"commit", "failed"} for t in earlier):
                report.retried.append(f"{job} slot {slot}: tokens {sorted(tokens_of[(job, slot)])}")
            elif all(
                (job, t) in lost_end
                and "ok" in phases[(job, slot, t)]
                and pid_of[(job, slot, t)] != pid_of[(job, slot, last_token)]
                for t in earlier
            ):
                late_end.add((job, slot))
                report.retried.append(
                    f"{job} slot {slot}: tokens {ordered} (the earlier end arrived late)"
                )
            else:
                tokens = sorted(tokens_of[(job, slot)])
                v.append(f"slot-twice: {job} slot {slot} has {n} committed runs (tokens {tokens})")
        acked: dict[tuple[str, str], int] = defaultdict(int)
        for r in oks:
            acked[(r["job"], r["slot"])] += 1
        for (job, slot), n in acked.items():
            if n > 1 and (job, slot) not in late_end:
                v.append(f"slot-twice: {job} slot {slot} acknowledged {n} times")
        for r in begins:
            if r["left"] < 0:
                v.append(
                    f"late-start: {r['job']} slot {r['slot']} token {r['token']} started "
                    f"{-r['left']:.3f}s after its lease's local deadline"
                )
        exec_tokens = [e["token"] for e in self.exec_lines()]
        stale_ok = [
            e for e in self.execs if e["rc"] == 0 and "stale" in (e.get("err") or "").lower()
        ]
        if stale_ok:
            v.append(f"stale-write: tenure exec exited 0 after a stale result: {stale_ok[0]}")
        if result is not None and exec_tokens and result[0] > max(exec_tokens):
            v.append(f"stale-write: stored exec result token {result[0]} was never issued")

        # outbox: every committed run's message delivered, every delivery a committed run.
        delivered = {d["key"] for d in self.relay_lines()}
        in_outbox = {k for k, _ in msgs}
        for key in sorted(committed - delivered):
            v.append(f"outbox-lost: {key} committed, never delivered")
        for key in sorted(delivered - committed):
            v.append(f"outbox-phantom: {key} delivered, its run is not committed")
        for key in sorted(in_outbox ^ committed):
            v.append(f"outbox-mismatch: {key} in one of outbox and evidence only")

        for r in oks:
            key = f"{r['job']}@{r['slot']}@{r['token']}"
            if key not in committed:
                report.lost_acks.append(f"ack-lost: run {key} was acknowledged, then lost")
        report.counts = {
            "runs begun": len(begins),
            "runs acknowledged": len(oks),
            "runs committed": len(rows),
            "deliveries": len(self.relay_lines()),
            "probe acquires": sum(1 for p in self.probes if "token" in p),
            "exec runs": len(exec_tokens),
            "slots retried after an unknown commit or a late end": len(report.retried),
        }
        return report
