"""Shared fixtures: a real PostgreSQL for every test that touches storage.

DSN: $TENURE_TEST_DSN; else 127.0.0.1:5432 (user postgres) if it answers; else the embedded
server. Each test gets its own schema, dropped afterwards, so tests never see each other.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

import tenure
from tests.support.env import ROOT, pick_dsn, run_tenure, tenure_env

__all__ = ["ROOT", "run_tenure", "tenure_env"]


@pytest.fixture(scope="session")
def dsn() -> str:
    return pick_dsn()


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
