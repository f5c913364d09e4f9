"""Is a pooled connection still there? A look at its socket, without a round trip.

A connection that sat idle in a pool may have been closed by the other side meanwhile: a
server restart or ``pg_terminate_backend`` (the server sends a FATAL message, then closes),
PgBouncer's ``client_idle_timeout``, a cloud proxy or NAT dropping idle connections (a FIN
or a RST). Nothing was sent on it yet, so a statement that fails on it could not have
committed; but once the statement is sent, a failure is an unknown outcome. So the pool
looks before handing a connection out: an idle connection has nothing to read, unless the
server said something unprompted, which for tenure's connections (no LISTEN, no
notices expected) means it is going away. A readable idle socket is discarded; the statement
then runs on a fresh connection.

The look is one ``poll()`` with a zero timeout: no round trip, no wait. A connection that
dies between the look and the statement still fails as an unknown outcome: nothing can tell
those apart.
"""

from __future__ import annotations

import select
from typing import Any

from psycopg import BaseConnection, pq

_EVENTS = select.POLLIN | select.POLLERR | select.POLLHUP if hasattr(select, "poll") else 0


def closed_while_idle(conn: BaseConnection[Any]) -> bool:
    """True if ``conn`` (an idle psycopg connection, sync or async) is broken, or the server
    sent something while it was idle (a FATAL message, end of stream, a reset)."""
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return True
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False  # not idle: whatever is pending belongs to a statement
    try:
        fd = pgconn.socket
    except Exception:  # psycopg raises OperationalError when there is no socket
        return True
    if _EVENTS:
        poller = select.poll()
        poller.register(fd, _EVENTS)
        return bool(poller.poll(0))
    readable, _, errored = select.select([fd], [], [fd], 0)  # pragma: no cover - no poll()
    return bool(readable or errored)
