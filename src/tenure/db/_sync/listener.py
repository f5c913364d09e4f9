# WARNING: this file is generated from src/tenure/db/_async/listener.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
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

from psycopg import Connection, sql


def listen_on(conninfo: str, channels: Iterable[str], kwargs: dict[str, Any]) -> Connection[Any]:
    """A new autocommit connection (``kwargs`` as for ``connect``) listening on every one of
    ``channels``. Raises psycopg's error if it cannot connect or LISTEN (then nothing is left
    open)."""
    conn = Connection.connect(conninfo, **{**kwargs, "autocommit": True})
    try:
        for name in channels:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
    except BaseException:
        conn.close()
        raise
    return conn
