# WARNING: this file is generated from src/tenure/leases/_async/waiter.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""Waiting for a busy lease without polling it.

``client.lease(key, wait=...)`` (and ``tenure exec --wait``) first asks once; when the lease
is busy it LISTENs on the schema's lease channel on a connection of its own, asks again (a
release between the first answer and the LISTEN would otherwise go unnoticed), and then
sleeps until whichever comes first:

* the holder releases the lease: the release statement notifies the channel at commit with
  the job key as payload (``release`` and ``force_release`` in ``db/sql/queries.sql``);
* the lease expires by the database clock: a busy answer says how long it has left
  (``retry_after``), so a waiter behind a holder that died wakes at its expiry, not after a
  poll interval. A holder that keeps renewing moves the expiry; the next busy answer says so.

So a waiter sends one statement per release of its key and one per expiry it was told, and
none in between. Where neither can be trusted (the expiry is unknown because the previous
holder's fenced transaction is still open, or LISTEN failed, e.g. behind PgBouncer in
transaction mode) it polls with a backoff up to :data:`POLL` seconds, as before.

It LISTENs like every other listener (:func:`tenure.db._async.listener.listen_on`) but not
through the reconnecting loop of :mod:`tenure.db.notifier`: a wait is short and asks the
database again after every wake-up, so a lost connection needs no reconnect, only the
fallback it already has (ask again now, then poll).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import Connection

from ..._compat import monotonic, sleep
from ...db._sync.listener import listen_on

log = logging.getLogger("tenure.lease")
#: Longest pause between two attempts when no notification or expiry can be relied on.
POLL = 0.5
#: First pause of that backoff.
FIRST_POLL = 0.05
#: Asked again this long after the expiry it was told: takeover needs ``lease_until <
#: clock_timestamp()``, strictly.
EXPIRY_SLACK = 0.002


class ReleaseWaiter:
    """Sleeps until a lease is released or expires (see the module's text)."""

    def __init__(self, conn: Connection[Any] | None, job_key: str) -> None:
        self._conn = conn
        self.job_key = job_key
        self._poll = FIRST_POLL

    @classmethod
    def start(
        cls, conninfo: str, kwargs: dict[str, Any], channel: str, job_key: str
    ) -> ReleaseWaiter:
        """LISTEN on ``channel`` on a new connection; a waiter that polls if that fails."""
        try:
            conn = listen_on(conninfo, [channel], kwargs)
        except psycopg.Error as exc:
            log.debug("cannot listen for releases of %r, polling: %s", job_key, exc)
            return cls(None, job_key)
        return cls(conn, job_key)

    @property
    def listening(self) -> bool:
        return self._conn is not None

    def pause(self, retry_after: float | None) -> float:
        """Seconds to sleep before asking again, after a busy answer with ``retry_after``."""
        expiry = None if retry_after is None else max(retry_after, 0.0) + EXPIRY_SLACK
        if expiry is not None and self._conn is not None:
            return expiry  # a release wakes us earlier
        poll = self._poll
        self._poll = min(self._poll * 2, POLL)
        return poll if expiry is None else min(poll, expiry)

    def wait(self, timeout: float) -> None:
        """Return when the lease is released, or after ``timeout`` seconds."""
        if timeout <= 0:
            return
        if self._conn is None:
            sleep(timeout)
            return
        end = monotonic() + timeout
        try:
            while True:
                left = end - monotonic()
                if left <= 0:
                    return
                for note in self._conn.notifies(timeout=left, stop_after=1):
                    if note.payload == self.job_key:
                        return
        except psycopg.Error as exc:
            # Ask again now; from here on the waiter polls.
            log.debug("listening for releases of %r failed, polling: %s", self.job_key, exc)
            self.close()

    def close(self) -> None:
        conn, self._conn = (self._conn, None)
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                log.debug("closing the listening connection failed", exc_info=True)
