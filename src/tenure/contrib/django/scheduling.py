"""The project-wide scheduler that apps' ``jobs.py`` modules add their jobs to."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ...scheduler import JobContext, JobSpec, Scheduler
from ...scheduler.spec import JobFunction


class DjangoScheduler(Scheduler):
    """A :class:`tenure.Scheduler` whose sync jobs close their thread's Django database
    connections when they finish: each run has a thread of its own, and a connection left
    open there would only be closed by the garbage collector."""

    def add_job(self, key: str, fn: JobFunction, **kwargs: Any) -> JobSpec:
        if callable(fn) and not inspect.iscoroutinefunction(fn):
            fn = _closing_connections(fn)
        return super().add_job(key, fn, **kwargs)


def _closing_connections(fn: JobFunction) -> JobFunction:
    @functools.wraps(fn)
    def run(ctx: JobContext) -> Any:
        from django.db import connections

        try:
            return fn(ctx)
        finally:
            connections.close_all()

    return run


#: Declare jobs on it in an app's ``jobs.py``; ``manage.py tenure_worker`` runs them with the
#: ``DATABASES`` alias and schema of ``settings.TENURE``.
scheduler = DjangoScheduler()
