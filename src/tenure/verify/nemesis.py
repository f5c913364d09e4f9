"""The nemesis: a thread that injects faults into the run's workers.

* ``pause``: SIGSTOP a worker, SIGCONT it 1.5-3 TTLs later. It prefers a worker whose last
  logged operation is ``work`` (it holds a lease and is about to write): the pause that
  makes a stale holder.
* ``kill``: SIGKILL a worker; the runner starts its next incarnation shortly after.
* ``terminate``: ``pg_terminate_backend`` on the backends serving the workers, found by
  their last statement naming the run's own schema (see ``verify_terminate``), so nobody
  else's connections are ever touched. Needs a role that may signal them; without it the
  runner leaves this fault out and says so.
* ``restart``: restart the PostgreSQL server through a callback. ``tenure verify`` never
  offers it (it never restarts a server it did not start); the test suite passes one for a
  throwaway server it started itself.

Pause and kill only ever signal the run's own worker processes.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import psycopg

from ..db.queries import query
from ..db.timeouts import CONNECTION_KWARGS
from .config import RESTART

log = logging.getLogger("tenure.verify.nemesis")

_WEIGHTS = {"pause": 5, "kill": 2, "terminate": 2, RESTART: 2}


class Nemesis(threading.Thread):
    def __init__(
        self,
        *,
        dsn: str,
        schema: str,
        workers: Callable[[], dict[int, int]],
        oplog_of: Callable[[int], Path],
        ttl: float,
        faults: tuple[str, ...],
        log_to: IO[str],
        seed: int,
        restart: Callable[[str], None] | None = None,
        interval: tuple[float, float] = (0.4, 1.2),
        restart_every: float = 8.0,
    ) -> None:
        super().__init__(name="tenure-verify-nemesis", daemon=True)
        if RESTART in faults and restart is None:
            raise ValueError("the restart fault needs a restart callback (a server we started)")
        self.dsn = dsn
        self.schema = schema
        self.workers = workers  # worker number -> pid of its live incarnation
        self.oplog_of = oplog_of
        self.ttl = ttl
        self.faults = faults
        self.restart = restart
        self.log_to = log_to
        self.rng = random.Random(seed)
        self.interval = interval
        self.restart_every = restart_every
        self.counts: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.stopping = threading.Event()
        self._paused: dict[int, float] = {}  # pid -> monotonic time to SIGCONT
        self._lock = threading.Lock()
        # Every kind of fault once, in random order, before choosing at random: even a short
        # run injects each of them.
        self._first_pass = self.rng.sample(list(faults), len(faults))
        self._last_restart = time.monotonic() - restart_every

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.dsn,
            **{**CONNECTION_KWARGS, "connect_timeout": 2, "application_name": "tenure verify"},
        )

    def _db_now(self) -> str | None:
        try:
            with self._connect() as conn:
                row = conn.execute(b"SELECT clock_timestamp()").fetchone()
        except psycopg.Error:
            return None
        return row[0].isoformat() if row else None

    def _record(self, fault: str, **fields: Any) -> None:
        line = {"fault": fault, "db_at": self._db_now(), "t": time.time(), **fields}
        with self._lock:
            self.counts[fault] += 1
            self.log_to.write(json.dumps(line, default=str) + "\n")
            self.log_to.flush()

    # -- loop -----------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping.wait(self.rng.uniform(*self.interval)):
            self._resume_due()
            fault = self._choose()
            if fault is None:
                continue
            try:
                getattr(self, f"_{fault}")()
            except Exception as exc:  # a fault that failed is counted; the run goes on
                self.failed[fault] += 1
                log.warning("fault %s failed: %s", fault, exc)
        self.resume_all()

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(60)
        self.resume_all()

    def _choose(self) -> str | None:
        if self._first_pass:
            return self._first_pass.pop()
        choices = list(self.faults)
        if RESTART in choices and time.monotonic() - self._last_restart < self.restart_every:
            choices.remove(RESTART)
        if not choices:
            return None
        return self.rng.choices(choices, weights=[_WEIGHTS[c] for c in choices])[0]

    def _victim(self, *, prefer_working: bool) -> tuple[int, int] | None:
        """A live, unpaused worker. ``prefer_working``: usually one that holds a lease and is
        about to write (waiting up to half a second for one): the fault that matters."""
        wait_until = time.monotonic() + (0.5 if prefer_working else 0.0)
        want_working = prefer_working and self.rng.random() < 0.8
        while True:
            with self._lock:
                paused = set(self._paused)
            candidates = [(w, pid) for w, pid in self.workers().items() if pid not in paused]
            if not candidates:
                return None
            if not want_working:
                return self.rng.choice(candidates)
            working = [c for c in candidates if self._last_op(c[0]) == "work"]
            if working:
                return self.rng.choice(working)
            if time.monotonic() >= wait_until or self.stopping.wait(0.05):
                return self.rng.choice(candidates)

    def _last_op(self, worker: int) -> str | None:
        try:
            with open(self.oplog_of(worker), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 2048))
                tail = f.read().splitlines()
        except OSError:
            return None
        for raw in reversed(tail):
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            return str(line.get("op")) if line.get("ph") == "b" else None
        return None

    # -- faults ---------------------------------------------------------------------------

    def _pause(self) -> None:
        victim = self._victim(prefer_working=True)
        if victim is None:
            return
        worker, pid = victim
        seconds = self.rng.uniform(1.5, 3.0) * self.ttl
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        with self._lock:
            self._paused[pid] = time.monotonic() + seconds
        self._record("pause", worker=worker, pid=pid, seconds=round(seconds, 3))

    def _resume_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [pid for pid, at in self._paused.items() if at <= now]
            for pid in due:
                del self._paused[pid]
        for pid in due:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue

    def resume_all(self) -> None:
        with self._lock:
            pids, self._paused = list(self._paused), {}
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue

    def _kill(self) -> None:
        victim = self._victim(prefer_working=self.rng.random() < 0.5)
        if victim is None:
            return
        worker, pid = victim
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self._record("kill", worker=worker, pid=pid)

    def _terminate(self) -> None:
        with self._connect() as conn:
            row = conn.execute(
                query(self.schema, "verify_terminate"), {"schema_name": self.schema}
            ).fetchone()
        self._record("terminate", backends=row[0] if row else 0)

    def _restart(self) -> None:
        assert self.restart is not None
        mode = self.rng.choice(["fast", "immediate"])
        started = time.monotonic()
        self.restart(mode)
        self._last_restart = time.monotonic()
        self._record(RESTART, mode=mode, down_s=round(self._last_restart - started, 3))
