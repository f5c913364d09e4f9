"""Hostile input: the Hypothesis profile, the case count printed at the end of the run, and
the fixtures (a seeded schema, an in-process CLI runner). Helpers and strategies are in
:mod:`tests.hardening.hostile`.

Profile ``tenure-hardening``: no deadline (the database shares a loaded machine), examples per
property set by each test and multiplied by ``TENURE_HYPOTHESIS_SCALE`` (default 1, which
keeps the package under a minute). Under CI (``$CI`` set, as CI runs ``.ci/run``) the examples
are derandomized: the same cases every run, so a landing is never blocked by an example no
run drew before; runs on a developer's machine draw new cases each time, which is where new
counterexamples are found (run with ``TENURE_HYPOTHESIS_SCALE=10`` now and then).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings

import tenure
from tests.hardening.hostile import SEEDED_KEY, SEEDED_TOPIC, TRIED, Seeded, stored

_COMMON: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    "print_blob": True,  # a failure prints the @reproduce_failure line to replay it
    "database": None,  # no .hypothesis/ directory in the tree
    "derandomize": bool(os.environ.get("CI")),
}
settings.register_profile("tenure-hardening", max_examples=25, **_COMMON)
settings.load_profile("tenure-hardening")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TRIED:
        return
    total = sum(TRIED.values())
    terminalreporter.write_line(
        f"hostile input: {total} generated cases tried over {len(TRIED)} properties"
    )
    for name, count in sorted(TRIED.items()):
        terminalreporter.write_line(f"  {count:6d}  {name}")


def _job(ctx: Any) -> None:  # a registered job; never run here
    return None


@pytest.fixture
def seeded(client: tenure.Client, dsn: str, schema: str) -> Seeded:
    """Rows stored before the hostile input runs: a live lease with a result, an outbox
    message, an inbox claim and a registered scheduled job."""
    lease = client.acquire(SEEDED_KEY, ttl=3600)
    assert lease is not None
    client.results.put(SEEDED_KEY, {"kept": [1, "two", None]}, token=lease.token)
    with psycopg.connect(dsn) as conn, conn.transaction():
        tenure.outbox.enqueue(conn, SEEDED_TOPIC, "k1", {"kept": True}, schema=schema)
        tenure.inbox.claim(conn, "seeded-consumer", "k1", schema=schema)
    app = tenure.Scheduler(dsn, schema=schema)
    app.job("seeded-job", cron="0 3 * * *")(_job)
    app.task("seeded.task")(_job)
    app.register()
    # A runtime schedule (its recorded change too) and the registered task above.
    tenure.add_schedule(client, "seeded-schedule", task="seeded.task", every="1h", args={"k": 1})
    seeded = Seeded(client, dsn, schema, lease.token)
    seeded.before = stored(dsn, schema)
    # Every table holds something to protect, except history and live registrations that
    # the seeding does not create (slots, runs, relays).
    empty = [
        t
        for t, rows in seeded.before.items()
        if not rows
        and t not in ("exec_slots", "job_runs", "exec_runs", "outbox_relays", "scheduler_workers")
    ]
    assert not empty, f"nothing seeded in {empty}"
    return seeded


@pytest.fixture
def cli_runner(dsn: str, schema: str) -> Iterator[CliRunner]:
    """A CliRunner on the test's database and schema; restores the ``tenure`` and
    ``psycopg`` loggers the commands reconfigure (their handlers would write to the runner's
    closed stream)."""
    loggers = [logging.getLogger(name) for name in ("tenure", "psycopg")]
    saved = [(logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    yield CliRunner(env={"TENURE_DSN": dsn, "TENURE_SCHEMA": schema, "DATABASE_URL": None})
    for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
