"""Helpers for the integration tests: example processes and the slots they recorded."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from .env import ROOT, tenure_env

EXAMPLES = ROOT / "examples"


def example_env(dsn: str, schema: str, **extra: str) -> dict[str, str]:
    """A child's environment: the test database and schema, tenure importable."""
    env = tenure_env(dsn, schema, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def start(
    args: Sequence[str], env: dict[str, str], log: Path, *, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """A real child process (its own session, so a stop reaches its children), output to log."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            list(args),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    """Signal the child's whole group and wait for it; SIGKILL if it does not exit."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    return proc.returncode


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def recorded_slots(dsn: str, schema: str, table: str, column: str = "slot") -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT {} FROM {} ORDER BY 1").format(
                sql.Identifier(column), sql.Identifier(schema, table)
            )
        ).fetchall()
    return [r[0] for r in rows]


def parse_slot(name: str) -> dt.datetime:
    return dt.datetime.strptime(name, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def assert_each_slot_once(
    slots: Sequence[str | dt.datetime], *, at_least: int, period: int = 1, missing_at_most: int = 0
) -> None:
    """Every slot from the first to the last ran exactly once (all but ``missing_at_most``
    ran), and there were enough.

    Slots are names (``2026-12-01T14:05:00Z``) or the scheduler's datetimes."""
    twice = {s: n for s, n in Counter(slots).items() if n > 1}
    assert not twice, f"slots that ran more than once: {twice}"
    times = sorted(s if isinstance(s, dt.datetime) else parse_slot(s) for s in slots)
    assert len(times) >= at_least, f"only {len(times)} slots ran: {slots}"
    expected = (times[-1] - times[0]) // dt.timedelta(seconds=period) + 1
    missing = sorted(
        {times[0] + dt.timedelta(seconds=period * i) for i in range(expected)} - set(times)
    )
    assert len(missing) <= missing_at_most, (
        f"slots that never ran between the first and last: {missing}"
    )
