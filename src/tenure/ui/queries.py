"""The dashboard's named queries (``ui/sql/ui.sql``), through tenure's one loader
(:mod:`tenure.db.queries`): same file format and schema substitution, kept apart so that they
ship (and are loaded) only with the dashboard."""

from __future__ import annotations

from ..db.queries import queries


def ui_queries(schema: str) -> dict[str, bytes]:
    return queries(schema, "tenure.ui")
