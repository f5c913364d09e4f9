"""Each row type (tenure.db.rows) names its statement's result columns, in order.

PostgreSQL describes each registered statement (prepared, never executed) on a migrated
schema; the row type's fields must be exactly those column names. A column added, dropped,
renamed or moved in a .sql file fails here instead of shifting the fields after it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tenure
from tenure.db.queries import queries
from tenure.db.rows import ROW_TYPES, row_of

SRC = Path(tenure.__file__).resolve().parent
#: Every module that registers row types, loaded so that they register.
ROW_MODULES = sorted(
    ".".join(("tenure", *p.relative_to(SRC).with_suffix("").parts))
    for p in SRC.rglob("*.py")
    if "@row_of(" in p.read_text(encoding="utf-8")
)
_PLACEHOLDER = re.compile(rb"%\((\w+)\)s|%%")


def _numbered(statement: bytes) -> bytes:
    """psycopg's %(name)s placeholders as PostgreSQL's $n (what psycopg sends)."""
    numbers: dict[bytes, int] = {}

    def number(m: re.Match[bytes]) -> bytes:
        if m.group(0) == b"%%":
            return b"%"
        return b"$%d" % numbers.setdefault(m.group(1), len(numbers) + 1)

    return _PLACEHOLDER.sub(number, statement)


def columns(conn: psycopg.Connection[Any], name: str, statement: bytes) -> list[str]:
    """The result columns PostgreSQL says ``statement`` returns (prepared, not executed)."""
    pgconn = conn.pgconn
    prepared = pgconn.prepare(name.encode(), _numbered(statement))
    assert prepared.status == psycopg.pq.ExecStatus.COMMAND_OK, prepared.error_message
    described = pgconn.describe_prepared(name.encode())
    assert described.status == psycopg.pq.ExecStatus.COMMAND_OK, described.error_message
    return [(described.fname(i) or b"").decode() for i in range(described.nfields)]


def all_statements(schema: str) -> dict[str, bytes]:
    from tenure.ui.queries import ui_queries

    return {**queries(schema), **ui_queries(schema)}


def test_every_row_type_has_its_statements_columns(client: tenure.Client, dsn: str) -> None:
    for module in ROW_MODULES:
        importlib.import_module(module)
    assert len(ROW_TYPES) >= 12  # the rows modules were found and registered
    statements = all_statements(client.schema)
    wrong = []
    with psycopg.connect(dsn) as conn:
        for name, row in sorted(ROW_TYPES.items()):
            assert name in statements, f"{row.__name__} names an unknown statement {name!r}"
            found = columns(conn, name, statements[name])
            fields = (
                [f.name for f in dataclasses.fields(row)]
                if dataclasses.is_dataclass(row)
                else list(getattr(row, "_fields", ()))
            )
            if found != fields:
                wrong.append(f"{name}: {row.__name__} has {fields}, the statement returns {found}")
    assert wrong == []


def test_a_moved_column_is_caught(client: tenure.Client, dsn: str) -> None:
    """The check itself: a statement whose columns are in another order than the fields."""
    statement = queries(client.schema)["inspect"]
    moved = statement.replace(b"lease_owner,", b"", 1).replace(b"SELECT ", b"SELECT lease_owner, ")
    with psycopg.connect(dsn) as conn:
        assert columns(conn, "inspect", statement)[:2] == ["job_key", "lease_owner"]
        assert columns(conn, "moved", moved)[:2] == ["lease_owner", "job_key"]


def test_a_statement_has_one_row_type() -> None:
    row_of("no_such_statement")(tuple)
    try:
        with pytest.raises(RuntimeError, match="two row types"):
            row_of("no_such_statement")(type("Other", (tuple,), {}))
    finally:
        ROW_TYPES.pop("no_such_statement")


def test_values_built_from_rows_in_order_have_the_rows_fields() -> None:
    """Values made from a row by position (``RunRecord(*row)``) have its fields in order."""
    from tenure.scheduler.jobs import RunRecord
    from tenure.scheduler.rows import HistoryRow

    assert [f.name for f in dataclasses.fields(RunRecord)] == list(HistoryRow._fields)


def fetch_calls() -> list[tuple[str, int, str, str]]:
    """Every ``x.fetch*("name", ..., row=T)`` in the source: (file, line, statement, T)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("fetch", "fetch_one", "fetch_sized")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                for kw in node.keywords:
                    if kw.arg == "row":
                        found.append(
                            (path.name, node.lineno, node.args[0].value, ast.unparse(kw.value))
                        )
    return found


def test_each_fetch_names_its_statements_row_type() -> None:
    for module in ROW_MODULES:
        importlib.import_module(module)
    calls = fetch_calls()
    assert len(calls) >= 5
    wrong = [
        f"{file}:{line} fetches {name!r} as {row}"
        for file, line, name, row in calls
        if name not in ROW_TYPES or ROW_TYPES[name].__name__ != row.rsplit(".", 1)[-1]
    ]
    assert wrong == []


def test_a_kept_job_s_row_of_the_finish_is_a_claim_s_row() -> None:
    """sched_finish returns a kept job as sched_claim returns a claimed one, after the
    columns of its finished runs: FinishedRow.claim() reads it by position from there."""
    from tenure.scheduler.rows import ClaimRow, FinishedRow

    fields = list(FinishedRow._fields)
    assert fields[fields.index("lease_owner") :] == list(ClaimRow._fields)[1:]
