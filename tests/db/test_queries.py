"""The one loader of named SQL (tenure.db.queries): statements, shared fragments, packages."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from tenure.db.queries import named, queries
from tenure.ui.queries import ui_queries

_LEFT_BRACE = re.compile(r"\{(?!schema\})\w+\}")


def test_no_statement_keeps_a_placeholder_but_the_schema() -> None:
    """A ``{name}`` with no such fragment would reach the server as text."""
    for package in ("tenure.db", "tenure.ui"):
        left = {n: _LEFT_BRACE.findall(body) for n, body in named(package).items()}
        assert {n: found for n, found in left.items() if found} == {}


def test_the_takeover_is_written_once_and_used_by_acquire_and_the_claim() -> None:
    folder = resources.files("tenure.db").joinpath("sql")
    text = "".join(f.read_text("utf-8") for f in folder.iterdir() if f.name.endswith(".sql"))
    assert text.count("pg_walfile_name(") == 1
    assert text.count("fencing_token = greatest(l.fencing_token + 1") == 1
    statements = named()
    takeover = "fencing_token = greatest(l.fencing_token + 1, excluded.fencing_token)"
    floor = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"
    for name in ("acquire", "sched_claim"):
        assert takeover in statements[name] and floor in statements[name], name


def test_the_dashboards_statements_come_through_the_same_loader() -> None:
    assert ui_queries("s") == queries("s", "tenure.ui")
    assert "ui_job" in ui_queries("s") and "ui_job" not in queries("s")


def test_fragments_and_duplicates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "door_sql_probe"
    (package / "sql").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sql" / "a.sql").write_text(
        "-- fragment: live\n-- why\nlease_until >= now()\n\n"
        "-- name: one\n-- a comment\nSELECT 1 FROM {schema}.t WHERE {live} AND x = '{}'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert named("door_sql_probe") == {
        "one": "SELECT 1 FROM {schema}.t WHERE lease_until >= now() AND x = '{}'"
    }
    (package / "sql" / "b.sql").write_text("-- name: one\nSELECT 2\n")
    named.cache_clear()
    with pytest.raises(RuntimeError, match="name 'one' is defined twice"):
        named("door_sql_probe")
    named.cache_clear()
