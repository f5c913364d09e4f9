"""Fixtures of the outbox tests: a webhook consumer on loopback and relay processes."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

import tenure
from tests.support.env import tenure_env
from tests.support.outbox import Consumer, ConsumerHandler, RelayProcess, make_effects_table


@pytest.fixture
def consumer(client: tenure.Client, dsn: str) -> Iterator[Consumer]:
    make_effects_table(dsn, client.schema)
    cons = Consumer(dsn, client.schema)
    server = ThreadingHTTPServer(("127.0.0.1", 0), ConsumerHandler)
    server.daemon_threads = True
    server.consumer = cons  # type: ignore[attr-defined]
    cons.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield cons
    server.shutdown()
    server.server_close()


@pytest.fixture
def relays(dsn: str, schema: str, tmp_path: Path) -> Iterator[Callable[..., RelayProcess]]:
    started: list[RelayProcess] = []

    def start(*args: str, **env_extra: str) -> RelayProcess:
        env = tenure_env(dsn, schema, **env_extra)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(tmp_path), env.get("PYTHONPATH", "")) if p
        )
        proc = RelayProcess(list(args), env, tmp_path / f"relay-{len(started)}.log", tmp_path)
        started.append(proc)
        proc.wait_ready()
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait(timeout=10)
        if proc.proc.stdout is not None:
            proc.proc.stdout.close()
