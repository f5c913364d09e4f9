"""An application role for a test: a real PostgreSQL role with a password-less login (the
test server trusts local connections), given exactly the grants `tenure grants` prints, or
those minus some."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.env import run_tenure, tenure_env


def role_dsn(dsn: str, role: str) -> str:
    """``dsn`` for logging in as ``role`` (no password: the test server trusts it)."""
    params = conninfo_to_dict(dsn)
    params.pop("password", None)
    params["user"] = role
    return make_conninfo("", **params)


def grant_statements(dsn: str, schema: str, role: str) -> list[str]:
    """What `tenure grants --role ROLE` prints for ``schema``, one statement per item."""
    out = run_tenure(["grants", "--role", role], tenure_env(dsn, schema))
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line and not line.startswith("--")]


@contextmanager
def app_role(
    dsn: str, schema: str, *, revoke: tuple[str, ...] = (), minimal: bool = True
) -> Iterator[str]:
    """A login role given, by the superuser of ``dsn``, `tenure grants`' statements for
    ``schema`` (``minimal=False``: every privilege on every table of the schema instead),
    then each ``revoke`` statement ({schema} and {role} are substituted); yields the
    role's DSN."""
    role = f"tenure_app_{uuid.uuid4().hex[:10]}"
    ident = sql.Identifier(role)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            if minimal:
                for statement in grant_statements(dsn, schema, role):
                    admin.execute(statement.encode())
            else:
                for text in (
                    "GRANT USAGE ON SCHEMA {schema} TO {role}",
                    "GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}",
                ):
                    admin.execute(sql.SQL(text).format(schema=sql.Identifier(schema), role=ident))
            for statement in revoke:
                admin.execute(sql.SQL(statement).format(schema=sql.Identifier(schema), role=ident))
        yield role_dsn(dsn, role)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident))
