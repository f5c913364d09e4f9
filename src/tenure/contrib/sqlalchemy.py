"""Fenced work in a SQLAlchemy 2.x transaction (``pip install tenure[sqlalchemy]``).

::

    from tenure.contrib.sqlalchemy import fence, outbox_enqueue

    with Session(engine) as session, session.begin():
        session.add(Invoice(number="A-17"))
        fence(session, "sync-invoices", token)          # raises StaleTokenError if stale
        outbox_enqueue(session, "invoices", "A-17", {"number": "A-17"})

``fence`` and ``outbox_enqueue`` run on the very connection of the session's current
transaction (starting it if needed, as any statement would), so the ORM's writes, flushed
before or at commit, commit together with the fence or not at all. The engine must use the
psycopg 3 driver (``postgresql+psycopg://``) and reach the database that holds the tenure
schema (strict fencing; see :func:`tenure.fence` for the relaxed mode).

``Session`` and ``Connection`` take the plain functions; ``AsyncSession`` and
``AsyncConnection`` (``create_async_engine("postgresql+psycopg://...")``) the ``_async`` ones.

When "before or after your other writes" holds: whenever the fence and those writes are in
the same database transaction, i.e. between ``session.begin()`` (or a Connection's first
statement) and its commit. The ORM flushes pending objects at the latest at commit, in that
transaction, so adding them before or after ``fence()`` is the same. It does not hold across a
commit: ``session.commit()`` or ``conn.commit()`` ends the fence with its transaction, and
writes after it need a new ``fence()``. It never holds on an ``isolation_level="AUTOCOMMIT"``
engine or connection: every statement commits on its own, so a write made before ``fence()``
is committed before the fence is even asked, and nothing can be rolled back when it refuses.
``fence()`` and ``outbox_enqueue()`` therefore refuse such a session or connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from .. import outbox
from ..errors import ConfigurationError, InvalidArgument
from ..leases._async.fencing import fence_async as _fence_async
from ..leases._sync.fencing import fence as _fence
from ..validation import Duration

if TYPE_CHECKING:
    # Not at run time: sqlalchemy.ext.asyncio needs greenlet, which sync users may not have.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

SyncBind = Session | Connection
C = TypeVar("C", psycopg.Connection[Any], psycopg.AsyncConnection[Any])


def driver_connection(bind: SyncBind) -> psycopg.Connection[Any]:
    """The psycopg connection under ``bind``'s current transaction (begun if it was not)."""
    if type(bind).__module__.startswith("sqlalchemy.ext.asyncio"):
        raise InvalidArgument(
            f"{type(bind).__name__} is asyncio: use `await fence_async(...)` / "
            "`await outbox_enqueue_async(...)` from tenure.contrib.sqlalchemy"
        )
    if isinstance(bind, Session):
        conn = bind.connection()  # begins the session's transaction, as a query would
    elif isinstance(bind, Connection):
        conn = bind
        if not conn.in_transaction():
            conn.begin()  # what "commit as you go" does on the first statement
    else:
        raise InvalidArgument(
            f"expected a SQLAlchemy Session or Connection, got {type(bind).__name__}"
        )
    return _transactional(
        _psycopg(conn.connection.driver_connection, psycopg.Connection, conn.dialect.name), bind
    )


async def driver_connection_async(
    bind: AsyncSession | AsyncConnection,
) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection under ``bind``'s current transaction (begun if needed)."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(bind, AsyncSession):
        conn = await bind.connection()
    elif isinstance(bind, AsyncConnection):
        conn = bind
        if not conn.in_transaction():
            await conn.begin()
    else:
        raise InvalidArgument(
            f"expected a SQLAlchemy AsyncSession or AsyncConnection, got {type(bind).__name__}"
            " (for Session and Connection use fence / outbox_enqueue)"
        )
    raw = await conn.get_raw_connection()
    return _transactional(
        _psycopg(raw.driver_connection, psycopg.AsyncConnection, conn.dialect.name), bind
    )


