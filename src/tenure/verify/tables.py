"""The run's throwaway schema: created (tenure's tables, then the evidence tables of
``verify_setup`` in sql/verify.sql), read by the checker, dropped afterwards."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg

from ..db.queries import query
from .checker import Snapshot

SCHEMA_PREFIX = "tenure_verify_"


def new_schema_name() -> str:
    """A fresh name nobody else uses (the run creates it and fails if it already exists)."""
    return f"{SCHEMA_PREFIX}{uuid.uuid4().hex[:12]}"


def setup(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the evidence tables (tenure's schema must be migrated first)."""
    conn.execute(query(schema, "verify_setup"))


def drop(conn: psycopg.Connection[Any], schema: str) -> None:
    """Drop the run's schema. Only ever called with a name this run created."""
    if not schema.startswith(SCHEMA_PREFIX):
        raise ValueError(f"refusing to drop {schema!r}: not a schema tenure verify created")
    conn.execute(query(schema, "verify_drop"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def snapshot(conn: psycopg.Connection[Any], schema: str) -> Snapshot:
    """The tables the checker reads, as JSON-able rows."""

    def rows(name: str) -> list[dict[str, Any]]:
        cur = conn.execute(query(schema, name))
        names = [d.name for d in cur.description or []]
        return [{n: _jsonable(v) for n, v in zip(names, r, strict=True)} for r in cur.fetchall()]

    return {
        "lease_history": rows("verify_snapshot_lease_history"),
        "ledger": rows("verify_snapshot_ledger"),
        "results_history": rows("verify_snapshot_results_history"),
        "results": rows("verify_snapshot_results"),
        "leases": rows("verify_snapshot_leases"),
    }
