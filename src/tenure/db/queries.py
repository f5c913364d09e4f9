"""Named SQL queries, loaded once from a package's ``sql/*.sql`` files (tenure's own in
``tenure/db/sql``: ``queries.sql`` for leases and results, one file per further concept; the
dashboard's in ``tenure/ui/sql``, loaded only with the dashboard). Names are unique across a
package's files.

Each block starts with ``-- name: NAME`` (a statement) or ``-- fragment: NAME`` (a piece of
SQL that statements share, written ``{NAME}`` in them: one spelling of an expression that two
statements must agree on, such as the takeover). Each query is composed with the configured
schema as a :class:`psycopg.sql.Identifier` and rendered to bytes once per schema, so
executing one costs no more than executing a literal.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)


def strip_comments(body: str) -> str:
    """``body`` without its comment lines. Comments stay in the files for reviewers; they
    are not sent with each execution, and ``{schema}`` is never substituted inside one (a
    schema name with a newline in it ended the comment there, and the rest ran as SQL)."""
    return "\n".join(
        line for line in body.strip().splitlines() if not line.lstrip().startswith("--")
    )


@functools.cache
def named(package: str = "tenure.db") -> dict[str, str]:
    """The named statements of ``package``'s ``sql/*.sql`` files, fragments filled in, with
    ``{schema}`` still to compose."""
    found: dict[str, str] = {}
    fragments: dict[str, str] = {}
    folder = resources.files(package).joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _BLOCK.split(entry.read_text("utf-8"))
        # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            into = found if kind == "name" else fragments
            if name in into:
                raise RuntimeError(f"{kind} {name!r} is defined twice (sql/{entry.name})")
            into[name] = strip_comments(body)
    for name, body in found.items():
        for fragment, text in fragments.items():
            body = body.replace("{" + fragment + "}", text)
        found[name] = body
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
def queries(schema: str, package: str = "tenure.db") -> dict[str, bytes]:
    """All named queries of ``package`` for one schema, to execute with parameters (``{}`` if
    none)."""
    return {name: compose(body, schema) for name, body in named(package).items()}


def query(schema: str, name: str) -> bytes:
    return queries(schema)[name]