def _transactional(driver: C, bind: object) -> C:
    """``driver``, unless SQLAlchemy runs it in AUTOCOMMIT (psycopg's autocommit underneath):
    there is no transaction for the fence to hold, and writes already made are committed."""
    if driver.autocommit:
        raise InvalidArgument(
            f"this SQLAlchemy {type(bind).__name__} uses isolation_level='AUTOCOMMIT': each "
            "statement commits on its own, so writes made before this call are already committed "
            "and a refused fence could not roll them back; use an engine without "
            "isolation_level='AUTOCOMMIT' (or conn.execution_options(isolation_level="
            "'READ COMMITTED')) and fence inside `with Session(engine) as session, "
            "session.begin():`"
        )
    return driver


def _psycopg(driver: object, expected: type[C], dialect: str) -> C:
    if not isinstance(driver, expected):
        raise ConfigurationError(
            f"tenure needs SQLAlchemy's psycopg 3 driver, but this engine uses "
            f"{dialect} with {type(driver).__module__}.{type(driver).__name__}: create it "
            "with a postgresql+psycopg:// URL (pip install 'psycopg[binary]')"
        )
    return driver


def fence(
    bind: SyncBind,
    job_key: str,
    token: int,
    *,
    schema: str = "tenure",
    strict: bool = True,
    idle_timeout: Duration | bool | None = None,
) -> None:
    """:func:`tenure.fence` on the session's (or connection's) current transaction: its
    writes commit only while ``token`` is the newest. Raises
    :class:`~tenure.StaleTokenError` otherwise; roll back then (leaving ``session.begin()``
    by the exception does).

    Call it before or after your other writes *in the same transaction* (see the module's
    docstring: not across a commit). A session or connection in AUTOCOMMIT is refused
    (:class:`~tenure.InvalidArgument`): it has no transaction to fence."""
    _fence(
        driver_connection(bind),
        job_key,
        token,
        schema=schema,
        strict=strict,
        idle_timeout=idle_timeout,
    )


async def fence_async(
    bind: AsyncSession | AsyncConnection,
    job_key: str,
    token: int,
    *,
    schema: str = "tenure",
    strict: bool = True,
    idle_timeout: Duration | bool | None = None,
) -> None:
    """:func:`fence` for ``AsyncSession`` and ``AsyncConnection``."""
    await _fence_async(
        await driver_connection_async(bind),
        job_key,
        token,
        schema=schema,
        strict=strict,
        idle_timeout=idle_timeout,
    )


def outbox_enqueue(
    bind: SyncBind,
    topic: str,
    key: str,
    payload: Any,
    *,
    order_key: str | None = None,
    job_key: str | None = None,
    token: int | None = None,
    schema: str = "tenure",
) -> bool:
    """:func:`tenure.outbox.enqueue` in the session's current transaction: the message
    exists only if that transaction commits. True for a new message, False if ``(topic,
    key)`` was already enqueued."""
    return outbox.enqueue(
        driver_connection(bind),
        topic,
        key,
        payload,
        order_key=order_key,
        job_key=job_key,
        token=token,
        schema=schema,
    )


async def outbox_enqueue_async(
    bind: AsyncSession | AsyncConnection,
    topic: str,
    key: str,
    payload: Any,
    *,
    order_key: str | None = None,
    job_key: str | None = None,
    token: int | None = None,
    schema: str = "tenure",
) -> bool:
    """:func:`outbox_enqueue` for ``AsyncSession`` and ``AsyncConnection``."""
    return await outbox.enqueue_async(
        await driver_connection_async(bind),
        topic,
        key,
        payload,
        order_key=order_key,
        job_key=job_key,
        token=token,
        schema=schema,
    )


__all__ = [
    "driver_connection",
    "driver_connection_async",
    "fence",
    "fence_async",
    "outbox_enqueue",
    "outbox_enqueue_async",
]
