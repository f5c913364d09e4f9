"""The ``tenure`` pytest plugin (entry point ``pytest11``): the fixtures of tenure.testing.

Every fixture is named ``tenure_*``, so it never shadows a suite's own ``dsn``, ``schema``
or ``client`` fixtures.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from ..leases._sync.client import Client, connect
from .helpers import LeaseHelpers, pick_dsn


@pytest.fixture(scope="session")
def tenure_dsn() -> str:
    """``$TENURE_TEST_DSN``, else ``$TENURE_DSN``, else the embedded PostgreSQL."""
    return pick_dsn()


@pytest.fixture
def tenure_schema(tenure_dsn: str) -> Iterator[str]:
    """A throwaway schema with tenure's tables, dropped after the test."""
    name = f"tenure_test_{uuid.uuid4().hex[:12]}"
    with connect(tenure_dsn, schema=name, migrate=True):
        pass
    try:
        yield name
    finally:
        with psycopg.connect(tenure_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def tenure_client(tenure_dsn: str, tenure_schema: str) -> Iterator[Client]:
    """A :class:`tenure.Client` on the test's schema."""
    with connect(tenure_dsn, schema=tenure_schema) as client:
        yield client


@pytest.fixture
def tenure_leases(tenure_dsn: str, tenure_schema: str) -> Iterator[LeaseHelpers]:
    """Expire a lease now, make a successor take over and write, pause a holder process."""
    helpers = LeaseHelpers(tenure_dsn, tenure_schema)
    try:
        yield helpers
    finally:
        helpers.close()
