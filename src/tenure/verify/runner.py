"""Run the workload under the nemesis for a while, then check what it left.

:func:`run` is the whole of ``tenure verify``: it creates a throwaway schema (tenure's
tables plus evidence tables), starts the worker processes (through the pooler when one is
given), injects faults, reports progress, stops everything (at the deadline, or early when
``stop`` is set, e.g. by Ctrl-C), waits for the workers' backends to go quiet, reads the
tables directly, checks the invariants and drops the schema (unless ``keep``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg

from ..db.dsn import describe, resolve
from ..db.queries import query
from ..db.timeouts import CONNECTION_KWARGS
from ..errors import ConfigurationError, TenureError, mapped
from ..leases._sync.client import connect
from . import checker, tables
from .config import SCHEDULER_EVERY, VerifyConfig, WorkerSpec, worker_kind
from .history import Tally, read_faults, read_ops
from .nemesis import Nemesis
from .report import VerifyResult

log = logging.getLogger("tenure.verify")

RESTART_DELAY = 0.3  # seconds between a worker's death and its next incarnation
QUIESCE_TIMEOUT = 15.0
#: How long the workers may take to start and take their first lease.
WARM_UP_TIMEOUT = 30.0
PROGRESS_EVERY = 2.0
#: After the faults stop, the workers run this many TTLs more before they are stopped.
DRAIN_TTLS = 1.5


class VerifyError(TenureError):
    """The run could not produce a verdict (no progress, a workload that crashed, ...)."""


@dataclass(frozen=True)
class Progress:
    elapsed: float
    duration: float
    ops: int
    faults: int
    takeovers: int
    stale_refused: int


def _direct(dsn: str, purpose: str) -> psycopg.Connection[Any]:
    with mapped(f"connecting for {purpose}"):
        return psycopg.connect(
            dsn, **{**CONNECTION_KWARGS, "application_name": f"tenure verify ({purpose})"}
        )


class _Workers:
    """The worker processes; a dead worker is replaced by its next incarnation."""

    def __init__(self, cfg: VerifyConfig, dsn: str, schema: str, out: Path, seed: int) -> None:
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
        # The worker runs `python -m tenure.verify.worker` from wherever this tenure is.
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        self.env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""))

    def oplog(self, worker: int) -> Path:
        return self.out / f"ops-w{worker}.jsonl"

    def oplogs(self) -> list[Path]:
        return [self.oplog(w) for w in range(self.cfg.workers)]

    def start(self, worker: int) -> None:
        inc = self.incarnation.get(worker, -1) + 1
        self.incarnation[worker] = inc
        err = self._stderr.get(worker)
        if err is None:
            err = self._stderr[worker] = open(self.out / f"w{worker}.stderr", "ab")  # noqa: SIM115
        spec = WorkerSpec(
            dsn=self.dsn,
            schema=self.schema,
            kind=worker_kind(worker),
            worker=worker,
            incarnation=inc,
            keys=self.cfg.keys,
            ttl=self.cfg.ttl,
            seed=self.seed * 100_000 + worker * 1000 + inc,
            fenced=self.cfg.fenced,
            oplog=str(self.oplog(worker)),
            logfile=str(self.out / f"w{worker}.log"),
            prepare=self.cfg.through is None,
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "tenure.verify.worker", spec.to_json()],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            # Its own session: a Ctrl-C at the terminal reaches the runner only, which stops
            # the workers itself (and a worker exits when the runner is gone).
            start_new_session=True,
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
                    self.crashes.append(
                        f"w{worker}.{self.incarnation[worker]} exited with {code} "
                        f"(see {self.out / f'w{worker}.stderr'})"
                    )
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
        self._stderr.clear()


def _check_can_signal(conn: psycopg.Connection[Any], schema: str) -> tuple[bool, str]:
    row = conn.execute(query(schema, "verify_can_signal")).fetchone()
    if row is not None and row[0]:
        return True, ""
    role = row[1] if row is not None else "?"
    return False, (
        f"role {role!r} may not terminate other roles' backends (it is neither superuser nor "
        f"a member of pg_signal_backend; `GRANT pg_signal_backend TO {role}` enables it)"
    )


def _wait_for_workload(
    conn: psycopg.Connection[Any],
    schema: str,
    workers: _Workers,
    stop: threading.Event,
    where: str,
    out: Path,
) -> None:
    """Wait for the first committed takeover: faults before it would hit nothing, and a
    workload that never gets there (a pooler that refuses it, a crashing worker) is an
    error, said at once instead of after the whole duration."""
    deadline = time.monotonic() + WARM_UP_TIMEOUT
    while not stop.is_set():
        workers.reap_and_restart()
        row = conn.execute(query(schema, "verify_progress")).fetchone()
        if row is not None and row[0] > 0:
            return
        if time.monotonic() > deadline:
            crash = f"; {workers.crashes[0]}" if workers.crashes else ""
            raise VerifyError(
                f"the workload made no progress on {where} in {WARM_UP_TIMEOUT:.0f}s (no lease "
                f"was taken); worker logs are in {out}{crash}"
            )
        stop.wait(0.1)


def _check_through(through: str, schema: str) -> None:
    """The pooler must lead to the same database: the run's new schema must be there."""
    with _direct(through, "pooler check") as conn:
        row = conn.execute(
            b"SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    if row != (1,):
        raise ConfigurationError(
            f"--through {describe(through)} does not lead to the database of --dsn: the "
            f"run's schema {schema} is not there; point the pooler at the same database"
        )


def _quiesce(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Wait until no backend is still working for the run's workers (a killed worker's
    in-flight transaction), so that no commit lands after the snapshot."""
    deadline = time.monotonic() + QUIESCE_TIMEOUT
    while time.monotonic() < deadline:
        row = conn.execute(
            query(schema, "verify_busy_backends"), {"schema_name": schema}
        ).fetchone()
        if row is not None and row[0] == 0:
            return True
        time.sleep(0.2)
    return False


def run(
    cfg: VerifyConfig,
    *,
    stop: threading.Event | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> VerifyResult:
    """Run one verification (see the module doc). Raises :class:`TenureError` subclasses
    for problems that prevent a verdict; violations are in the result, never raised."""
    cfg.validate()
    stop = stop if stop is not None else threading.Event()
    dsn, _ = resolve(cfg.dsn)
    workers_dsn = cfg.through or dsn
    where = describe(dsn)
    seed = cfg.seed if cfg.seed is not None else random.randrange(1_000_000)
    schema = tables.new_schema_name()
    faults = list(cfg.faults)
    skipped: dict[str, str] = {}
    notes: list[str] = []
    checker_conn = _direct(dsn, "checker")
    own_out = cfg.out is None
    out = cfg.out or Path(tempfile.mkdtemp(prefix="tenure-verify-"))
    out.mkdir(parents=True, exist_ok=True)
    workers: _Workers | None = None
    nemesis: Nemesis | None = None
    created = False
    interrupted = False
    try:
        if "terminate" in faults:
            can, why = _check_can_signal(checker_conn, schema)
            if not can:
                faults.remove("terminate")
                skipped["terminate"] = why
                log.warning("terminate fault skipped: %s", why, extra={"outcome": "skipped"})
        if cfg.workers < SCHEDULER_EVERY:
            notes.append(
                f"the scheduler's claim path runs on every {SCHEDULER_EVERY}rd worker: "
                f"--workers {cfg.workers} leaves it out"
            )
        log.info(
            "creating schema %s on %s; %d workers%s, %gs, faults %s, seed %d",
            schema,
            where,
            cfg.workers,
            f" through {describe(cfg.through)}" if cfg.through else "",
            cfg.duration,
            ",".join(faults) or "none",
            seed,
        )
        created = True
        with (
            connect(dsn, schema=schema, migrate=True, pool_size=1) as client,
            client.connection() as conn,
        ):
            tables.setup(conn, schema)
        if cfg.through is not None:
            _check_through(cfg.through, schema)
        workers = _Workers(cfg, workers_dsn, schema, out, seed)
        for w in range(cfg.workers):
            workers.start(w)
        _wait_for_workload(checker_conn, schema, workers, stop, where, out)
        # The duration counts from here: the workload is running, so every fault hits it.
        started = time.monotonic()
        tally = Tally()
        with open(out / "nemesis.jsonl", "a", encoding="utf-8") as nemesis_log:
            nemesis = Nemesis(
                dsn=dsn,
                schema=schema,
                workers=workers.alive,
                oplog_of=workers.oplog,
                ttl=cfg.ttl,
                faults=tuple(faults),
                log_to=nemesis_log,
                seed=seed,
                restart=cfg.restart,
            )
            nemesis.start()
            deadline = started + cfg.duration
            next_progress = started + PROGRESS_EVERY
            try:
                while time.monotonic() < deadline and not stop.is_set():
                    workers.reap_and_restart()
                    now = time.monotonic()
                    if on_progress is not None and now >= next_progress:
                        next_progress = now + PROGRESS_EVERY
                        on_progress(
                            _progress(checker_conn, schema, tally, workers, nemesis, started, cfg)
                        )
                    stop.wait(0.1)
            except KeyboardInterrupt:
                stop.set()
            finally:
                interrupted = stop.is_set()
                elapsed = time.monotonic() - started
                nemesis.stop()  # resumes the paused workers
        if not interrupted:
            # Let the workers that were paused late in the run make their (stale) writes:
            # a pause whose aftermath is cut off tests nothing.
            time.sleep(DRAIN_TTLS * cfg.ttl)
        workers.stop_all()
        log.info(
            "workers stopped after %.1fs%s; checking",
            time.monotonic() - started,
            " (interrupted)" if interrupted else "",
        )
        # A fresh connection: a restart fault may have ended the old one unnoticed.
        checker_conn.close()
        checker_conn = _direct(dsn, "checker")
        if not _quiesce(checker_conn, schema):
            notes.append(
                f"backends of the workers were still busy after {QUIESCE_TIMEOUT:.0f}s; "
                "a late commit could be missing from the check"
            )
        with mapped("reading the run's tables"):
            snap = tables.snapshot(checker_conn, schema)
        ops = read_ops(workers.oplogs())
        faults_log = read_faults(out / "nemesis.jsonl")
        result = checker.check(ops, snap)
        shortest = checker.shortest_excerpt(result.violations, ops, faults_log, snap)
        return VerifyResult.build(
            cfg=cfg,
            where=where,
            through=describe(cfg.through) if cfg.through else None,
            schema=schema,
            seed=seed,
            elapsed=elapsed,
            interrupted=interrupted,
            check=result,
            ops=ops,
            faults_log=faults_log,
            faults=dict(nemesis.counts),
            faults_failed=dict(nemesis.failed),
            faults_skipped=skipped,
            shortest=shortest,
            snapshot=snap,
            crashes=list(workers.crashes),
            worker_exits=dict(workers.exits),
            notes=notes,
            logs=None if own_out and not cfg.keep else str(out),
        )
    except VerifyError:
        own_out = False  # the message points at the worker logs: keep them
        raise
    finally:
        if nemesis is not None:
            nemesis.resume_all()
        if workers is not None:
            workers.stop_all()
        _cleanup(dsn, schema, created and not cfg.keep, checker_conn)
        if own_out and not cfg.keep:
            shutil.rmtree(out, ignore_errors=True)


def _progress(
    conn: psycopg.Connection[Any],
    schema: str,
    tally: Tally,
    workers: _Workers,
    nemesis: Nemesis,
    started: float,
    cfg: VerifyConfig,
) -> Progress:
    tally.update(workers.oplogs())
    takeovers = -1
    with contextlib.suppress(psycopg.Error):
        row = conn.execute(query(schema, "verify_progress")).fetchone()
        takeovers = int(row[0]) if row is not None else -1
    return Progress(
        elapsed=time.monotonic() - started,
        duration=cfg.duration,
        ops=tally.ops,
        faults=sum(nemesis.counts.values()),
        takeovers=takeovers,
        stale_refused=tally.stale,
    )


def _cleanup(dsn: str, schema: str, drop: bool, conn: psycopg.Connection[Any]) -> None:
    try:
        if drop:
            if conn.broken or conn.closed:
                conn = _direct(dsn, "clean-up")
            # Workers were killed: their sessions' locks go with them, but a server may take
            # a moment to notice; DROP waits for them (bounded by the statement timeout).
            for attempt in range(5):
                try:
                    tables.drop(conn, schema)
                    log.info("schema %s dropped", schema)
                    break
                except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                    time.sleep(0.5)
                except psycopg.OperationalError:
                    if attempt == 4:
                        raise
                    conn.close()
                    conn = _direct(dsn, "clean-up")
                    time.sleep(0.5)
    except (psycopg.Error, ConfigurationError) as exc:
        log.error("could not drop schema %s: %s (drop it by hand)", schema, exc)
    finally:
        conn.close()
