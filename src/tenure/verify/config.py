"""A run's settings, checked before anything starts."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidArgument
from ..validation import check_ttl

#: Faults `tenure verify` offers, and the extra one only the test suite may add (it restarts
#: a server the suite started itself; `tenure verify` never restarts a server).
FAULTS = ("pause", "kill", "terminate")
RESTART = "restart"
MAX_WORKERS = 64
MAX_KEYS = 100
#: Every third worker runs the scheduler's claim path (worker numbers 2, 5, 8, ...).
SCHEDULER_EVERY = 3


def worker_kind(worker: int) -> str:
    return "scheduler" if worker % SCHEDULER_EVERY == SCHEDULER_EVERY - 1 else "lease"


@dataclass(frozen=True)
class VerifyConfig:
    """One run. ``dsn``: where the checker reads and the schema lives (direct, never a
    pooler in transaction mode for the set-up); ``through``: where the workers connect
    (a pooler in front of the same database), default ``dsn``."""

    dsn: str | None = None
    through: str | None = None
    duration: float = 60.0
    workers: int = 6
    keys: int = 3
    ttl: float = 1.0
    faults: tuple[str, ...] = FAULTS
    fenced: bool = True
    keep: bool = False
    seed: int | None = None
    out: Path | None = None
    #: Only for a server the caller started itself: the test suite's restart fault.
    restart: Callable[[str], None] | None = field(default=None, compare=False)

    def validate(self) -> None:
        if self.duration <= 0:
            raise InvalidArgument(f"duration must be positive, got {self.duration:g}s")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise InvalidArgument(f"workers must be 1 to {MAX_WORKERS}, got {self.workers}")
        if not 1 <= self.keys <= MAX_KEYS:
            raise InvalidArgument(f"keys must be 1 to {MAX_KEYS}, got {self.keys}")
        check_ttl(self.ttl)
        known = (*FAULTS, RESTART) if self.restart is not None else FAULTS
        unknown = [f for f in self.faults if f not in known]
        if unknown:
            raise InvalidArgument(
                f"unknown fault {unknown[0]!r}: choose from {', '.join(FAULTS)} "
                "(comma-separated), or none"
            )


def parse_faults(text: str) -> tuple[str, ...]:
    """``pause,kill`` -> ("pause", "kill"); ``none`` or empty -> ()."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if names in ((), ("none",)):
        return ()
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise InvalidArgument(
            f"unknown fault {unknown[0]!r}: choose from {', '.join(FAULTS)} (comma-separated)"
        )
    return names


@dataclass(frozen=True)
class WorkerSpec:
    """What the runner tells one worker process (as JSON on its command line)."""

    dsn: str
    schema: str
    kind: str  # "lease" or "scheduler"
    worker: int
    incarnation: int
    keys: int
    ttl: float
    seed: int
    fenced: bool
    oplog: str
    logfile: str
    prepare: bool  # False behind a pooler: no server-side prepared statements

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))
