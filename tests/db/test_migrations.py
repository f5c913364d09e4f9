"""Migrations: idempotent, safe under concurrency, and the migrated schema is the expected one.

To refresh the snapshot after adding a migration on purpose:
    TENURE_UPDATE_SCHEMA_SNAPSHOT=1 python -m pytest tests/test_migrations.py
and review the diff of tests/expected_schema.txt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

import tenure
from tenure.db import migrations

SNAPSHOT = Path(__file__).with_name("expected_schema.txt")


def describe_schema(dsn: str, schema: str) -> str:
    """Tables, columns, constraints and indexes of ``schema``, as stable text."""
    lines: list[str] = []
    with psycopg.connect(dsn) as conn:
        for table, column, type_, nullable, default, generated in conn.execute(
            """SELECT c.table_name, c.column_name, c.data_type, c.is_nullable, c.column_default,
                      c.generation_expression
               FROM information_schema.columns c WHERE c.table_schema = %s
               ORDER BY c.table_name, c.ordinal_position""",
            (schema,),
        ):
            line = f"column {table}.{column} {type_} null={nullable} default={default}"
            if generated is not None:  # one line: the server indents a long expression
                line += " generated=" + " ".join(generated.split())
            lines.append(line)
        for table, options in conn.execute(
            """SELECT c.relname, c.reloptions FROM pg_class c
               WHERE c.relnamespace = %s::regnamespace AND c.reloptions IS NOT NULL
               ORDER BY 1""",
            (schema,),
        ):
            lines.append(f"options {table} {','.join(options)}")
        for table, name, definition in conn.execute(
            """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
               FROM pg_constraint WHERE connamespace = %s::regnamespace AND contype <> 'n'
               ORDER BY 1, 2""",
            (schema,),
        ):
            lines.append(f"constraint {table.split('.')[-1]}.{name} {definition}")
        for table, name, definition in conn.execute(
            """SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s
               ORDER BY 1, 2""",
            (schema,),
        ):
            lines.append(f"index {table}.{name} {definition.replace(schema + '.', '')}")
        for (name,) in conn.execute(
            """SELECT p.proname FROM pg_proc p WHERE p.pronamespace = %s::regnamespace
               ORDER BY 1""",
            (schema,),
        ):
            lines.append(f"function {name}")
    return "\n".join(lines) + "\n"


def test_migrated_schema_equals_expected(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema) as client:
        client.migrate()
    actual = describe_schema(dsn, schema).replace(schema, "SCHEMA")
    if os.environ.get("TENURE_UPDATE_SCHEMA_SNAPSHOT"):
        SNAPSHOT.write_text(actual)
    assert actual == SNAPSHOT.read_text(), "schema differs: see the module docstring"


def test_migrate_twice_is_a_no_op(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema) as client:
        assert client.schema_version() is None
        applied = client.migrate()
        assert applied == [m.version for m in migrations.available()]
        assert client.migrate() == []
        assert client.schema_version() == migrations.latest()


def test_four_processes_migrating_at_once(dsn: str, schema: str) -> None:
    code = (
        "import sys, tenure\n"
        "with tenure.connect(sys.argv[1], schema=sys.argv[2]) as c:\n"
        "    print(len(c.migrate()))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, dsn, schema],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    counts = sorted(int(out) for out, _ in outputs)
    assert counts == [0, 0, 0, len(migrations.available())]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            psycopg.sql.SQL("SELECT version FROM {}.tenure_migrations ORDER BY 1").format(
                psycopg.sql.Identifier(schema)
            )
        ).fetchall()
    assert [r[0] for r in rows] == [m.version for m in migrations.available()]


def test_schema_name_is_an_identifier_not_sql(dsn: str) -> None:
    """A hostile schema name is quoted, never executed."""
    name = 'x"; DROP TABLE pg_class; --'
    with tenure.connect(dsn, schema=name) as client:
        try:
            client.migrate()
            assert client.schema_version() == migrations.latest()
            lease = client.acquire("job", ttl=5)
            assert lease is not None and lease.token == 1
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        psycopg.sql.Identifier(name)
                    )
                )
