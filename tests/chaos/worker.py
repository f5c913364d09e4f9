"""One chaos worker process: ``python -m tests.chaos.worker --dsn ... --schema ... --worker N``.

It loops until killed: pick a key, acquire its lease (``tenure.Client.acquire``), then for
one to three rounds "work" (sleep a fraction of the TTL), write a result
(``client.results.put``) and a ledger row in a fenced transaction (``tenure.fence`` +
INSERT), renew; finally release. It deliberately never checks its local deadline before
writing: a worker the nemesis paused past its TTL writes anyway, so that only the fence
stands between it and a stale commit (the checker proves that it did).

Every operation is two JSON lines in the op log (``ph`` ``b`` then ``e``) sharing
``(w, inc, n)``. Outcomes: ``ok``, ``busy``, ``stale``, ``lost``, ``skipped``, ``error``
(definitely not applied: refused, rolled back, or failed before COMMIT was sent), ``unknown``
(may have committed: the connection died while the write or its COMMIT was in flight).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import random
import time
from typing import IO, Any

import psycopg
from psycopg.types.json import Jsonb

import tenure
from tenure.db.queries import compose

from . import tables

# The ledger connection: the application's own, with tenure's timeouts (a statement never
# waits long; a paused holder's open transaction is ended by the fence's idle timeout).
LEDGER_KWARGS: dict[str, Any] = {
    "application_name": "tenure-chaos",
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "options": "-c statement_timeout=5s -c lock_timeout=2s",
}


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"


class OpLog:
    """Append-only JSON lines, flushed per line (a SIGKILL loses at most the line in flight)."""

    def __init__(self, stream: IO[str], worker: int, incarnation: int) -> None:
        self._stream = stream
        self._worker = worker
        self._inc = incarnation
        self._n = 0

    def begin(self, op: str, **fields: Any) -> dict[str, Any]:
        self._n += 1
        rec = {"w": self._worker, "inc": self._inc, "n": self._n, "op": op, **fields}
        self._write({**rec, "ph": "b", "t": time.time()})
        return rec

    def end(self, rec: dict[str, Any], outcome: str, **fields: Any) -> None:
        self._write({**rec, **fields, "ph": "e", "outcome": outcome, "t": time.time()})

    def _write(self, line: dict[str, Any]) -> None:
        self._stream.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._stream.flush()


def tenure_outcome(exc: tenure.TenureError) -> str:
    """Outcome of a tenure write that raised."""
    if isinstance(exc, tenure.StaleTokenError):
        return "stale"
    if isinstance(exc, tenure.DatabaseUnavailable):
        # Conservative: a broken connection during a write is never counted as "not applied".
        return "unknown"
    return "error"


class Ledger:
    """The application's own connection (not tenure's pool), reconnected when broken."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def get(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.drop()
            self._conn = psycopg.connect(self._dsn, autocommit=False, **LEDGER_KWARGS)
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


