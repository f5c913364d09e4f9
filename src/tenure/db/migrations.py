"""Forward-only versioned migrations: ``sql/migrations/NNNN_name.sql``, applied in order by
``tenure migrate`` / ``client.migrate()`` in one transaction under an advisory lock."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

from .queries import strip_comments

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")

#: Serialises concurrent migrators (any schema): pg_advisory_xact_lock(hashtext(LOCK_NAME)).
LOCK_NAME = "tenure.migrate"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@functools.cache
def available() -> tuple[Migration, ...]:
    folder = resources.files("tenure.db").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        m = _FILE.match(entry.name)
        if m:
            sql = strip_comments(entry.read_text("utf-8"))
            found.append(Migration(int(m.group(1)), m.group(2), sql))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two of tenure's migrations share a version: {versions}")
    return tuple(found)


def latest() -> int:
    return available()[-1].version


BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.tenure_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""
