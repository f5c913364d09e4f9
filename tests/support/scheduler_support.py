"""Helpers for the scheduler tests: real worker processes, an in-process worker, queries."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql

import tenure
from tenure.scheduler.claim import Claim, claims_from_rows
from tenure.scheduler.rows import ClaimRow
from tests.support.env import ROOT
from tests.support.scheduler_apps import EVIDENCE

APPS = "tests.support.scheduler_apps"

T = TypeVar("T")

FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def faketime_lib() -> str | None:
    for path in FAKETIME_LIBS:
        if os.path.exists(path):
            return path
    return None


def prepare(dsn: str, schema: str) -> None:
    """Migrate ``schema`` and create the evidence table the test apps write to."""
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(EVIDENCE).format(schema=sql.Identifier(schema)))


def query(dsn: str, schema: str, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run ``text`` with ``{schema}`` substituted as an identifier."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql.SQL(text).format(schema=sql.Identifier(schema)), params)
        return cur.fetchall() if cur.description else []


def slot_in(dsn: str, schema: str, key: str, seconds: float) -> dt.datetime:
    """Move ``key``'s next slot to ``seconds`` from now by the database clock."""
    [(slot,)] = query(
        dsn,
        schema,
        "UPDATE {schema}.scheduled_jobs SET next_slot = clock_timestamp() + %s "
        "WHERE job_key = %s RETURNING next_slot",
        (dt.timedelta(seconds=seconds), key),
    )
    return slot  # type: ignore[no-any-return]


def claim_batch(
    client: tenure.Client,
    ahead: float = 0.0,
    *,
    limit: int = 10,
    app: str = "a",
    exclude: Sequence[str] = (),
) -> tuple[list[Claim], ClaimRow]:
    """One ``sched_claim`` as a worker of ``app`` sends it: the claims and the summary row."""
    rows = client.fetch(
        "sched_claim",
        {"limit": limit, "exclude": list(exclude), "app": app, "ahead": ahead},
        doing="claiming",
        wrote=True,
        row=ClaimRow,
    )
    return claims_from_rows(rows)


def wait_for(
    check: Callable[[], T | None], *, timeout: float, interval: float = 0.1, what: str = ""
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        time.sleep(interval)


class WorkerProcess:
    """``python -m tenure worker tests.support.scheduler_apps:APP`` as a real child process."""

    def __init__(
        self,
        app: str,
        env: dict[str, str],
        log_path: Path,
        *,
        args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tenure",
                "worker",
                f"tests.support.scheduler_apps:{app}",
                *args,
            ],
            cwd=ROOT,
            env={**env, **(extra_env or {})},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_started(self, timeout: float = 30) -> None:
        def started() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log()}")
            return " started: " in self.log()

        wait_for(started, timeout=timeout, what=f"worker {self.pid} to start")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Make sure the process is gone (SIGCONT first: it may be stopped)."""
        if self.proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    break
            self.proc.wait(timeout=30)
        self._log.close()


@contextmanager
def worker_processes(
    count: int,
    app: str,
    env: dict[str, str],
    tmp_path: Path,
    *,
    args: Sequence[str] = (),
    extra_env: Sequence[dict[str, str] | None] | None = None,
) -> Iterator[list[WorkerProcess]]:
    """Start ``count`` workers and wait until each has started; kill leftovers at the end."""
    workers: list[WorkerProcess] = []
    try:
        for i in range(count):
            extra = extra_env[i] if extra_env else None
            workers.append(
                WorkerProcess(app, env, tmp_path / f"worker{i}.log", args=args, extra_env=extra)
            )
        for w in workers:
            w.wait_started()
        yield workers
    finally:
        for w in workers:
            w.stop()


class InProcessWorker:
    """Run ``app``'s worker on an event loop in a background thread of the test process."""

    def __init__(self, app: tenure.Scheduler, **kwargs: Any) -> None:
        self.app = app
        self.error: BaseException | None = None
        self._kwargs = kwargs
        self._thread = threading.Thread(target=self._main, name="in-process-worker", daemon=True)

    def _main(self) -> None:
        import asyncio

        try:
            asyncio.run(self.app.run_async(handle_signals=False, **self._kwargs))
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> InProcessWorker:
        self._thread.start()

        def ready() -> bool:
            if self.error is not None:
                raise AssertionError(f"worker failed: {self.error!r}") from self.error
            return self.app.ready

        wait_for(ready, timeout=20, what="the in-process worker to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.app.stop()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the in-process worker did not stop"
        if self.error is not None:
            raise self.error
