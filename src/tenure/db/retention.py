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
* ``lease_events`` (migration 18: bare leases' takeovers and refused writes, for the
  dashboard): rows older than the history retention, by when they happened.
* ``inbox``: consumers' claims older than the inbox retention (default 30 days, at least
  one day), and none applied after the oldest still-deliverable message of the schema's
  outbox was created.

Who prunes: every ``tenure worker`` (all tables of its schema) and every ``tenure relay``
(outbox and inbox) every :data:`EVERY` seconds, jittered; ``tenure exec`` a bounded amount of
its own history (and of the lease events, which its acquires write) after each run;
``tenure prune`` on demand. Pruners at once take different rows (SKIP LOCKED), so any
number of them is fine.

Each statement deletes at most ``batch`` rows and is its own short transaction; a pass
repeats it, pausing :data:`PAUSE` seconds between batches so claims and writes run in
between, until a batch comes back short.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from ..validation import Duration, check_int, parse_duration

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
    Table("lease_events", "retention_lease_events"),
)
NAMES = tuple(t.name for t in TABLES)
#: What each long-running process prunes.
WORKER_TABLES = NAMES
RELAY_TABLES = ("outbox", "inbox")
EXEC_TABLES = ("exec_runs", "exec_slots", "lease_events")


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
        return cls(seconds, check_inbox_retention(inbox, what=inbox_what))

    def params(self, table: Table, batch: int) -> dict[str, Any]:
        age = self.inbox if table.inbox else self.history
        return {"retention": dt.timedelta(seconds=age), "batch": batch}


def check_inbox_retention(value: Duration, *, what: str = "inbox_retention") -> float:
    """The inbox retention in seconds, at least :data:`MIN_INBOX_RETENTION`. Raises
    :class:`~tenure.InvalidArgument` otherwise."""
    seconds = parse_duration(value, what=what)
    if seconds < MIN_INBOX_RETENTION:
        shown = f"{value:g}s" if isinstance(value, int | float) else repr(value)
        raise InvalidArgument(
            f"{what} must be at least 1d, got {shown}: inbox rows are the consumers' memory "
            "of what they applied, and a redelivery that comes after its row was deleted is "
            "applied again (see docs/retention.md)"
        )
    return seconds


def tables_named(names: Iterable[str]) -> list[Table]:
    wanted = set(names)
    unknown = wanted - set(NAMES)
    if unknown:
        raise InvalidArgument(f"unknown tables {sorted(unknown)}; retention prunes {NAMES}")
    return [t for t in TABLES if t.name in wanted]


def check_batch(batch: int) -> int:
    return check_int(batch, what="batch", minimum=1, maximum=MAX_BATCH)


def deleted(rows: list[tuple[Any, ...]]) -> int:
    return int(rows[0][0]) if rows else 0


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
]
