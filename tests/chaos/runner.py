"""Run workers under a nemesis for a fixed time, then check the history (see __init__)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

import tenure
from tests.support.servers import PgServer

from . import checker, tables
from .nemesis import Nemesis

ROOT = Path(__file__).resolve().parents[2]
ALL_FAULTS = ("pause", "kill", "terminate", "restart")
RESTART_DELAY = 0.3  # seconds between a worker's death and its next incarnation
QUIESCE_TIMEOUT = 15.0


@dataclass(frozen=True)
class Config:
    seconds: float = 60.0
    workers: int = 6
    keys: int = 3
    ttl: float = 1.0
    fenced: bool = True
    faults: tuple[str, ...] = ALL_FAULTS
    dsn: str | None = None  # None: start a throwaway server (the only kind we restart)
    seed: int | None = None
    out: Path | None = None


@dataclass
class Summary:
    config: dict[str, Any]
    out: str
    seconds: float
    ops: dict[str, dict[str, int]]
    faults: dict[str, int]
    violations: dict[str, int]
    examples: list[str]
    checked: dict[str, int]
    stale_rejections: dict[str, int]
    late_writes: dict[str, int]
    worker_exits: dict[str, int]
    crashes: list[str]
    reconnect_logs: int
    notes: list[str] = field(default_factory=list)

    @property
    def total_violations(self) -> int:
        return sum(self.violations.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    def text(self) -> str:
        lines = [
            f"chaos run: {self.config['workers']} workers, {self.config['keys']} keys, "
            f"ttl {self.config['ttl']}s, {self.seconds:.0f}s, "
            f"{'fenced' if self.config['fenced'] else 'NO FENCE'}; logs in {self.out}",
            "operations (by kind: outcome=count):",
        ]
        for op, outcomes in self.ops.items():
            parts = ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))
            lines.append(f"  {op:8} {parts}")
        lines.append(
            "faults injected: "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none")
        )
        lines.append(
            "stale writes refused: "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.stale_rejections.items()))
            + "; writes attempted after the writer's local deadline: "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.late_writes.items()))
        )
        lines.append(f"worker exits: {self.worker_exits}; crashes: {len(self.crashes)}")
        lines.append(f"pool/renewal reconnect log lines: {self.reconnect_logs}")
        lines.append(f"checked: {self.checked}")
        lines += [f"note: {n}" for n in self.notes]
        if self.violations:
            lines.append(
                f"VIOLATIONS: {self.total_violations} "
                + ", ".join(f"{k}={v}" for k, v in sorted(self.violations.items()))
            )
            lines += [f"  {e}" for e in self.examples]
        else:
            lines.append("violations: 0")
        return "\n".join(lines)


class _Workers:
    """The worker processes; a dead worker is replaced by a new incarnation."""

    def __init__(self, cfg: Config, dsn: str, schema: str, out: Path, seed: int) -> None:
        self.cfg = cfg
        self.dsn = dsn
        self.schema = schema
        self.out = out
        self.seed = seed
        self._lock = threading.Lock()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.incarnation: dict[int, int] = {}
        self.dead_since: dict[int, float] = {}
        self.exits: Counter[str] = Counter()
        self.crashes: list[str] = []
        self._stderr: dict[int, IO[bytes]] = {}

    def oplog(self, worker: int) -> Path:
        return self.out / f"ops-w{worker}.jsonl"

    def start(self, worker: int) -> None:
        inc = self.incarnation.get(worker, -1) + 1
        self.incarnation[worker] = inc
        err = self._stderr.get(worker)
        if err is None:
            err = self._stderr[worker] = open(self.out / f"w{worker}.stderr", "ab")  # noqa: SIM115
        cmd = [
            sys.executable,
            "-m",
            "tests.chaos.worker",
            "--dsn",
            self.dsn,
            "--schema",
            self.schema,
            "--worker",
            str(worker),
            "--incarnation",
            str(inc),
            "--keys",
            str(self.cfg.keys),
            "--ttl",
            str(self.cfg.ttl),
            "--seed",
            str(self.seed * 100_000 + worker * 1000 + inc),
            "--oplog",
            str(self.oplog(worker)),
            "--logfile",
            str(self.out / f"w{worker}.log"),
        ]
        if not self.cfg.fenced:
            cmd.append("--no-fence")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for var in ("TENURE_DSN", "TENURE_SCHEMA", "DATABASE_URL"):
            env.pop(var, None)
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
        )
        with self._lock:
            self.procs[worker] = proc
            self.dead_since.pop(worker, None)

    def alive(self) -> dict[int, int]:
        with self._lock:
            return {w: p.pid for w, p in self.procs.items() if p.poll() is None}

    def reap_and_restart(self) -> None:
        now = time.monotonic()
        for worker, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            if worker not in self.dead_since:
                self.dead_since[worker] = now
                self.exits["SIGKILL" if code == -signal.SIGKILL else f"exit {code}"] += 1
                if code != -signal.SIGKILL:
                    self.crashes.append(f"w{worker}.{self.incarnation[worker]} exited with {code}")
            elif now - self.dead_since[worker] >= RESTART_DELAY:
                self.start(worker)

    def stop_all(self) -> None:
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for stream in self._stderr.values():
            stream.close()


def _quiesce(dsn: str, own_server: bool) -> None:
    """Wait until the killed workers' backends are gone, so that no commit lands after the
    snapshot. On a shared server other people's tenure backends would never go away."""
    if not own_server:
        time.sleep(2.0)
        return
    deadline = time.monotonic() + QUIESCE_TIMEOUT
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(
                dsn, autocommit=True, connect_timeout=5, application_name="chaos-runner"
            ) as conn,
        ):
            row = conn.execute(
                b"SELECT count(*) FROM pg_stat_activity "
                b"WHERE application_name IN ('tenure', 'tenure-chaos')"
            ).fetchone()
            if row is not None and row[0] == 0:
                return
        time.sleep(0.2)


