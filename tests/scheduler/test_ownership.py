"""A job definition belongs to an app: a worker of another app that defines the same key
refuses to start (one clear line) unless told to adopt the job; redeploying the same app
still updates its own definitions. Real `tenure worker` processes."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure.db.channels import channel
from tests.support.env import ROOT, tenure_env
from tests.support.scheduler_support import WorkerProcess, claim_batch, prepare, query

A = "tests.support.scheduler_apps:owner_a"
B = "tests.support.scheduler_apps:owner_b"


def definition(dsn: str, schema: str) -> tuple[Any, ...]:
    [row] = query(
        dsn,
        schema,
        "SELECT app, cron, every, revision FROM {schema}.scheduled_jobs WHERE job_key = 'shared'",
    )
    return row


def run_and_stop(app: str, env: dict[str, str], log: Path, *args: str) -> str:
    """Start a worker of ``app``, wait until it runs, stop it; its log."""
    w = WorkerProcess(app.rpartition(":")[2], env, log, args=args)
    try:
        w.wait_started()
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0, w.log()
    finally:
        w.stop()
    return w.log()


def refused(app: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tenure", "worker", app],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_a_worker_of_another_app_refuses_to_redefine_a_job_unless_it_adopts_it(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    run_and_stop(A, env, tmp_path / "a1.log")
    assert definition(dsn, schema) == (A, None, dt.timedelta(seconds=10), 1)

    # Another app, same key: refused, with one line that says what to do; nothing changed.
    done = refused(B, env)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tenure: error: job 'shared' belongs to app " + repr(A)), lines
    assert repr(B) in lines[0] and "--adopt" in lines[0]
    assert definition(dsn, schema) == (A, None, dt.timedelta(seconds=10), 1)

    # Redeploying the same app still updates its own definition.
    log = run_and_stop(A, {**env, "SHARED_EVERY": "20s"}, tmp_path / "a2.log")
    assert definition(dsn, schema) == (A, None, dt.timedelta(seconds=20), 2)
    assert "definition changed by this deploy" in log

    # Told to take it over (--adopt, or its TENURE_WORKER_ADOPT twin): B owns the job now.
    log = run_and_stop(B, env, tmp_path / "b1.log", "--adopt")
    assert definition(dsn, schema) == (B, "0 0 1 1 *", None, 3)
    assert f"adopted from app {A!r}" in log
    # ... and the first app is the one refused now, until it adopts the job back.
    done = refused(A, env)
    assert done.returncode == 1 and f"belongs to app {B!r}" in done.stderr, done.stderr
    run_and_stop(A, {**env, "TENURE_WORKER_ADOPT": "1"}, tmp_path / "a3.log")
    assert definition(dsn, schema)[:3] == (A, None, dt.timedelta(seconds=10))


def noop(ctx: tenure.JobContext) -> None:
    pass


def test_an_apps_name_defaults_to_module_and_variable_and_is_validated() -> None:
    from tests.support import scheduler_apps

    assert scheduler_apps.owner_a.name == A
    assert tenure.Scheduler(name="billing").name == "billing"
    unbound = tenure.Scheduler()  # bound to no module variable: the module's name
    assert unbound.name == __name__
    unbound.default_name = "jobs:app"  # what `tenure worker jobs:app` sets
    assert unbound.name == "jobs:app"
    for bad in ("", "  ", "a\nb", "x" * 501):
        with pytest.raises(tenure.InvalidArgument, match="name must"):
            tenure.Scheduler(name=bad)


def test_register_refuses_another_apps_job_writing_nothing_and_adopt_takes_it(
    dsn: str, schema: str
) -> None:
    prepare(dsn, schema)
    a = tenure.Scheduler(dsn, schema=schema, name="a")
    a.job("k", every="10s")(noop)
    a.register()
    b = tenure.Scheduler(dsn, schema=schema, name="b")
    b.job("k", every="20s")(noop)
    b.job("b-only", every="20s")(noop)
    with pytest.raises(tenure.JobOwnedByAnotherApp) as refused:
        b.register()
    assert refused.value.jobs == {"k": "a"}
    assert isinstance(refused.value, tenure.ConfigurationError)
    keys = "SELECT job_key, app, every FROM {schema}.scheduled_jobs ORDER BY job_key"
    assert query(dsn, schema, keys) == [("k", "a", dt.timedelta(seconds=10))]

    b.register(adopt=True)
    assert query(dsn, schema, keys) == [
        ("b-only", "b", dt.timedelta(seconds=20)),
        ("k", "b", dt.timedelta(seconds=20)),
    ]
    # The old owner's workers leave the adopted job alone: a claim for app "a" takes nothing
    # although "k" is due (triggered); one for app "b" takes it.
    with tenure.connect(dsn, schema=schema) as client:
        from tenure.scheduler import jobs as ops

        ops.trigger(client, "k", channel=channel("jobs", schema))

        def claim(app: str) -> list[str]:
            return [c.job_key for c in claim_batch(client, app=app, exclude=["b-only"])[0]]

        assert claim("a") == []
        assert claim("b") == ["k"]
