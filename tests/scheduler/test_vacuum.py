"""The workers vacuum the scheduler's hot tables (``scheduler/vacuum.py``): every run updates
its job row several times with a new ``due_at``, so without a vacuum the claim's index range
fills with dead entries and every claim, start and finish gets slower the longer workers run
(bench/README.md, "Fifth pass": claims from 9 to 40 ms over 150 s at 5,000 runs/s on a server
without autovacuum). A role that may not vacuum them says so once and goes on running jobs."""

from __future__ import annotations

import logging
import time

import pytest

import tenure
from tenure.errors import InvalidArgument
from tenure.scheduler import vacuum
from tests.support.env import run_tenure, tenure_env
from tests.support.roles import app_role
from tests.support.scheduler_support import InProcessWorker, prepare, query, wait_for


def vacuums(dsn: str, schema: str, table: str = "scheduled_jobs") -> int:
    [(count,)] = query(
        dsn,
        schema,
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
        (schema, table),
    )
    return int(count)


def busy_app(dsn: str, schema: str, **settings: object) -> tenure.Scheduler:
    app = tenure.Scheduler(dsn, schema=schema, **settings)  # type: ignore[arg-type]
    for i in range(20):
        app.add_job(f"tick-{i}", lambda ctx: None, every="1s")
    return app


def test_a_worker_vacuums_the_scheduler_tables_as_runs_leave_dead_rows(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare(dsn, schema)
    monkeypatch.setattr(vacuum, "MIN_DEAD_ROWS", 20)
    app = busy_app(dsn, schema, vacuum_every="0.5s")
    with InProcessWorker(app):
        wait_for(
            lambda: vacuums(dsn, schema) >= 2,
            timeout=30,
            what="two vacuums of scheduled_jobs",
        )
        runs = query(dsn, schema, "SELECT count(*) FROM {schema}.job_runs")[0][0]
    assert runs > 0
    # The lease and fence tables go with it (one statement, one lock each, skipped if taken).
    assert vacuums(dsn, schema, "job_leases") >= 1
    assert vacuums(dsn, schema, "job_state") >= 1


def test_no_vacuum_when_switched_off_or_below_the_threshold(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare(dsn, schema)
    monkeypatch.setattr(vacuum, "MIN_DEAD_ROWS", 20)
    with InProcessWorker(busy_app(dsn, schema, vacuum_every=0)):
        wait_for(
            lambda: query(dsn, schema, "SELECT count(*) FROM {schema}.job_runs")[0][0] >= 60,
            timeout=30,
            what="three rounds of runs",
        )
        time.sleep(1.5)  # the stats of those runs reach pg_stat_user_tables
    assert vacuums(dsn, schema) == 0
    monkeypatch.setattr(vacuum, "MIN_DEAD_ROWS", 10**9)
    with InProcessWorker(busy_app(dsn, schema, vacuum_every="0.3s")):
        time.sleep(3)
    assert vacuums(dsn, schema) == 0


def test_a_role_that_may_not_vacuum_says_so_once_and_runs_its_jobs(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    prepare(dsn, schema)
    monkeypatch.setattr(vacuum, "MIN_DEAD_ROWS", 20)
    caplog.set_level(logging.INFO, logger="tenure.scheduler")
    with (
        app_role(dsn, schema) as role_dsn,
        InProcessWorker(busy_app(role_dsn, schema, vacuum_every="0.3s")),
    ):
        wait_for(
            lambda: any("autovacuum" in r.getMessage() for r in caplog.records),
            timeout=30,
            what="the worker's line about vacuuming",
        )
        wait_for(
            lambda: query(dsn, schema, "SELECT count(*) FROM {schema}.job_runs")[0][0] >= 40,
            timeout=30,
            what="runs after it",
        )
    lines = [r for r in caplog.records if "autovacuum" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "may not vacuum" in lines[0].getMessage()
    assert lines[0].levelno == logging.INFO
    assert vacuums(dsn, schema) == 0


@pytest.mark.parametrize("value", ["-1s", "soon", float("nan")])
def test_vacuum_every_refuses_bad_values(value: object) -> None:
    with pytest.raises(InvalidArgument, match="vacuum_every"):
        tenure.Scheduler("postgresql://localhost/x", vacuum_every=value)  # type: ignore[arg-type]


def test_the_worker_command_takes_vacuum_every_from_flag_or_environment(
    dsn: str, schema: str
) -> None:
    help_text = run_tenure(["worker", "--help"], tenure_env(dsn, schema)).stdout
    assert "--vacuum-every" in help_text and "TENURE_VACUUM_EVERY" in help_text
    bad = run_tenure(["worker", "x:app", "--vacuum-every", "soon"], tenure_env(dsn, schema))
    assert bad.returncode == 2
    assert "vacuum-every" in bad.stderr
