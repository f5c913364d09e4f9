"""The worker's two background tasks: listening for changes that should wake its claim loop,
and pruning old run history."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING

from ..db.dsn import resolve
from ..db.notifier import Retry, listen_forever
from ..db.pruning import prune_async, prune_forever
from ..db.retention import BATCH, PAUSE, WORKER_TABLES, Retention

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
    """Set ``wake`` on every notification on ``channel`` (and on every new LISTEN, to catch
    up with anything missed while not listening), through the reconnecting loop of
    :mod:`tenure.db.notifier`: it retries with backoff up to ``safety_net`` seconds,
    forever; meanwhile the claim loop looks for due jobs at least that often."""
    conninfo, _source = resolve(dsn)

    def lost(exc: Exception, pause: float) -> None:
        log.warning(
            "listening for schedule changes failed (%s); retrying in %.1fs, meanwhile "
            "looking for due jobs at least every %.0fs",
            exc,
            pause,
            safety_net,
        )

    await listen_forever(
        conninfo,
        [channel],
        lambda _note: wake.set(),
        application_name=application_name,
        on_listening=lambda _reconnected: wake.set(),
        on_lost=lost,
        retry=Retry(most=safety_net),
    )


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
