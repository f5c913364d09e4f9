"""The one reconnecting LISTEN loop: the scheduler's wake-ups, the relay's, the dashboard's
live stream.

:func:`listen_forever` keeps a dedicated connection (:func:`tenure.db._async.listener.listen_on`)
listening on some channels, hands every notification to a callback, and when the
connection fails (the server restarted, the backend was terminated, the network went away)
reconnects with a doubling pause, forever, until it is cancelled. A notification sent while
no connection listened is lost, so each new LISTEN is reported (``on_listening``) and the
user catches up then: the worker and the relay look for due work, the dashboard tells its
pages that anything may have changed.

While nothing arrives it asks the connection ``SELECT 1`` every ``check_every`` seconds: a
connection that died without a word (TCP keepalives aside) is noticed then, not never.

The lease waiter (``leases/*/waiter.py``) is the one listener that does not use this loop:
it listens for one wait, then closes; it asks the database again after any notification of
its key or when the holder's expiry comes, and it polls where listening fails, so a
reconnect would only add a second fallback beside the one it has. It uses the same LISTEN
(``listen_on``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import Notify

from ._async.listener import listen_on
from .timeouts import CONNECTION_KWARGS


@dataclass(frozen=True, slots=True)
class Retry:
    """Pauses between reconnection attempts: ``first``, doubling up to ``most`` seconds."""

    first: float = 0.5
    most: float = 30.0

    def after(self, pause: float) -> float:
        return min(pause * 2, self.most)


async def listen_forever(
    conninfo: str,
    channels: Sequence[str],
    on_note: Callable[[Notify], None],
    *,
    application_name: str,
    on_listening: Callable[[bool], None] | None = None,
    on_lost: Callable[[Exception, float], None] | None = None,
    retry: Retry = Retry(),
    check_every: float = 30.0,
) -> None:
    """Listen on ``channels`` until cancelled; call ``on_note`` for every notification.

    ``on_listening(reconnected)`` is called each time LISTEN is in place (``reconnected``:
    not the first time, so notifications may have been missed); ``on_lost(error, pause)``
    when connecting, listening or the connection failed, before waiting ``pause`` seconds
    to try again."""
    kwargs: dict[str, Any] = {**CONNECTION_KWARGS, "application_name": application_name}
    pause = retry.first
    reconnected = False
    while True:
        try:
            conn = await listen_on(conninfo, channels, kwargs)
            async with conn:
                pause = retry.first
                if on_listening is not None:
                    on_listening(reconnected)
                reconnected = True
                await _pump(conn, on_note, check_every)
        except (psycopg.Error, OSError) as exc:
            reconnected = True
            if on_lost is not None:
                on_lost(exc, pause)
        await asyncio.sleep(pause)
        pause = retry.after(pause)


async def _pump(
    conn: psycopg.AsyncConnection[Any], on_note: Callable[[Notify], None], check_every: float
) -> None:
    while True:
        heard = False
        async for note in conn.notifies(timeout=check_every):
            heard = True
            on_note(note)
        if not heard:
            await conn.execute(b"SELECT 1")  # the connection still answers
