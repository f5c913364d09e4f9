"""What a worker runs with: one frozen value built by :class:`~tenure.Scheduler` (its own
settings with the ones ``run()`` or ``tenure worker`` gave), so the worker needs neither the
Scheduler nor its module."""

from __future__ import annotations

from dataclasses import dataclass

from ..db.retention import Retention


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """One worker's settings, checked by the Scheduler that built them."""

    #: The app whose job definitions the worker registers (``Scheduler.name``).
    app: str
    dsn: str | None
    schema: str
    pool_size: int
    migrate: bool
    retention: Retention
    #: Seconds between looks at the scheduler tables' dead rows; 0: left to autovacuum.
    vacuum_every: float
    #: Most job bodies running at once.
    concurrency: int
    #: Seconds a stopping worker lets running jobs finish.
    shutdown_grace: float
    #: Take over job keys another app registered.
    adopt: bool = False
    #: Most claimed runs whose bodies have not begun (claimed ahead of their slots, kept for
    #: their next slots, being started, or waiting for a body slot).
    claim_ahead: int = 10_000
    #: Most ended runs whose end is not recorded yet (waiting for the batching finisher).
    finish_backlog: int = 1000
