"""Helpers of the outbox tests: a webhook consumer that applies requests with the inbox (a
real HTTP server on loopback), relay processes (`python -m tenure relay`) and small queries."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

import tenure
from tenure import outbox


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def query(dsn: str, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(text.encode(), params).fetchall()


def enqueue(dsn: str, schema: str, items: list[tuple[str, str, Any, str | None]]) -> list[int]:
    """Enqueue (topic, key, payload, order_key) messages in one committed transaction."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        for topic, key, payload, order_key in items:
            assert outbox.enqueue(conn, topic, key, payload, order_key=order_key, schema=schema)
    keys = [(t, k) for t, k, _, _ in items]
    rows = query(dsn, f'SELECT topic, key, id FROM "{schema}".outbox')
    ids = {(t, k): i for t, k, i in rows}
    return [ids[k] for k in keys]


def message(dsn: str, schema: str, msg_id: int) -> outbox.Message:
    with tenure.connect(dsn, schema=schema, pool_size=1) as client:
        return outbox.messages(client, state="all", ids=[msg_id])[0]


def counts(dsn: str, schema: str) -> dict[str, int]:
    with tenure.connect(dsn, schema=schema, pool_size=1) as client:
        return outbox.counts(client)


def make_effects_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            sql.SQL("CREATE TABLE {}.effects (key text, payload jsonb)").format(
                sql.Identifier(schema)
            )
        )


def effects(dsn: str, schema: str) -> list[str]:
    return sorted(r[0] for r in query(dsn, f'SELECT key FROM "{schema}".effects'))


@dataclass
class Request:
    key: str
    topic: str
    message_id: int
    attempt: int
    payload: Any
    start: float
    end: float = 0.0
    applied: bool = False
    status: int = 0


@dataclass
class Reply:
    status: int = 200
    apply: bool = True
    delay: float = 0.0  # after applying, before answering
    body: str = "ok"


@dataclass
class Consumer:
    """A webhook receiver that applies each request with the inbox, in PostgreSQL."""

    dsn: str
    schema: str
    behaviour: Callable[[Request, int], Reply] = lambda req, n: Reply()
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def handle(self, req: Request) -> Reply:
        with self.lock:
            seen = sum(1 for r in self.requests if r.key == req.key)
            self.requests.append(req)
        reply = self.behaviour(req, seen)
        if reply.apply:
            with psycopg.connect(self.dsn) as conn, conn.transaction():
                req.applied = tenure.inbox.claim_header(
                    conn, "webhook", req.key, schema=self.schema
                )
                if req.applied:
                    conn.execute(
                        sql.SQL("INSERT INTO {}.effects VALUES (%s, %s)").format(
                            sql.Identifier(self.schema)
                        ),
                        (req.key, Jsonb(req.payload)),
                    )
        time.sleep(reply.delay)
        req.status = reply.status
        req.end = time.monotonic()
        return reply

    def by_key(self) -> dict[str, list[Request]]:
        out: dict[str, list[Request]] = {}
        with self.lock:
            for r in self.requests:
                out.setdefault(r.key, []).append(r)
        return out


class ConsumerHandler(BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:
        start = time.monotonic()
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = Request(
            key=self.headers["Idempotency-Key"],
            topic=self.headers["X-Tenure-Topic"],
            message_id=int(self.headers["X-Tenure-Message-Id"]),
            attempt=int(self.headers["X-Tenure-Attempt"]),
            payload=json.loads(body),
            start=start,
        )
        assert self.headers["Content-Type"] == "application/json"
        reply = self.server.consumer.handle(req)
        data = reply.body.encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the relay gave up waiting (timeout) and closed the connection

    def log_message(self, format: str, *args: Any) -> None:
        pass


class RelayProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.log = log
        with log.open("w") as stderr:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tenure", "relay", "--log-level", "info", *args],
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def wait_ready(self, timeout: float = 30) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert "delivering" in line, f"relay did not start: {line!r}\n{self.log.read_text()}"
        return line

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)
