"""Live updates: one LISTEN connection per dashboard, fanned out to every open page.

Two channels are heard: the scheduler's (:func:`tenure.db.channels.channel` ``jobs``: job
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

from psycopg import Notify

from ..db.channels import channel
from ..db.notifier import Retry, listen_forever

log = logging.getLogger("tenure.ui")

#: Notifications arriving within this many seconds reach a page as one event.
COALESCE = 0.25
#: Seconds between reconnection attempts after the LISTEN connection failed.
RETRY = 2.0


class Broker:
    """Listens while at least one page is subscribed; every subscriber gets a queue of the
    sets of job keys that changed (``{"*"}``: anything may have changed)."""

    def __init__(self, conninfo: str, schema: str) -> None:
        self._conninfo = conninfo
        # The dashboard's channel: the same rule as the trigger function in migration 6.
        self.channels = (channel("jobs", schema), channel("ui", schema))
        self._subscribers: set[asyncio.Queue[set[str]]] = set()
        self._task: asyncio.Task[None] | None = None
        self._pending: set[str] = set()
        self.listening = asyncio.Event()

    def subscribe(self) -> asyncio.Queue[set[str]]:
        queue: asyncio.Queue[set[str]] = asyncio.Queue(maxsize=16)
        self._subscribers.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="tenure-ui-listen")
        return queue

    def unsubscribe(self, queue: asyncio.Queue[set[str]]) -> None:
        self._subscribers.discard(queue)
        if not self._subscribers and self._task is not None:
            # Nobody left to tell: stop listening (the next subscriber starts again).
            self._task.cancel()
            self._task = None
            self.listening.clear()

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
        def listening(reconnected: bool) -> None:
            self.listening.set()
            if reconnected:
                self._publish({"*"})  # catch up with what was missed while down

        def lost(exc: Exception, pause: float) -> None:
            self.listening.clear()
            log.warning(
                "dashboard: listening for changes failed (%s); retrying in %.0fs",
                " ".join(str(exc).split()),
                pause,
            )

        await listen_forever(
            self._conninfo,
            self.channels,
            self._heard,
            application_name="tenure ui listen",
            on_listening=listening,
            on_lost=lost,
            retry=Retry(first=RETRY, most=RETRY),
        )

    def _heard(self, note: Notify) -> None:
        # Publish COALESCE seconds after the first notification, with whatever came since.
        first = not self._pending
        self._pending |= _keys(note.channel, note.payload, self.channels[1])
        if first:
            asyncio.get_running_loop().call_later(COALESCE, self._flush)

    def _flush(self) -> None:
        pending, self._pending = self._pending, set()
        if pending:
            self._publish(pending)


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