def _count_reconnect_logs(out: Path) -> int:
    count = 0
    for path in out.glob("w*.log"):
        with open(path, encoding="utf-8", errors="replace") as f:
            count += sum(
                1
                for line in f
                if "discarding" in line or "error connecting" in line or "renewing lease" in line
            )
    return count


def run(cfg: Config) -> Summary:
    faults = list(cfg.faults)
    unknown = set(faults) - set(ALL_FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; choose from {ALL_FAULTS}")
    out = cfg.out or Path(tempfile.mkdtemp(prefix="tenure-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    seed = cfg.seed if cfg.seed is not None else random.randrange(1_000_000)
    notes: list[str] = [f"seed {seed}"]
    server: PgServer | None = None
    if cfg.dsn is None:
        server = PgServer(settings={"track_commit_timestamp": "on"}, name="chaos")
        server.start()
        dsn = server.dsn
    else:
        dsn = cfg.dsn
        if "restart" in faults:
            faults.remove("restart")
            notes.append("no server restarts: the server was not started by this run")
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    workers: _Workers | None = None
    nemesis: Nemesis | None = None
    started = time.monotonic()
    try:
        with (
            tenure.connect(dsn, schema=schema, migrate=True) as client,
            client._pool.connection() as conn,
        ):
            tables.setup(conn, schema)
        workers = _Workers(cfg, dsn, schema, out, seed)
        for w in range(cfg.workers):
            workers.start(w)
        with open(out / "nemesis.jsonl", "a", encoding="utf-8") as nemesis_log:
            nemesis = Nemesis(
                dsn=dsn,
                workers=workers.alive,
                oplog_of=workers.oplog,
                on_kill=lambda w: None,  # the reaper below notices and restarts it
                ttl=cfg.ttl,
                faults=faults,
                server=server,
                log=nemesis_log,
                seed=seed,
            )
            nemesis.start()
            deadline = started + cfg.seconds
            try:
                while time.monotonic() < deadline:
                    workers.reap_and_restart()
                    time.sleep(0.1)
            finally:
                nemesis.stop()
        workers.stop_all()
        if server is not None and not server.running:
            server.start()  # the nemesis was stopped mid-restart
        _quiesce(dsn, server is not None)
        with psycopg.connect(dsn, autocommit=True, application_name="chaos-runner") as conn:
            snap = tables.snapshot(conn, schema)
        (out / "snapshot.json").write_text(json.dumps(snap, indent=1))
        ops = checker.read_ops(workers.oplog(w) for w in range(cfg.workers))
        report = checker.check(ops, snap)
    finally:
        if nemesis is not None:
            nemesis.resume_all()
        if workers is not None:
            workers.stop_all()
        if server is not None:
            server.close()
        elif cfg.dsn is not None:
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(cfg.dsn, autocommit=True) as conn,
            ):
                conn.execute(
                    psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        psycopg.sql.Identifier(schema)
                    )
                )
    stale = Counter(
        o["op"] for o in ops if o["op"] in ("result", "ledger") and o["outcome"] == "stale"
    )
    late = Counter(
        f"{o['op']}:{o['outcome']}"
        for o in ops
        if o["op"] in ("result", "ledger") and o.get("late")
    )
    return Summary(
        config={**asdict(cfg), "out": str(out), "faults": faults, "seed": seed},
        out=str(out),
        seconds=time.monotonic() - started,
        ops=report.ops,
        faults=dict(nemesis.counts) if nemesis is not None else {},
        violations=report.by_kind(),
        examples=[f"[{v.kind}] {v.key}: {v.detail}" for v in report.violations[:20]],
        checked=report.checked,
        stale_rejections=dict(stale),
        late_writes=dict(late),
        worker_exits=dict(workers.exits),
        crashes=workers.crashes,
        reconnect_logs=_count_reconnect_logs(out),
        notes=notes + report.notes,
    )
