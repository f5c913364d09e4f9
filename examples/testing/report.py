"""A user's job: write the nightly report into the application's own table, fenced.

The write commits only if the job's token is still the newest (tenure.fence): a run that was
paused past its lease, while a successor took over, raises StaleTokenError and commits
nothing. examples/testing/test_report.py proves it with the tenure pytest plugin.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

import tenure

TABLE = "nightly_reports"


def create_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {}.{} (day date PRIMARY KEY, rows int)").format(
                sql.Identifier(schema), sql.Identifier(TABLE)
            )
        )


def store_report(client: tenure.Client, lease: tenure.Lease) -> int:
    """The job's commit: its report row, in a transaction fenced with the lease's token."""
    with client.connection() as conn, conn.transaction():
        tenure.fence(conn, lease.job_key, lease.token, schema=client.schema)
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.{} VALUES (current_date, %s) "
                "ON CONFLICT (day) DO UPDATE SET rows = excluded.rows"
            ).format(sql.Identifier(client.schema), sql.Identifier(TABLE)),
            [lease.token],
        )
    return lease.token
