"""A relay's presence: it registers the topics it handles in ``outbox_relays`` and renews
that row every few seconds (it lasts :data:`BEAT_TTL`); it deletes it when it stops.
Pending messages whose topic no live relay lists are counted
(:func:`tenure.outbox.unhandled`, ``tenure outbox list``, the
``tenure_outbox_unhandled_messages`` gauge), and each relay logs "no relay handles topic X"
for them, at most every :data:`UNHANDLED_LOG_EVERY` seconds per topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence

from ..errors import DatabaseError
from ..leases._async.client import AsyncClient
from ._async.store import unhandled_async

log = logging.getLogger("tenure.relay")

#: How long a relay's registration lasts without a beat; it beats every third of that.
BEAT_TTL = 30.0
#: A topic nobody handles is logged again at most this often (per relay).
UNHANDLED_LOG_EVERY = 300.0


class Presence:
    """One relay's row in ``outbox_relays``, and its reports of unhandled topics."""

    def __init__(self, client: AsyncClient, relay: uuid.UUID, topics: Sequence[str]) -> None:
        self._client = client
        self._relay = relay
        self._topics = list(topics)
        self._unhandled_logged: dict[str, float] = {}

    async def beat(self) -> None:
        await self._client.fetch(
            "outbox_relay_beat",
            {
                "relay": self._relay,
                "topics": self._topics,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "ttl": dt.timedelta(seconds=BEAT_TTL),
            },
            doing="registering the relay's topics",
            wrote=True,
        )

    async def leave(self) -> None:
        with contextlib.suppress(DatabaseError):
            await self._client.fetch(
                "outbox_relay_leave",
                {"relay": self._relay},
                doing="unregistering the relay",
                wrote=True,
            )

    async def beat_forever(self) -> None:
        """Renew the registration, and report topics that no relay handles."""
        # Any error is logged and the loop goes on: a relay whose beat stopped would be
        # reported as gone (its topics as unhandled) while it still delivers.
        while True:
            try:
                await self._report_unhandled()
            except Exception as exc:
                log.warning("relay %s: cannot read unhandled topics (%s)", self._relay, exc)
            await asyncio.sleep(BEAT_TTL / 3)
            try:
                await self.beat()
            except Exception as exc:
                log.warning("relay %s: cannot renew its registration (%s)", self._relay, exc)

    async def _report_unhandled(self) -> None:
        now = time.monotonic()
        found = await unhandled_async(self._client)
        for item in found:
            last = self._unhandled_logged.get(item.topic)
            if last is not None and now - last < UNHANDLED_LOG_EVERY:
                continue
            self._unhandled_logged[item.topic] = now
            log.warning(
                "no relay handles topic %r, oldest %.1f min: %d message(s) waiting; start a "
                "relay with a handler for it (--webhook %s=URL or --handlers MODULE:ATTR)",
                item.topic,
                item.oldest_age / 60,
                item.pending,
                item.topic,
                extra={"job": item.topic, "outcome": "unhandled"},
            )
        current = {item.topic for item in found}
        for topic in list(self._unhandled_logged):
            if topic not in current:
                del self._unhandled_logged[topic]
