"""The door to the database: how code above the lease core runs a named statement.

Every package above :mod:`tenure.leases` (the scheduler, the outbox, exec, the dashboard,
the exporter, ``tenure verify``) talks to PostgreSQL through these methods of a lease client
(:class:`~tenure.Client` and :class:`~tenure.AsyncClient` implement them), never through the
client's pool or its private helpers:

* :meth:`~Executor.fetch`: one named statement (``db/sql/*.sql``) on a pooled autocommit
  connection, the rows as the statement's row type (``row=``, :mod:`tenure.db.rows`) or as
  tuples in its column order; errors translated to :class:`~tenure.TenureError`
  (``wrote=True``: a lost connection may have committed it).
* :meth:`~Executor.fetch_one`: the same, the first row or None.
* :meth:`~Executor.fetch_sized`: a statement whose work grows with its input, in its own
  transaction with longer timeouts, one at a time per ``serialize`` name in the schema.
* :meth:`~Executor.fenced`: a transaction on a pooled connection, already fenced with
  ``(job_key, token)`` (strict): the caller's writes on it commit only if the token is still
  the newest.
* :meth:`~Executor.connection`: a pooled connection for statements that are not named
  (a test's or a tool's setup).
* :attr:`~Executor.conninfo`: what the pool connects with, for a process or a listening
  connection of its own.

The Protocols are what a function that only runs statements asks for (``db/pruning.py``);
most callers name the client class itself.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol, TypeVar, overload

from psycopg import AsyncConnection, Connection

#: A row as it comes back: the statement's columns in order.
Row = tuple[Any, ...]
#: A row type (:mod:`tenure.db.rows`): a NamedTuple of the statement's columns.
R = TypeVar("R", bound=tuple[Any, ...])


def typed(rows: list[Row], row: type[R]) -> list[R]:
    """``rows`` as ``row`` records: what ``row._make`` does, without its length check (the
    row types test compares each row type with its statement's columns)."""
    new = tuple.__new__
    return [new(row, r) for r in rows]


class AsyncExecutor(Protocol):
    """The asyncio door (implemented by :class:`~tenure.AsyncClient`)."""

    @property
    def schema(self) -> str: ...

    @property
    def conninfo(self) -> str | None: ...

    @overload
    async def fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> list[Row]: ...

    @overload
    async def fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False, row: type[R]
    ) -> list[R]: ...

    @overload
    async def fetch_one(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> Row | None: ...

    @overload
    async def fetch_one(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False, row: type[R]
    ) -> R | None: ...

    @overload
    async def fetch_sized(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        seconds: float,
        serialize: str,
        wrote: bool = False,
    ) -> list[Row]: ...

    @overload
    async def fetch_sized(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        seconds: float,
        serialize: str,
        wrote: bool = False,
        row: type[R],
    ) -> list[R]: ...

    def fenced(
        self, job_key: str, token: int
    ) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...


class Executor(Protocol):
    """The blocking door (implemented by :class:`~tenure.Client`)."""

    @property
    def schema(self) -> str: ...

    @property
    def conninfo(self) -> str | None: ...

    @overload
    def fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> list[Row]: ...

    @overload
    def fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False, row: type[R]
    ) -> list[R]: ...

    @overload
    def fetch_one(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> Row | None: ...

    @overload
    def fetch_one(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False, row: type[R]
    ) -> R | None: ...

    @overload
    def fetch_sized(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        seconds: float,
        serialize: str,
        wrote: bool = False,
    ) -> list[Row]: ...

    @overload
    def fetch_sized(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        seconds: float,
        serialize: str,
        wrote: bool = False,
        row: type[R],
    ) -> list[R]: ...

    def fenced(self, job_key: str, token: int) -> AbstractContextManager[Connection[Any]]: ...

    def connection(self) -> AbstractContextManager[Connection[Any]]: ...


__all__ = ["AsyncExecutor", "Executor", "R", "Row", "typed"]
