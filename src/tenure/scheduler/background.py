"""The worker's two background tasks: listening for changes that should wake its claim loop,
and pruning old run history."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from ..db.dsn import resolve
from ..db.pruning import prune_async, prune_forever
from ..db.retention import BATCH, PAUSE, WORKER_TABLES, Retention
from ..db.timeouts import CONNECTION_KWARGS

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient

log = logging.getLogger("tenure.scheduler")


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


async def prune(client: AsyncClient, retention: Retention) -> None:
    """Every few minutes (the first time at a random moment, so workers started together do
    not prune together), a retention pass over every table of the schema: the run
    histories, completed slots, delivered outbox messages and the inbox (see
    :mod:`tenure.db.retention`)."""
    await prune_forever(client, retention, tables=WORKER_TABLES, who="worker")


async def prune_once(client: AsyncClient, retention: dt.timedelta, *, batch: int = BATCH) -> int:
    """Delete finished run history older than ``retention``: batch after batch until a batch
    comes back short, so a pass keeps up however fast history grows, while each statement
    stays short (its rows locked briefly, skipped by a concurrent pruner). Returns how many
    rows were deleted."""
    counts = await prune_async(
        client, Retention.of(retention), tables=("job_runs",), batch=batch, pause=PAUSE
    )
    return counts["job_runs"]
