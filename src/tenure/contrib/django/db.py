"""The project's database, as tenure uses it: settings, a libpq conninfo from a ``DATABASES``
alias, and fenced writes on Django's own connection inside ``transaction.atomic()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import make_conninfo

from ... import outbox
from ...errors import ConfigurationError, InvalidArgument
from ...leases._sync.fencing import fence as _fence
from ...validation import Duration, check_schema

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


@dataclass(frozen=True, slots=True)
class Settings:
    """``settings.TENURE``: which ``DATABASES`` alias holds the leases, and tenure's schema."""

    database: str = "default"
    schema: str = "tenure"


def settings() -> Settings:
    from django.conf import settings as django_settings

    raw = getattr(django_settings, "TENURE", {}) or {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"settings.TENURE must be a dict, got {type(raw).__name__}")
    unknown = set(raw) - {"DATABASE", "SCHEMA"}
    if unknown:
        raise ConfigurationError(
            f"settings.TENURE has unknown keys {sorted(unknown)}; it takes DATABASE and SCHEMA"
        )
    found = Settings(raw.get("DATABASE", "default"), raw.get("SCHEMA", "tenure"))
    try:
        check_schema(found.schema)
    except InvalidArgument as exc:
        raise ConfigurationError(f"settings.TENURE['SCHEMA']: {exc}") from None
    return found


def connection(using: str | None = None) -> BaseDatabaseWrapper:
    """Django's connection for ``using`` (default: ``TENURE["DATABASE"]``), checked to be
    PostgreSQL on psycopg 3."""
    from django.db import connections

    alias = using or settings().database
    if alias not in connections:
        raise ConfigurationError(f"no database {alias!r} in settings.DATABASES")
    conn = connections[alias]
    problem = backend_problem(conn)
    if problem:
        raise ConfigurationError(problem)
    return conn


def backend_problem(conn: BaseDatabaseWrapper) -> str | None:
    """Why tenure cannot use ``conn``'s backend, or None."""
    if conn.vendor != "postgresql":
        return (
            f"database {conn.alias!r} uses the {conn.vendor} backend; tenure needs PostgreSQL "
            "(ENGINE django.db.backends.postgresql)"
        )
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return (
            f"database {conn.alias!r} uses psycopg2; tenure needs psycopg 3: pip install "
            "'psycopg[binary]' (Django 4.2+ then prefers it over psycopg2)"
        )
    return None


def conninfo(using: str | None = None) -> str:
    """A libpq connection string for the ``DATABASES`` alias (``OPTIONS`` included)."""
    conn = connection(using)
    known = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
    params = {
        k: v
        for k, v in conn.get_connection_params().items()
        if k in known and v is not None and isinstance(v, str | int)
    }
    return make_conninfo("", **params)


def _driver(using: str | None, what: str) -> psycopg.Connection[Any]:
    conn = connection(using)
    if not conn.in_atomic_block:
        raise InvalidArgument(
            f"{what} must run inside transaction.atomic(using={conn.alias!r}): outside it, "
            "Django commits each statement on its own and the writes would not be fenced"
        )
    conn.ensure_connection()
    driver = conn.connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def fence(
    job_key: str,
    token: int,
    using: str | None = None,
    *,
    schema: str | None = None,
    strict: bool = True,
    idle_timeout: Duration | bool | None = None,
) -> None:
    """:func:`tenure.fence` on the current ``transaction.atomic()`` block of ``using``: its
    ORM writes commit only while ``token`` is the newest. Raises
    :class:`~tenure.StaleTokenError` otherwise, which rolls the block back as it leaves."""
    _fence(
        _driver(using, "fence()"),
        job_key,
        token,
        schema=schema or settings().schema,
        strict=strict,
        idle_timeout=idle_timeout,
    )


def outbox_enqueue(
    topic: str,
    key: str,
    payload: Any,
    using: str | None = None,
    *,
    order_key: str | None = None,
    job_key: str | None = None,
    token: int | None = None,
    schema: str | None = None,
) -> bool:
    """:func:`tenure.outbox.enqueue` in the current ``transaction.atomic()`` block: the
    message exists only if the block commits."""
    return outbox.enqueue(
        _driver(using, "outbox_enqueue()"),
        topic,
        key,
        payload,
        order_key=order_key,
        job_key=job_key,
        token=token,
        schema=schema or settings().schema,
    )
