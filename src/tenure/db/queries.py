"""Named SQL queries, loaded once from the packaged ``sql/*.sql`` files (``queries.sql`` for
leases and results; one file per further concept). Names are unique across files.

Each query is composed with the configured schema as a :class:`psycopg.sql.Identifier` and
rendered to bytes once per schema, so executing one costs no more than executing a literal.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _raw() -> dict[str, str]:
    found: dict[str, str] = {}
    folder = resources.files("tenure.db").joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME.split(entry.read_text("utf-8"))
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise RuntimeError(f"query {name!r} is defined twice (sql/{entry.name})")
            # Comments stay in the file for reviewers; they are not sent with each execution.
            found[name] = "\n".join(
                line for line in body.strip().splitlines() if not line.lstrip().startswith("--")
            )
    return found


def compose(template: str, schema: str, *, with_params: bool = True) -> bytes:
    """Render a template that uses ``{schema}`` with the schema quoted as an identifier.

    Only the ``{schema}`` token is replaced (other braces, e.g. ``'{}'::bigint[]``, stay).
    ``with_params``: the statement is executed with parameters (a mapping, ``{}`` if it has
    none), so psycopg scans it for ``%`` placeholders and a ``%`` in the schema name must be
    doubled; without parameters psycopg sends the text as it is, so it must not be.
    """
    quoted = sql.Identifier(schema).as_string()
    if with_params:
        quoted = quoted.replace("%", "%%")
    return template.replace("{schema}", quoted).encode()


@functools.cache
def queries(schema: str) -> dict[str, bytes]:
    """All named queries for one schema, to execute with parameters (``{}`` if none)."""
    return {name: compose(body, schema) for name, body in _raw().items()}


def query(schema: str, name: str) -> bytes:
    return queries(schema)[name]
