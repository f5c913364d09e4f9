"""Retention passes: :func:`prune` (sync) and :func:`prune_async` from one source
(``db/_async/pruning.py``), the background loop workers and relays run
(:func:`prune_forever`), and ``tenure prune --dry-run``'s count (:func:`preview`). The policy,
what is pruned and why it is safe: :mod:`tenure.db.retention`."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
from collections.abc import Iterable

from ..errors import TenureError
from ._async.pruning import prune_async
from ._sync.pruning import prune
from .executor import AsyncExecutor, Executor
from .retention import EVERY, FIRST_WITHIN, NAMES, Retention, age_text

log = logging.getLogger("tenure.retention")


def preview(client: Executor, retention: Retention) -> dict[str, int]:
    """How many rows a pass would delete now, per table (``tenure prune --dry-run``)."""
    rows = client.fetch(
        "retention_preview",
        {
            "retention": dt.timedelta(seconds=retention.history),
            "inbox_retention": dt.timedelta(seconds=retention.inbox),
        },
        doing="counting the rows retention would prune",
    )
    return dict(zip(NAMES, (int(n) for n in rows[0]), strict=True))


def describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items())


async def prune_forever(
    client: AsyncExecutor, retention: Retention, *, tables: Iterable[str], who: str
) -> None:
    """Every :data:`EVERY` seconds (the first time at a random moment within
    :data:`FIRST_WITHIN` seconds, so processes started together do not prune together), a
    pass over ``tables``. Failures are logged, once per table and reason, and retried at the
    next pass; they never stop the process."""
    names = tuple(tables)
    warned: dict[str, str] = {}
    await asyncio.sleep(random.uniform(1.0, FIRST_WITHIN))
    while True:
        failed: dict[str, TenureError] = {}
        try:
            counts = await prune_async(client, retention, tables=names, failed=failed)
        except TenureError as error:  # a bad batch size; per-table errors are collected
            failed["*"] = error
            counts = {}
        if any(counts.values()):
            log.info(
                "%s pruned history older than %s (inbox %s): %s",
                who,
                age_text(retention.history),
                age_text(retention.inbox),
                describe(counts),
            )
        for name, problem in failed.items():
            level = logging.DEBUG if warned.get(name) == str(problem) else logging.WARNING
            log.log(
                level, "%s could not prune %s (retried in %.0fs): %s", who, name, EVERY, problem
            )
            warned[name] = str(problem)
        await asyncio.sleep(EVERY * random.uniform(0.9, 1.1))


__all__ = ["describe", "preview", "prune", "prune_async", "prune_forever"]
