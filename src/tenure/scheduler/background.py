"""The worker's two background tasks: listening for changes that should wake its claim loop,
and pruning old run history."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from ..db.dsn import resolve
from ..db.timeouts import CONNECTION_KWARGS
from ..errors import TenureError

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient

log = logging.getLogger("tenure.scheduler")

#: How often each worker prunes run history (jittered), how many rows one statement deletes,
#: and the pause between two batches of one pass (claims and finishes run in between).
PRUNE_EVERY = 600.0
PRUNE_BATCH = 5000
PRUNE_PAUSE = 0.05


async def listen(
    dsn: str | None,
    channel: str,
    wake: asyncio.Event,
    *,
    application_name: str,
    safety_net: float,
) -> None:
    """Set ``wake`` on every notification on ``channel``, on a dedicated connection (a
    pooled one could not wait in LISTEN). Reconnects with backoff up to ``safety_net``
    seconds, forever; meanwhile the claim loop looks for due jobs at least that often."""
    conninfo, _source = resolve(dsn)
    delay = 0.5
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(
                conninfo, **{**CONNECTION_KWARGS, "application_name": application_name}
            )
            try:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                wake.set()  # catch up with anything missed while not listening
                delay = 0.5
                async for _note in conn.notifies():
                    wake.set()
            finally:
                await conn.close()
        except (psycopg.Error, OSError) as exc:
            log.warning(
                "listening for schedule changes failed (%s); retrying in %.1fs, meanwhile "
                "looking for due jobs at least every %.0fs",
                exc,
                delay,
                safety_net,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, safety_net)


async def prune(client: AsyncClient, retention: dt.timedelta) -> None:
    """Every :data:`PRUNE_EVERY` seconds (the first time at a random moment, so workers
    started together do not prune together), :func:`prune_once`."""
    await asyncio.sleep(random.uniform(1.0, 30.0))
    while True:
        try:
            deleted = await prune_once(client, retention)
            if deleted:
                log.info("pruned %d run history rows older than %s", deleted, retention)
        except TenureError as exc:
            log.warning("pruning run history failed: %s", exc)
        await asyncio.sleep(PRUNE_EVERY * random.uniform(0.9, 1.1))


async def prune_once(
    client: AsyncClient, retention: dt.timedelta, *, batch: int = PRUNE_BATCH
) -> int:
    """Delete finished run history older than ``retention``: batch after batch until a batch
    comes back short, so a pass keeps up however fast history grows, while each statement
    stays short (its rows locked briefly, skipped by a concurrent pruner). Returns how many
    rows were deleted."""
    total = 0
    while True:
        rows = await client._fetch(
            "sched_prune",
            {"retention": retention, "batch": batch},
            doing="pruning run history",
            wrote=True,
        )
        deleted = int(rows[0][0]) if rows else 0
        total += deleted
        if deleted < batch:
            return total
        await asyncio.sleep(PRUNE_PAUSE)
