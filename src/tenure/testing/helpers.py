"""What the plugin's ``tenure_leases`` fixture does, usable without pytest too."""

from __future__ import annotations

import datetime as dt
import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg

from ..db import embedded
from ..db.queries import query
from ..errors import LeaseBusy, TenureError, Timeout
from ..leases._sync.client import Client, connect
from ..leases._sync.lease import Lease
from ..validation import Duration, parse_duration

#: How long a helper waits for its child process to answer.
ANSWER_TIMEOUT = 60.0


def pick_dsn() -> str:
    """``$TENURE_TEST_DSN``, else ``$TENURE_DSN``, else the embedded server (started)."""
    for name in ("TENURE_TEST_DSN", "TENURE_DSN"):
        value = os.environ.get(name)
        if value:
            return value
    return embedded.dsn()


@dataclass(frozen=True)
class Outcome:
    """What a holder's job did when told to run: ``error`` is the exception's type name
    (e.g. ``"StaleTokenError"``) or None, ``value`` the repr of what it returned."""

    error: str | None
    message: str
    value: str | None

    @property
    def refused(self) -> bool:
        """The job's fenced write was refused: a successor's token is newer."""
        return self.error == "StaleTokenError"


class Holder:
    """A real child process that acquired ``job_key`` and waits to run ``target``.

    ``target`` is ``"module:function"``, imported in the child and called as
    ``function(client, lease)`` when :meth:`run` is called: the job's own work under the
    lease the child took (its token is :attr:`token`). The child never renews: the lease
    lasts its TTL unless :meth:`LeaseHelpers.expire` ends it first. :meth:`pause` stops the
    process with ``SIGSTOP`` (as a long GC pause or a frozen VM would), :meth:`resume`
    continues it.
    """

    def __init__(self, dsn: str, schema: str, job_key: str, target: str | None, ttl: float) -> None:
        self.job_key = job_key
        env = dict(os.environ)
        # The child imports the target as the test would: with the test's import path.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tenure.testing._holder"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._paused = False
        first = self._send(
            {"dsn": dsn, "schema": schema, "job_key": job_key, "target": target, "ttl": ttl}
        )
        if "busy" in first:
            self.stop()
            busy = first["busy"]
            raise LeaseBusy(
                job_key,
                busy["token"],
                dt.datetime.fromisoformat(busy["expires_at"]),
                " (a holder's acquire; end that lease first with tenure_leases.expire)",
            )
        if "token" not in first:
            self.stop()
            raise TenureError(f"holder for {job_key!r} failed to start: {first.get('message')}")
        self.token: int = first["token"]

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [], ANSWER_TIMEOUT)
        line = self._proc.stdout.readline() if ready else ""
        if not line:
            code = self._proc.poll()
            raise Timeout(
                f"the holder of {self.job_key!r} did not answer within {ANSWER_TIMEOUT:g}s"
                + ("" if code is None else f" (it exited with {code})")
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def pause(self) -> None:
        """Stop the process (``SIGSTOP``) and return once the kernel has stopped it."""
        os.kill(self._proc.pid, signal.SIGSTOP)
        os.waitpid(self._proc.pid, os.WUNTRACED)
        self._paused = True

    def resume(self) -> None:
        """Continue a paused process (``SIGCONT``)."""
        os.kill(self._proc.pid, signal.SIGCONT)
        self._paused = False

    def run(self) -> Outcome:
        """Run the target now, in the child, with the lease it acquired; resumes it first if
        it is paused."""
        if self._paused:
            self.resume()
        answer = self._send({"run": True})
        return Outcome(answer.get("error"), answer.get("message", ""), answer.get("value"))

    def stop(self) -> None:
        """End the child (it holds no connection open across a test: its lease stays as it
        is in the database)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(timeout=ANSWER_TIMEOUT)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Holder:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LeaseHelpers:
    """Make the faults a job must survive happen now, on one schema (see the module doc)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._holders: list[Holder] = []
        self._clients: list[Client] = []

    def expire(self, job_key: str) -> int | None:
        """End the live lease on ``job_key`` now (by the database clock); its token, or None
        if no lease was live. The holder is not told: its next renewal or fenced write finds
        out, as it would after a pause."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                query(self.schema, "testing_expire_lease"), {"job_key": job_key}
            ).fetchone()
        return None if row is None else int(row[0])

    def take_over(self, job_key: str, payload: Any = None, *, ttl: Duration = "30s") -> Lease:
        """A successor takes ``job_key`` over (expiring the current lease first) and, with a
        ``payload``, stores it as the job's result with its newer token. Returns the
        successor's lease (not renewed; released when the fixture ends)."""
        self.expire(job_key)
        client = self._client()
        lease = client.acquire(job_key, ttl=ttl)
        if lease is None:
            raise LeaseBusy(job_key, None, None, " (taken again before the successor could)")
        if payload is not None:
            client.results.put(job_key, payload, token=lease.token)
        return lease

    def holder(self, job_key: str, target: str | None = None, *, ttl: Duration = "30s") -> Holder:
        """Start a :class:`Holder` of ``job_key`` in a child process (stopped at teardown)."""
        seconds = parse_duration(ttl, what="ttl")
        holder = Holder(self.dsn, self.schema, job_key, target, seconds)
        self._holders.append(holder)
        return holder

    def _client(self) -> Client:
        if not self._clients:
            self._clients.append(connect(self.dsn, schema=self.schema))
        return self._clients[0]

    def close(self) -> None:
        for holder in self._holders:
            if holder._paused:
                holder.resume()
            holder.stop()
        for client in self._clients:
            client.close()
        self._holders.clear()
        self._clients.clear()
