"""The one LISTEN: a dedicated connection listening on some channels, written once as asyncio
code (``db/_sync/listener.py`` is generated from it).

A pooled connection cannot wait in LISTEN (it goes back to the pool, and PgBouncer in
transaction mode does not forward notifications at all), so every listener has a connection
of its own. :mod:`tenure.db.notifier` keeps one open forever, reconnecting; the lease waiter
(``leases/*/waiter.py``) opens one per wait.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection, sql


async def listen_on(
    conninfo: str, channels: Iterable[str], kwargs: dict[str, Any]
) -> AsyncConnection[Any]:
    """A new autocommit connection (``kwargs`` as for ``connect``) listening on every one of
    ``channels``. Raises psycopg's error if it cannot connect or LISTEN (then nothing is left
    open)."""
    conn = await AsyncConnection.connect(conninfo, **{**kwargs, "autocommit": True})
    try:
        for name in channels:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
    except BaseException:
        await conn.close()
        raise
    return conn
