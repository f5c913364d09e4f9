"""A job's registered definition: key, function, schedule and policies (validated)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .schedules import Policy, Schedule

if TYPE_CHECKING:
    from .context import JobContext

JobFunction = Callable[["JobContext"], Any]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One registered job: its key, function, schedule and policies (validated)."""

    key: str
    fn: JobFunction
    schedule: Schedule
    ttl: float
    policy: Policy
    isolation: str = "none"  # "process": the body runs in a child process
    #: Its function is a coroutine function (looked up once: every run asks).
    is_async: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))

    @property
    def qualname(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task an app registered (``@app.task``): what a runtime schedule names. Its
    schedules live in the database (``tenure schedules add``); the run's ``ctx.args`` are
    the schedule's arguments."""

    name: str
    fn: JobFunction
    isolation: str = "none"

    @property
    def qualname(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"

    def for_schedule(self, key: str, schedule: Schedule, ttl: float, policy: Policy) -> JobSpec:
        """The job spec of one claimed schedule of this task."""
        return JobSpec(key, self.fn, schedule, ttl, policy, self.isolation)
