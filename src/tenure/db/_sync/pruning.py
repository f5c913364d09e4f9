# WARNING: this file is generated from src/tenure/db/_async/pruning.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""One retention pass, written once as asyncio code (``db/_sync/pruning.py`` is generated
from it). What is pruned and why it is safe: :mod:`tenure.db.retention`."""

from __future__ import annotations

from collections.abc import Iterable

from ..._compat import sleep
from ...errors import TenureError
from ..executor import Executor
from ..retention import BATCH, NAMES, PAUSE, Retention, check_batch, deleted, tables_named


def prune(
    client: Executor,
    retention: Retention,
    *,
    tables: Iterable[str] = NAMES,
    batch: int = BATCH,
    pause: float = PAUSE,
    max_batches: int | None = None,
    failed: dict[str, TenureError] | None = None,
) -> dict[str, int]:
    """One pass: per table, delete batch after batch of rows past the retention until a
    batch comes back short (or ``max_batches``). Returns the rows deleted per table.

    ``failed``: collect a table's error there and go on with the next table (a role without
    DELETE on it, a schema not migrated yet) instead of raising."""
    batch = check_batch(batch)
    counts: dict[str, int] = {}
    for table in tables_named(tables):
        total = batches = 0
        try:
            while True:
                rows = client.fetch(
                    table.query,
                    retention.params(table, batch),
                    doing=f"pruning {table.name}",
                    wrote=True,
                )
                gone = deleted(rows)
                total += gone
                batches += 1
                if gone < batch or (max_batches is not None and batches >= max_batches):
                    break
                sleep(pause)
        except TenureError as exc:
            if failed is None:
                raise
            failed[table.name] = exc
        counts[table.name] = total
    return counts
