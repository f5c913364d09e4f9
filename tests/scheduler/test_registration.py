"""Registering an app's job definitions grows with the number of jobs: 120,000 took 3.2-3.5 s
on an idle machine and over 5 s beside running workers, where the pool's statement timeout
cut it and the worker did not start (bench_scale.py, 4 workers, 120,000 jobs every minute).
Workers of one deploy starting together waited for each other's new rows past the 2 s lock
timeout. Registration now runs under timeouts sized to its jobs, one at a time per schema.

The pool's timeouts are lowered here so that a few thousand jobs show what 120,000 on a busy
server did.
"""

from __future__ import annotations

import threading

import pytest

import tenure
from tenure.db.timeouts import TIMEOUTS
from tests.support.scheduler_support import prepare, query

JOBS = 20_000


def app_with_jobs(dsn: str, schema: str) -> tenure.Scheduler:
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    for i in range(JOBS):
        app.add_job(f"job-{i:05d}", lambda ctx: None, every="60s")
    return app


def test_registering_many_jobs_is_not_cut_by_the_pools_statement_timeout(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare(dsn, schema)
    app = app_with_jobs(dsn, schema)
    monkeypatch.setitem(TIMEOUTS, "statement_timeout", "100ms")
    app.register()
    assert query(dsn, schema, "SELECT count(*) FROM {schema}.scheduled_jobs") == [(JOBS,)]


def test_workers_registering_together_wait_for_each_other_instead_of_timing_out(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare(dsn, schema)
    apps = [app_with_jobs(dsn, schema) for _ in range(2)]
    monkeypatch.setitem(TIMEOUTS, "lock_timeout", "20ms")
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def register(app: tenure.Scheduler) -> None:
        go.wait()
        try:
            app.register()
        except BaseException as exc:  # reported below, with the other thread's
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(app,)) for app in apps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert query(dsn, schema, "SELECT count(*) FROM {schema}.scheduled_jobs") == [(JOBS,)]
