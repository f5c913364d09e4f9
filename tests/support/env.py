"""Where the tests' database is and how they run the real `tenure` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

LOCAL = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parents[2]


def pick_dsn() -> str:
    explicit = os.environ.get("TENURE_TEST_DSN")
    if explicit:
        return explicit
    try:
        with psycopg.connect(LOCAL, connect_timeout=2):
            return LOCAL
    except psycopg.OperationalError:
        from tenure.db import embedded

        return embedded.dsn()


def tenure_env(dsn: str, schema: str, **extra: str) -> dict[str, str]:
    """Environment for a child process: the test database and schema."""
    env = dict(os.environ, TENURE_DSN=dsn, TENURE_SCHEMA=schema, **extra)
    env.pop("DATABASE_URL", None)
    return env


def run_tenure(
    args: list[str], env: dict[str, str], *, input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real `tenure` command in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "tenure", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
