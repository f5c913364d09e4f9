"""One workload process of ``tenure verify``: ``python -m tenure.verify.worker SPEC_JSON``.

Two kinds, both loop until the runner stops them (or their parent dies):

* ``lease``: pick a key, ``client.acquire`` it, then for one to three rounds "work" (sleep a
  fraction of the TTL), write a result (``client.results.put``) and a ledger row in the
  application's own transaction fenced with ``tenure.fence``, renew; finally release.
* ``scheduler``: a ``tenure.Scheduler`` with ``every="1s"`` jobs (the scheduler's claim
  path). Each run logs its claim, works, writes a ledger row fenced with ``ctx.fence`` and a
  result with ``ctx.results.put``.

Neither checks its local deadline before writing: a worker the nemesis paused past its TTL
writes anyway, so that only the fence stands between it and a stale commit (the checker
shows that it did). ``unsafe_no_fence`` writes without the fence and with a last-writer-wins
result upsert, to show that the checker catches what the fence prevents.

Every operation is logged (:mod:`tenure.verify.history`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..db.queries import query
from ..db.timeouts import CONNECTION_KWARGS
from ..errors import DatabaseUnavailable, LeaseLost, StaleTokenError, TenureError, one_line
from ..leases._sync.client import Client, connect
from ..leases._sync.fencing import fence
from ..leases._sync.lease import Lease
from ..leases.models import Result
from ..scheduler import JobContext, Scheduler
from ..validation import check_ttl
from .config import WorkerSpec
from .history import Op, OpLog, iso, write_id

log = logging.getLogger("tenure.verify.worker")

#: How a write fences the application's transaction / stores a result (library or scheduler).
Fence = Callable[[psycopg.Connection[Any]], None]
PutResult = Callable[[dict[str, Any]], Result]

#: application_name of the workers' connections (the checker's are "tenure verify ...").
APP_NAME = "tenure-verify-worker"


def short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc))[:240]}"


def tenure_outcome(exc: TenureError) -> str:
    """Outcome of a tenure write that raised."""
    if isinstance(exc, StaleTokenError):
        return "stale"
    if isinstance(exc, DatabaseUnavailable):
        # Conservative: a broken connection during a write is never counted as "not applied".
        return "unknown"
    return "error"


class AppConnection:
    """The application's own connection (not tenure's pool), reconnected when broken."""

    def __init__(self, dsn: str, prepare: bool) -> None:
        self._dsn = dsn
        self._prepare = prepare
        self._conn: psycopg.Connection[Any] | None = None

    def get(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.drop()
            kwargs: dict[str, Any] = {
                **CONNECTION_KWARGS,
                "autocommit": False,
                "application_name": APP_NAME,
            }
            if not self._prepare:
                kwargs["prepare_threshold"] = None
            self._conn = psycopg.connect(self._dsn, **kwargs)
        return self._conn

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def rollback(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            conn.rollback()
        except psycopg.Error:
            self.drop()


class Writes:
    """The two business writes, shared by both kinds: a fenced ledger row on the app's own
    connection and a result (fenced, or last-writer-wins with ``unsafe_no_fence``)."""

    def __init__(self, spec: WorkerSpec, oplog: OpLog) -> None:
        self.spec = spec
        self.log = oplog
        self.schema = spec.schema
        self._local = threading.local()

    def app(self) -> AppConnection:
        conn: AppConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = AppConnection(self.spec.dsn, self.spec.prepare)
        return conn

    def ledger(self, fields: dict[str, Any], fence: Fence) -> None:
        """One ledger row; ``fence(conn)`` fences the transaction (unless unfenced)."""
        rec = self.log.begin("ledger", **fields)
        wid = write_id(rec)
        app = self.app()
        stage = "connect"
        try:
            conn = app.get()
            conn.execute(query(self.schema, "verify_app_timeouts"))
            if self.spec.fenced:
                stage = "fence"
                fence(conn)
            stage = "insert"
            row = conn.execute(
                query(self.schema, "verify_ledger_insert"),
                {"key": fields["key"], "token": fields["token"], "wid": wid},
            ).fetchone()
            stage = "commit"
            conn.commit()
        except StaleTokenError as exc:
            app.rollback()
            self.log.end(rec, "stale", wid=wid, err=short(exc))
            return
        except (psycopg.Error, TenureError) as exc:
            # The server commits nothing it was not sent a COMMIT for: a failure before the
            # commit stage is "error" (not applied); during the commit it is "unknown".
            app.rollback()
            outcome = "unknown" if stage == "commit" else "error"
            self.log.end(rec, outcome, wid=wid, stage=stage, err=short(exc))
            return
        assert row is not None
        self.log.end(rec, "ok", wid=wid, at=iso(row[1]))

    def result(self, fields: dict[str, Any], put: PutResult) -> None:
        """One result write; ``put(payload)`` is the fenced store (unless unfenced)."""
        rec = self.log.begin("result", **fields)
        wid = write_id(rec)
        payload = {"wid": wid, "token": fields["token"]}
        if not self.spec.fenced:
            self._unfenced_result(rec, wid, fields, payload)
            return
        try:
            stored = put(payload)
        except TenureError as exc:
            self.log.end(rec, tenure_outcome(exc), wid=wid, err=short(exc))
            return
        self.log.end(rec, "ok", wid=wid, at=iso(stored.written_at))

    def _unfenced_result(
        self, rec: Op, wid: str, fields: dict[str, Any], payload: dict[str, Any]
    ) -> None:
        app = self.app()
        stage = "connect"
        try:
            conn = app.get()
            stage = "upsert"
            row = conn.execute(
                query(self.schema, "verify_unfenced_result"),
                {"key": fields["key"], "payload": Jsonb(payload), "token": fields["token"]},
            ).fetchone()
            stage = "commit"
            conn.commit()
        except psycopg.Error as exc:
            app.rollback()
            self.log.end(rec, "unknown" if stage == "commit" else "error", wid=wid, err=short(exc))
            return
        assert row is not None
        self.log.end(rec, "ok", wid=wid, at=iso(row[1]))


class LeaseWorker:
    """The library workload: acquire, work, result, fenced ledger row, renew, release."""

    def __init__(self, spec: WorkerSpec, oplog: OpLog) -> None:
        self.spec = spec
        self.log = oplog
        self.rng = random.Random(spec.seed)
        self.keys = [f"k{i}" for i in range(spec.keys)]
        self.writes = Writes(spec, oplog)
        self.client: Client | None = None

    def connect(self) -> Client:
        delay = 0.2
        while True:
            rec = self.log.begin("connect")
            try:
                client = connect(
                    self.spec.dsn,
                    schema=self.spec.schema,
                    pool_size=2,
                    application_name=APP_NAME,
                    prepare_threshold=5 if self.spec.prepare else None,
                )
            except TenureError as exc:  # a terminated or restarting server: retry
                self.log.end(rec, "error", err=short(exc))
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self.log.end(rec, "ok")
            return client

    def run(self, alive: threading.Event) -> None:
        self.client = self.connect()
        while alive.is_set():
            key = self.rng.choice(self.keys)
            lease = self.acquire(key)
            if lease is None:
                time.sleep(self.rng.uniform(0.02, 0.1))
                continue
            for _ in range(self.rng.randint(1, 3)):
                rec = self.log.begin("work", key=key, token=lease.token)
                time.sleep(self.rng.uniform(0.15, 0.5) * self.spec.ttl)
                self.log.end(rec, "ok")
                self.writes.result(
                    self._lease_fields(lease), functools.partial(self._put_result, lease)
                )
                self.writes.ledger(self._lease_fields(lease), functools.partial(self._fence, lease))
                if not self.renew(lease):
                    break
            self.release(lease)
            time.sleep(self.rng.uniform(0, 0.05))

    def _put_result(self, lease: Lease, payload: dict[str, Any]) -> Result:
        assert self.client is not None
        return self.client.results.put(lease.job_key, payload, token=lease.token)

    def _fence(self, lease: Lease, conn: psycopg.Connection[Any]) -> None:
        fence(conn, lease.job_key, lease.token, schema=self.spec.schema)

    def acquire(self, key: str) -> Lease | None:
        assert self.client is not None
        rec = self.log.begin("acquire", key=key)
        try:
            lease = self.client.acquire(key, ttl=self.spec.ttl)
        except TenureError as exc:
            # acquire sends its write with wrote=True: a broken connection is outcome_unknown.
            self.log.end(rec, tenure_outcome(exc), err=short(exc))
            time.sleep(0.1)
            return None
        if lease is None:
            self.log.end(rec, "busy")
            return None
        self.log.end(
            rec,
            "ok",
            token=lease.token,
            owner=str(lease.owner),
            at=iso(lease.acquired_at),
            until=iso(lease.expires_at),
            deadline_in=round(lease.deadline_in, 6),
        )
        return lease

    def _lease_fields(self, lease: Lease) -> dict[str, Any]:
        # late: the holder's own local deadline has passed; it writes anyway (module doc).
        return {
            "key": lease.job_key,
            "token": lease.token,
            "owner": str(lease.owner),
            "late": lease.deadline_in < 0,
        }

    def renew(self, lease: Lease) -> bool:
        """Renew once; False when the lease is lost (by the database or the local deadline)."""
        rec = self.log.begin("renew", key=lease.job_key, token=lease.token, owner=str(lease.owner))
        if lease.lost:
            self.log.end(rec, "skipped", reason=lease.lost_reason)
            return False
        try:
            until = lease.renew()
        except LeaseLost as exc:
            self.log.end(rec, "lost", reason=exc.reason)
            return False
        except TenureError as exc:
            # A renewal's unknown outcome only ever extends this same holder's lease.
            self.log.end(rec, tenure_outcome(exc), err=short(exc))
            return True
        self.log.end(rec, "ok", until=iso(until))
        return True

    def release(self, lease: Lease) -> None:
        assert self.client is not None
        rec = self.log.begin(
            "release", key=lease.job_key, token=lease.token, owner=str(lease.owner)
        )
        try:
            # The core release statement (it also wakes waiters), called directly because it
            # returns the database time at which the lease ended, which the checker needs.
            rows = self.client.fetch(
                "release",
                {
                    "job_key": lease.job_key,
                    "owner": lease.owner,
                    "token": lease.token,
                    "channel": self.client.lease_channel,
                },
                doing=f"releasing {lease.job_key!r}",
                wrote=True,
            )
        except TenureError as exc:
            self.log.end(rec, tenure_outcome(exc), err=short(exc))
            return
        lease.mark_released()
        if rows:
            self.log.end(rec, "ok", at=iso(rows[0][1]))
        else:
            self.log.end(rec, "none")  # already expired or taken over


class SchedulerWorker:
    """The scheduler's claim path: ``every="1s"`` jobs on keys ``s0``, ``s1``, ..."""

    def __init__(self, spec: WorkerSpec, oplog: OpLog) -> None:
        self.spec = spec
        self.log = oplog
        self.rng = random.Random(spec.seed)
        self._rng_lock = threading.Lock()
        self.writes = Writes(spec, oplog)

    def job(self, ctx: JobContext) -> None:
        lease = ctx.lease
        self.log.end(
            self.log.begin("claim", key=ctx.job_key),
            "ok",
            token=ctx.token,
            owner=str(lease.owner),
            at=iso(lease.acquired_at),
            until=iso(lease.expires_at),
            kind=ctx.kind,
        )
        with self._rng_lock:
            pause = self.rng.uniform(0.15, 0.5) * self.spec.ttl
        rec = self.log.begin("work", key=ctx.job_key, token=ctx.token)
        time.sleep(pause)
        self.log.end(rec, "ok")

        def fields() -> dict[str, Any]:
            return {
                "key": ctx.job_key,
                "token": ctx.token,
                "owner": str(lease.owner),
                "late": lease.deadline_in < 0,
            }

        self.writes.result(fields(), ctx.results.put)
        self.writes.ledger(fields(), ctx.fence)

    def run(self, alive: threading.Event) -> None:
        app = Scheduler(self.spec.dsn, schema=self.spec.schema, concurrency=max(1, self.spec.keys))
        for i in range(self.spec.keys):
            app.add_job(f"s{i}", self.job, every="1s", ttl=check_ttl(self.spec.ttl))
        while alive.is_set():
            rec = self.log.begin("connect")
            try:
                app.run()
            except TenureError as exc:  # the server went away at start-up: again
                self.log.end(rec, "error", err=short(exc))
                time.sleep(0.5)
                continue
            self.log.end(rec, "ok")
            return


def _watch_parent(alive: threading.Event) -> None:
    """Exit when the runner is gone (SIGKILLed, say): never loop on as an orphan."""
    parent = os.getppid()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            alive.clear()
            os._exit(3)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = WorkerSpec.from_json(args[0])
    if not spec.prepare:
        # The scheduler's pool reads it (behind a transaction-mode pooler).
        os.environ["TENURE_PREPARE_THRESHOLD"] = "none"
    # tenure's and psycopg_pool's own logs (renewal failures, reconnects) go to a file.
    logging.basicConfig(
        filename=spec.logfile,
        level=logging.WARNING,
        format=f"%(asctime)s w{spec.worker}.{spec.incarnation} %(name)s %(levelname)s %(message)s",
    )
    alive = threading.Event()
    alive.set()
    threading.Thread(target=_watch_parent, args=(alive,), daemon=True).start()
    with open(spec.oplog, "a", encoding="utf-8") as stream:
        oplog = OpLog(stream, spec.worker, spec.incarnation)
        if spec.kind == "scheduler":
            SchedulerWorker(spec, oplog).run(alive)
        else:
            LeaseWorker(spec, oplog).run(alive)


if __name__ == "__main__":
    main()