class Worker:
    def __init__(self, args: argparse.Namespace, log: OpLog) -> None:
        self.args = args
        self.log = log
        self.rng = random.Random(args.seed)
        self.keys = [f"k{i}" for i in range(args.keys)]
        self.ttl: float = args.ttl
        self.fenced: bool = not args.no_fence
        self.schema: str = args.schema
        self.ledger = Ledger(args.dsn)
        self.client: tenure.Client | None = None
        self.ledger_sql = compose(tables.LEDGER_INSERT, self.schema)
        self.result_sql = compose(tables.UNFENCED_RESULT, self.schema)

    # -- setup --------------------------------------------------------------------------------

    def connect(self) -> tenure.Client:
        delay = 0.2
        while True:
            rec = self.log.begin("connect")
            try:
                client = tenure.connect(self.args.dsn, schema=self.schema, pool_size=2)
            except Exception as exc:  # the server may be restarting: retry with backoff
                self.log.end(rec, "error", err=short(exc))
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self.log.end(rec, "ok")
            return client

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        self.client = self.connect()
        while True:
            key = self.rng.choice(self.keys)
            lease = self.acquire(key)
            if lease is None:
                time.sleep(self.rng.uniform(0.02, 0.1))
                continue
            for _ in range(self.rng.randint(1, 3)):
                rec = self.log.begin("work", key=key, token=lease.token)
                time.sleep(self.rng.uniform(0.15, 0.5) * self.ttl)
                self.log.end(rec, "ok")
                self.write_result(lease)
                self.write_ledger(lease)
                if not self.renew(lease):
                    break
            self.release(lease)
            time.sleep(self.rng.uniform(0, 0.05))

    def acquire(self, key: str) -> tenure.Lease | None:
        assert self.client is not None
        rec = self.log.begin("acquire", key=key)
        try:
            lease = self.client.acquire(key, ttl=self.ttl)
        except tenure.TenureError as exc:
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
        )
        return lease

    def _lease_fields(self, lease: tenure.Lease) -> dict[str, Any]:
        # late: the holder's own local deadline has passed; it writes anyway (see module doc).
        return {
            "key": lease.job_key,
            "token": lease.token,
            "owner": str(lease.owner),
            "late": lease.deadline_in < 0,
        }

    def write_result(self, lease: tenure.Lease) -> None:
        assert self.client is not None
        rec = self.log.begin("result", **self._lease_fields(lease))
        wid = f"r{rec['w']}.{rec['inc']}.{rec['n']}"
        payload = {"wid": wid, "token": lease.token}
        if not self.fenced:
            self._unfenced_result(rec, wid, lease, payload)
            return
        try:
            stored = self.client.results.put(lease.job_key, payload, token=lease.token)
        except tenure.TenureError as exc:
            self.log.end(rec, tenure_outcome(exc), wid=wid, err=short(exc))
            return
        self.log.end(rec, "ok", wid=wid, at=iso(stored.written_at))

    def _unfenced_result(
        self, rec: dict[str, Any], wid: str, lease: tenure.Lease, payload: dict[str, Any]
    ) -> None:
        stage = "connect"
        try:
            conn = self.ledger.get()
            stage = "upsert"
            row = conn.execute(
                self.result_sql,
                {"key": lease.job_key, "payload": Jsonb(payload), "token": lease.token},
            ).fetchone()
            stage = "commit"
            conn.commit()
        except psycopg.Error as exc:
            self.ledger.rollback()
            self.log.end(rec, "unknown" if stage == "commit" else "error", wid=wid, err=short(exc))
            return
        assert row is not None
        self.log.end(rec, "ok", wid=wid, at=iso(row[1]))

    def write_ledger(self, lease: tenure.Lease) -> None:
        rec = self.log.begin("ledger", **self._lease_fields(lease))
        wid = f"l{rec['w']}.{rec['inc']}.{rec['n']}"
        stage = "connect"
        try:
            conn = self.ledger.get()
            if self.fenced:
                stage = "fence"
                tenure.fence(conn, lease.job_key, lease.token, schema=self.schema)
            stage = "insert"
            row = conn.execute(
                self.ledger_sql, {"key": lease.job_key, "token": lease.token, "wid": wid}
            ).fetchone()
            stage = "commit"
            conn.commit()
        except tenure.StaleTokenError as exc:
            self.ledger.rollback()
            self.log.end(rec, "stale", wid=wid, err=short(exc))
            return
        except (psycopg.Error, tenure.TenureError) as exc:
            # The server commits nothing it was not sent a COMMIT for: a failure before the
            # commit stage is "error" (not applied); during the commit it is "unknown".
            self.ledger.rollback()
            outcome = "unknown" if stage == "commit" else "error"
            self.log.end(rec, outcome, wid=wid, stage=stage, err=short(exc))
            return
        assert row is not None
        self.log.end(rec, "ok", wid=wid, id=row[0], at=iso(row[1]))

    def renew(self, lease: tenure.Lease) -> bool:
        """Renew once; False when the lease is lost (by the database or the local deadline)."""
        rec = self.log.begin("renew", key=lease.job_key, token=lease.token, owner=str(lease.owner))
        if lease.lost:
            self.log.end(rec, "skipped", reason=lease.lost_reason)
            return False
        try:
            until = lease.renew()
        except tenure.LeaseLost as exc:
            self.log.end(rec, "lost", reason=exc.reason)
            return False
        except tenure.TenureError as exc:
            # A renewal's unknown outcome only ever extends this same holder's lease.
            self.log.end(rec, tenure_outcome(exc), err=short(exc))
            return True
        self.log.end(rec, "ok", until=iso(until))
        return True

    def release(self, lease: tenure.Lease) -> None:
        assert self.client is not None
        rec = self.log.begin(
            "release", key=lease.job_key, token=lease.token, owner=str(lease.owner)
        )
        try:
            # The named query (not Lease.release) because it returns the database time at
            # which the lease ended, which the checker needs.
            rows = self.client._fetch(
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
        except tenure.TenureError as exc:
            self.log.end(rec, tenure_outcome(exc), err=short(exc))
            return
        if rows:
            self.log.end(rec, "ok", at=iso(rows[0][1]))
        else:
            self.log.end(rec, "none")  # already expired or taken over


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.worker")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--incarnation", type=int, default=0)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-fence", action="store_true")
    parser.add_argument("--oplog", required=True)
    parser.add_argument("--logfile", required=True)
    args = parser.parse_args(argv)
    # tenure's and psycopg_pool's own logs (renewal failures, reconnects) go to a file.
    logging.basicConfig(
        filename=args.logfile,
        level=logging.WARNING,
        format=f"%(asctime)s w{args.worker}.{args.incarnation} %(name)s %(levelname)s %(message)s",
    )
    with open(args.oplog, "a", encoding="utf-8") as stream:
        Worker(args, OpLog(stream, args.worker, args.incarnation)).run()


if __name__ == "__main__":
    main()
