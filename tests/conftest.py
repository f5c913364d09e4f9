"""Shared fixtures: a real PostgreSQL for every test that touches storage.

DSN: $TENURE_TEST_DSN; else 127.0.0.1:5432 (user postgres) if it answers; else the embedded
server. Each test gets its own schema, dropped afterwards, so tests never see each other.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import tenure

LOCAL = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parent.parent


def _pick_dsn() -> str:
    explicit = os.environ.get("TENURE_TEST_DSN")
    if explicit:
        return explicit
    try:
        with psycopg.connect(LOCAL, connect_timeout=2):
            return LOCAL
    except psycopg.OperationalError:
        from tenure import embedded

        return embedded.dsn()


@pytest.fixture(scope="session")
def dsn() -> str:
    return _pick_dsn()


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(name))
        )


@pytest.fixture
def client(dsn: str, schema: str) -> Iterator[tenure.Client]:
    with tenure.connect(dsn, schema=schema, migrate=True) as c:
        yield c


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A user's own connection (not tenure's), for fenced transactions."""
    with psycopg.connect(dsn) as c:
        yield c


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
