"""Retention: history older than an age is deleted, in short batches, by whoever runs anyway.

What is pruned (the statements are in ``sql/retention.sql`` and ``sched_prune``; the
argument for why each is safe is in docs/retention.md):

* ``job_runs`` (the scheduler's run history): finished rows older than the history
  retention, by when they were recorded; a row of a running run never.
* ``exec_runs`` (``tenure exec``'s run history): the same; a row left 'running' only once its
  lease is gone, expired or taken over (its tenure exec died).
* ``exec_slots``: slots that no run can name again, the history retention after the end of
  the slot's window; slots named by the caller (``--slot`` alone) never.
* ``outbox``: delivered messages, the history retention after delivery; pending and dead
  ones never.
* ``inbox``: consumers' claims older than the inbox retention (default 30 days, at least
  one day), and none applied after the oldest still-deliverable message of the schema's
  outbox was created.

Who prunes: every ``tenure worker`` (all tables of its schema) and every ``tenure relay``
(outbox and inbox) every :data:`EVERY` seconds, jittered; ``tenure exec`` a bounded amount of
its own history after each run; ``tenure prune`` on demand. Pruners at once take different
rows (SKIP LOCKED), so any number of them is fine.

Each statement deletes at most ``batch`` rows and is its own short transaction; a pass
repeats it, pausing :data:`PAUSE` seconds between batches so claims and writes run in
between, until a batch comes back short.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import InvalidArgument, TenureError
from ..validation import Duration, check_int, parse_duration

log = logging.getLogger("tenure.retention")

#: Default age after which history (run histories, completed slots, delivered messages) goes.
DEFAULT_RETENTION = "7d"
#: Default age after which a consumer's inbox claim goes (see docs/retention.md).
DEFAULT_INBOX_RETENTION = "30d"
#: The shortest inbox retention accepted: far above the longest retry schedule of a relay
#: (10 attempts with backoff up to 5 minutes: under an hour), so a redelivery of a message
#: still being retried always finds its claim.
MIN_INBOX_RETENTION = 86_400.0
#: Rows one statement deletes, and the pause between two batches of one pass.
BATCH = 5000
PAUSE = 0.05
MAX_BATCH = 100_000
#: How often a worker or relay runs a pass (jittered), the first within FIRST_WITHIN seconds
#: of its start.
EVERY = 600.0
FIRST_WITHIN = 30.0


@dataclass(frozen=True, slots=True)
class Table:
    """A table retention prunes: its name and the named statement that deletes one batch."""

    name: str
    query: str
    inbox: bool = False


TABLES: tuple[Table, ...] = (
    Table("job_runs", "sched_prune"),
    Table("exec_runs", "retention_exec_runs"),
    Table("exec_slots", "retention_exec_slots"),
    Table("outbox", "retention_outbox"),
    Table("inbox", "retention_inbox", inbox=True),
)
NAMES = tuple(t.name for t in TABLES)
#: What each long-running process prunes.
WORKER_TABLES = NAMES
RELAY_TABLES = ("outbox", "inbox")
EXEC_TABLES = ("exec_runs", "exec_slots")


@dataclass(frozen=True, slots=True)
class Retention:
    """How long history is kept, in seconds: ``history`` for the run histories, completed
    slots and delivered messages, ``inbox`` for consumers' inbox claims. Build it with
    :meth:`of`, which checks the values."""

    history: float
    inbox: float

    @classmethod
    def of(
        cls,
        history: Duration = DEFAULT_RETENTION,
        inbox: Duration = DEFAULT_INBOX_RETENTION,
        *,
        what: str = "retention",
        inbox_what: str = "inbox_retention",
    ) -> Retention:
        """Checked retention: both positive durations, the inbox's at least one day.
        Raises :class:`~tenure.InvalidArgument` otherwise."""
        seconds = parse_duration(history, what=what)
        if seconds <= 0:
            raise InvalidArgument(f"{what} must be positive, got {history!r}")
        inbox_seconds = parse_duration(inbox, what=inbox_what)
        if inbox_seconds < MIN_INBOX_RETENTION:
            raise InvalidArgument(
                f"{inbox_what} must be at least 1d, got {inbox!r}: inbox rows are the "
                "consumers' memory of what they applied, and a redelivery that comes after its "
                "row was deleted is applied again (see docs/retention.md)"
            )
        return cls(seconds, inbox_seconds)

    def params(self, table: Table, batch: int) -> dict[str, Any]:
        age = self.inbox if table.inbox else self.history
        return {"retention": dt.timedelta(seconds=age), "batch": batch}


class AsyncFetcher(Protocol):
    async def _fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> list[tuple[Any, ...]]: ...


class Fetcher(Protocol):
    def _fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> list[tuple[Any, ...]]: ...


def _tables(names: Iterable[str]) -> list[Table]:
    wanted = set(names)
    unknown = wanted - set(NAMES)
    if unknown:
        raise InvalidArgument(f"unknown tables {sorted(unknown)}; retention prunes {NAMES}")
    return [t for t in TABLES if t.name in wanted]


def _check_batch(batch: int) -> int:
    return check_int(batch, what="batch", minimum=1, maximum=MAX_BATCH)


def _deleted(rows: list[tuple[Any, ...]]) -> int:
    return int(rows[0][0]) if rows else 0


async def prune_async(
    client: AsyncFetcher,
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
    batch = _check_batch(batch)
    counts: dict[str, int] = {}
    for table in _tables(tables):
        total = batches = 0
        try:
            while True:
                rows = await client._fetch(
                    table.query,
                    retention.params(table, batch),
                    doing=f"pruning {table.name}",
                    wrote=True,
                )
                deleted = _deleted(rows)
                total += deleted
                batches += 1
                if deleted < batch or (max_batches is not None and batches >= max_batches):
                    break
                await asyncio.sleep(pause)
        except TenureError as exc:
            if failed is None:
                raise
            failed[table.name] = exc
        counts[table.name] = total
    return counts


def prune(
    client: Fetcher,
    retention: Retention,
    *,
    tables: Iterable[str] = NAMES,
    batch: int = BATCH,
    pause: float = PAUSE,
    max_batches: int | None = None,
    failed: dict[str, TenureError] | None = None,
) -> dict[str, int]:
    """:func:`prune_async` for a synchronous client."""
    batch = _check_batch(batch)
    counts: dict[str, int] = {}
    for table in _tables(tables):
        total = batches = 0
        try:
            while True:
                rows = client._fetch(
                    table.query,
                    retention.params(table, batch),
                    doing=f"pruning {table.name}",
                    wrote=True,
                )
                deleted = _deleted(rows)
                total += deleted
                batches += 1
                if deleted < batch or (max_batches is not None and batches >= max_batches):
                    break
                time.sleep(pause)
        except TenureError as exc:
            if failed is None:
                raise
            failed[table.name] = exc
        counts[table.name] = total
    return counts


def preview(client: Fetcher, retention: Retention) -> dict[str, int]:
    """How many rows a pass would delete now, per table (``tenure prune --dry-run``)."""
    rows = client._fetch(
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
    client: AsyncFetcher, retention: Retention, *, tables: Iterable[str], who: str
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


def age_text(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


__all__ = [
    "BATCH",
    "DEFAULT_INBOX_RETENTION",
    "DEFAULT_RETENTION",
    "EXEC_TABLES",
    "MIN_INBOX_RETENTION",
    "NAMES",
    "RELAY_TABLES",
    "TABLES",
    "WORKER_TABLES",
    "Retention",
    "age_text",
    "describe",
    "preview",
    "prune",
    "prune_async",
    "prune_forever",
]
