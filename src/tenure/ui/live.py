"""Live updates: one LISTEN connection per dashboard, fanned out to every open page.

Two channels are heard: the scheduler's (:func:`tenure.scheduler.jobs.channel_name`: job
definitions, pause, resume, trigger, hand-overs) and the dashboard's own, which the
``job_runs`` triggers of migration 6 notify when runs end, are skipped, or have been running
for a second (their history row is written then: migration 12) (payload: a JSON array of job
keys, or ``*``). Pages get Server-Sent Events, at most one per
:data:`COALESCE` seconds, naming the keys that changed; the page then reloads its content.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import psycopg
from psycopg import sql

from ..db import channels
from ..db.timeouts import CONNECTION_KWARGS
from ..scheduler.jobs import channel_name as scheduler_channel

log = logging.getLogger("tenure.ui")

#: Notifications arriving within this many seconds reach a page as one event.
COALESCE = 0.25
#: Seconds between reconnection attempts after the LISTEN connection failed.
RETRY = 2.0


def channel_name(schema: str) -> str:
    """The dashboard's channel; the same rule as the trigger function in migration 6."""
    return channels.channel_name("tenure_ui", schema)


class Broker:
    """Listens while at least one page is subscribed; every subscriber gets a queue of the
    sets of job keys that changed (``{"*"}``: anything may have changed)."""

    def __init__(self, conninfo: str, schema: str) -> None:
        self._conninfo = conninfo
        self.channels = (scheduler_channel(schema), channel_name(schema))
        self._subscribers: set[asyncio.Queue[set[str]]] = set()
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    def subscribe(self) -> asyncio.Queue[set[str]]:
        queue: asyncio.Queue[set[str]] = asyncio.Queue(maxsize=16)
        self._subscribers.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="tenure-ui-listen")
        return queue

    def unsubscribe(self, queue: asyncio.Queue[set[str]]) -> None:
        self._subscribers.discard(queue)

    async def ready(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until LISTEN is in place."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.listening.wait()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _publish(self, keys: set[str]) -> None:
        for queue in list(self._subscribers):
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()  # a slow page gets the newest news, not a backlog
                keys = {"*"}
            queue.put_nowait(keys)

    async def _listen(self) -> None:
        reconnect = False
        while self._subscribers:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    **{**CONNECTION_KWARGS, "application_name": "tenure ui listen"},
                )
                async with conn:
                    for channel in self.channels:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.listening.set()
                    if reconnect:
                        self._publish({"*"})  # catch up with what was missed while down
                    reconnect = True
                    await self._pump(conn)
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                self.listening.clear()
                reconnect = True
                log.warning(
                    "dashboard: listening for changes failed (%s); retrying in %.0fs",
                    " ".join(str(exc).split()),
                    RETRY,
                )
                await asyncio.sleep(RETRY)

    async def _pump(self, conn: psycopg.AsyncConnection[Any]) -> None:
        loop = asyncio.get_running_loop()
        pending: set[str] = set()
        first = 0.0  # when the oldest pending notification arrived
        while self._subscribers:
            # Idle: wait long (waking now and then to notice that every page left). Once
            # something arrived: publish it COALESCE seconds later, with whatever came since.
            wait = max(0.0, first + COALESCE - loop.time()) if pending else 30.0
            got = False
            if wait > 0:
                async for note in conn.notifies(timeout=wait, stop_after=1):
                    if not pending:
                        first = loop.time()
                    pending |= _keys(note.channel, note.payload, self.channels[1])
                    got = True
            if pending and loop.time() >= first + COALESCE:
                self._publish(pending)
                pending = set()
            elif not got and not pending:
                await conn.execute(b"SELECT 1")  # the connection still answers


def _keys(channel: str, payload: str, ui_channel: str) -> set[str]:
    if channel != ui_channel:
        return {"*"}  # the scheduler's payloads name an event, not always a key
    if payload == "*":
        return {"*"}
    try:
        keys = json.loads(payload)
    except ValueError:
        return {"*"}
    return {str(k) for k in keys} if isinstance(keys, list) else {"*"}
