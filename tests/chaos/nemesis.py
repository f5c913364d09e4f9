"""The nemesis: a thread that injects faults into the workers and the server.

Faults (each logged as a JSON line with the database time when the server answers):

* ``pause``: SIGSTOP a worker, SIGCONT it 2-3.5 TTLs later. It prefers a worker whose last
  logged operation is ``work`` (it holds a lease and is about to write), because that is
  the pause that produces a stale holder.
* ``kill``: SIGKILL a worker; the runner starts a new incarnation shortly after.
* ``terminate``: ``pg_terminate_backend`` on the workers' backends (tenure's pool,
  application_name ``tenure``, and their ledger connections, ``tenure-chaos``). On a server
  the run started itself that is every such backend; on a shared server (``--dsn``) only
  the backends whose client port belongs to a worker process (found via /proc), so other
  people's tenure connections are never touched.
* ``restart``: restart the PostgreSQL server (``fast`` or ``immediate`` shutdown, then
  start on the same port). Only ever offered for a server the run started itself.
"""

from __future__ import annotations

import json
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

from tests.support.servers import PgServer

TERMINATE_SQL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE application_name IN ('tenure', 'tenure-chaos') AND pid <> pg_backend_pid()"
)
TERMINATE_PORTS_SQL = TERMINATE_SQL + " AND client_port = ANY(%s)"


def worker_client_ports(pids: list[int]) -> list[int]:
    """Local TCP ports of the sockets the given processes hold (Linux /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports: list[int] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[9] in inodes:
                ports.append(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


class Nemesis(threading.Thread):
    def __init__(
        self,
        *,
        dsn: str,
        workers: Callable[[], dict[int, int]],
        oplog_of: Callable[[int], Path],
        on_kill: Callable[[int], None],
        ttl: float,
        faults: list[str],
        server: PgServer | None,
        log: IO[str],
        seed: int | None,
        interval: tuple[float, float] = (0.4, 1.2),
        restart_every: float = 8.0,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        if "restart" in faults and server is None:
            raise ValueError("the nemesis only restarts a server the run started itself")
        self.dsn = dsn
        self.workers = workers  # worker id -> pid, as the runner knows them now
        self.oplog_of = oplog_of
        self.on_kill = on_kill
        self.ttl = ttl
        self.faults = faults
        self.server = server
        self.log = log
        self.rng = random.Random(seed)
        self.interval = interval
        self.restart_every = restart_every
        self.counts: Counter[str] = Counter()
        self.stopping = threading.Event()
        self._paused: dict[int, float] = {}  # pid -> monotonic time to SIGCONT
        self._lock = threading.Lock()
        # Every kind of fault once, in random order, before choosing at random: even a short
        # run injects each of them.
        self._first_pass = self.rng.sample(list(faults), len(faults))
        self._last_restart = time.monotonic() - restart_every

    # -- bookkeeping ----------------------------------------------------------------------

    def _db_now(self) -> str | None:
        try:
            with psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=2, application_name="chaos-nemesis"
            ) as conn:
                row = conn.execute(b"SELECT clock_timestamp()").fetchone()
        except psycopg.Error:
            return None
        return row[0].isoformat() if row else None

    def _record(self, fault: str, **fields: Any) -> None:
        self.counts[fault] += 1
        line = {"fault": fault, "db_at": self._db_now(), "t": time.time(), **fields}
        self.log.write(json.dumps(line, default=str) + "\n")
        self.log.flush()

    # -- loop -----------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping.wait(self.rng.uniform(*self.interval)):
            self._resume_due()
            fault = self._choose()
            if fault is None:
                continue
            try:
                getattr(self, f"_{fault}")()
            except Exception as exc:  # a fault that failed is logged, the run goes on
                self._record(f"{fault}-failed", err=repr(exc))
        self.resume_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        self.resume_all()

    def _choose(self) -> str | None:
        if self._first_pass:
            return self._first_pass.pop()
        choices = list(self.faults)
        if "restart" in choices and time.monotonic() - self._last_restart < self.restart_every:
            choices.remove("restart")
        weights = {"pause": 5, "kill": 2, "terminate": 2, "restart": 2}
        if not choices:
            return None
        return self.rng.choices(choices, weights=[weights[c] for c in choices])[0]

    def _victim(self, *, prefer_working: bool) -> tuple[int, int] | None:
        with self._lock:
            paused = set(self._paused)
        candidates = [(w, pid) for w, pid in self.workers().items() if pid not in paused]
        if not candidates:
            return None
        if prefer_working and self.rng.random() < 0.8:
            working = [c for c in candidates if self._last_op(c[0]) == "work"]
            if working:
                return self.rng.choice(working)
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
        seconds = self.rng.uniform(2.0, 3.5) * self.ttl
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
        self.on_kill(worker)

    def _terminate(self) -> None:
        with psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=2, application_name="chaos-nemesis"
        ) as conn:
            if self.server is not None:
                row = conn.execute(TERMINATE_SQL.encode()).fetchone()
            else:
                ports = worker_client_ports(list(self.workers().values()))
                row = conn.execute(TERMINATE_PORTS_SQL.encode(), (ports,)).fetchone()
        self._record("terminate", backends=row[0] if row else 0)

    def _restart(self) -> None:
        assert self.server is not None
        mode = self.rng.choice(["fast", "immediate"])
        started = time.monotonic()
        self.server.restart(mode)
        self._last_restart = time.monotonic()
        self._record("restart", mode=mode, down_s=round(self._last_restart - started, 3))
