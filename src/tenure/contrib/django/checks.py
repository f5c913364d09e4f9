"""System checks (``manage.py check --database default``, and before ``migrate``):

* ``tenure.E001``: the tenure database is not PostgreSQL.
* ``tenure.E002``: it is PostgreSQL on psycopg2; tenure needs psycopg 3.
* ``tenure.W001``: tenure's schema is missing or older than this tenure (database checks
  only, which Django runs when asked for a database).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.core import checks

from ...db.migrations import latest
from ...errors import TenureError
from .db import backend_problem, conninfo, settings


def check_backend(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
    from django.db import connections

    try:
        alias = settings().database
    except TenureError as exc:
        return [checks.Error(str(exc), id="tenure.E003")]
    if alias not in connections:
        return [
            checks.Error(
                f"settings.TENURE['DATABASE'] is {alias!r}, which is not in DATABASES",
                id="tenure.E001",
            )
        ]
    problem = backend_problem(connections[alias])
    if problem is None:
        return []
    code = "tenure.E001" if connections[alias].vendor != "postgresql" else "tenure.E002"
    return [checks.Error(problem, id=code)]


def check_schema(
    app_configs: Sequence[Any] | None = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[Any]:
    try:
        config = settings()
    except TenureError:
        return []  # reported by check_backend
    if databases is None or config.database not in databases:
        return []
    if check_backend():
        return []
    from ...leases._sync.client import connect

    try:
        with connect(conninfo(config.database), schema=config.schema, pool_size=1) as client:
            version = client.schema_version()
    except TenureError as exc:
        return [checks.Warning(f"cannot check tenure's schema: {exc}", id="tenure.W001")]
    if version is None or version < latest():
        found = "missing" if version is None else f"at version {version}"
        return [
            checks.Warning(
                f"tenure's schema {config.schema!r} is {found}; this tenure needs version "
                f"{latest()}",
                hint="run `python manage.py tenure_migrate`",
                id="tenure.W001",
            )
        ]
    return []


def register() -> None:
    checks.register(check_backend, checks.Tags.compatibility)
    checks.register(check_schema, checks.Tags.database)
