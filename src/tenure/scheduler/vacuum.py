"""Vacuuming the scheduler's hot tables from the workers.

Every run updates its job row in ``scheduled_jobs`` three times (claim, start, finish), and
each update moves ``due_at``, so none of them is heap-only: each leaves a dead row version and
a dead entry in the ``scheduled_jobs_due`` index. Those entries sit in the past part of the
index, which every claim's range scan (``due_at <= now``) walks, and only VACUUM removes them
(the claim's bitmap scan never marks them dead). At 5,000 runs/s that is 15,000 dead entries a
second: without a vacuum, claims went from 9 to 40 ms within 150 s, and lateness with them
(bench/README.md, "Fifth pass"). Autovacuum does not keep up with such a small, hot table
with its defaults (it looks at most once a minute, ``autovacuum_naptime``) and may be off.

So a worker checks every ``vacuum_every`` seconds (``Scheduler(vacuum_every=...)``, ``tenure
worker --vacuum-every``, default :data:`DEFAULT_EVERY`) whether these tables have gathered
:data:`MIN_DEAD_ROWS` dead rows and were not vacuumed in that time by anyone, and vacuums
them if so: a few milliseconds for tables of one row per job. VACUUM changes no row any
statement can see, so no guarantee depends on it (docs/safety.md).

A role that may not vacuum them (not their owner, e.g. the role `tenure grants` sets up) says
so once and leaves them to autovacuum.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from typing import TYPE_CHECKING

from ..errors import TenureError

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient

log = logging.getLogger("tenure.scheduler")

#: Seconds between a worker's looks at the hot tables' dead rows.
DEFAULT_EVERY = 5.0
#: Dead rows in one of the hot tables that make a vacuum worth its cost.
MIN_DEAD_ROWS = 1000


def due_params(schema: str, every: float) -> dict[str, object]:
    """The parameters of ``sched_vacuum_due`` (read at each call: tests lower the threshold)."""
    return {"schema": schema, "min_dead": MIN_DEAD_ROWS, "every": dt.timedelta(seconds=every)}


async def vacuum_forever(client: AsyncClient, every: float, *, who: str) -> None:
    """Every ``every`` seconds (jittered, so workers started together do not look together),
    vacuum the hot tables if they are due (see the module). Failures are logged once per
    reason and retried at the next look; they never stop the worker."""
    warned = ""
    while True:
        await asyncio.sleep(every * random.uniform(0.9, 1.1))
        params = due_params(client.schema, every)
        try:
            [(due, permitted, _tables)] = await client.fetch(
                "sched_vacuum_due", params, doing="checking the scheduler tables' dead rows"
            )
            if due and not permitted:
                log.info(
                    "%s: this role may not vacuum the scheduler tables of schema %r (they are "
                    "not its own), so it leaves them to autovacuum; their dead rows slow the "
                    "claims of a busy scheduler unless autovacuum runs often "
                    "(docs/retention.md, 'Vacuum')",
                    who,
                    client.schema,
                )
                return
            if due:
                began = time.monotonic()
                await client.fetch("sched_vacuum", {}, doing="vacuuming the scheduler tables")
                log.debug(
                    "%s vacuumed the scheduler tables in %.1f ms",
                    who,
                    (time.monotonic() - began) * 1000,
                )
            warned = ""
        except TenureError as error:
            level = logging.DEBUG if warned == str(error) else logging.WARNING
            log.log(level, "%s could not vacuum the scheduler tables (retried): %s", who, error)
            warned = str(error)
