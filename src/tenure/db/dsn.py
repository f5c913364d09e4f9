"""Where the database is: an explicit DSN, ``$TENURE_DSN``, ``$DATABASE_URL``, or the
embedded server. Passwords are never printed: use :func:`describe` for humans."""

from __future__ import annotations

import logging
import os

import psycopg.conninfo

log = logging.getLogger("tenure.dsn")


def resolve(dsn: str | None = None) -> tuple[str, str]:
    """Return ``(dsn, source)``; ``source`` says where it came from, for logs and errors."""
    if dsn:
        return dsn, "the DSN given"
    for var in ("TENURE_DSN", "DATABASE_URL"):
        value = os.environ.get(var)
        if value:
            return value, f"${var}"
    from . import embedded

    return embedded.dsn(), "embedded"


def describe(dsn: str) -> str:
    """``user@host:port/dbname`` without the password or other secrets."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    user = str(params.get("user") or os.environ.get("PGUSER") or "")
    dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or user or "")
    where = f"{host}:{port}" if not host.startswith("/") else f"socket {host}"
    return f"{user + '@' if user else ''}{where}/{dbname}"
