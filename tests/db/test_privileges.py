"""tenure.db.privileges: the list behind `tenure grants` and doctor's privileges check."""

from __future__ import annotations

import psycopg

import tenure
from tenure.db.privileges import TABLES, grant_statements


def test_every_table_of_the_schema_is_in_the_grants(dsn: str, schema: str) -> None:
    """A migration that adds a table must add what it needs to tenure.db.privileges (or the
    application role will find it out in production)."""
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    with psycopg.connect(dsn) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            )
        }
    assert tables == {need.table for need in TABLES}
    statements = " ".join(grant_statements(schema, "someone"))
    assert all(f'"{table}"' in statements for table in tables)
