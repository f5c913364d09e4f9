"""Scheduled jobs that run once per slot across any number of workers.

:mod:`.app` is the user's side (:class:`Scheduler`, ``@app.job``), :mod:`.context` what a job
receives, :mod:`.schedules` cron/every slots and misfire policies, :mod:`.worker` the loop that
claims and runs (with :mod:`.claim`, :mod:`.execution` and :mod:`.registration`), and
:mod:`.jobs` the operations on stored jobs behind ``tenure jobs``.
"""

from .app import Scheduler
from .context import JobContext, JobResults
from .spec import JobSpec

__all__ = ["JobContext", "JobResults", "JobSpec", "Scheduler"]
