"""A job must never take its worker down: whatever its body raises (SystemExit,
KeyboardInterrupt, sync or async) is recorded as that run's failure and the worker keeps
scheduling, in a real `tenure worker` process."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import prepare, query, wait_for, worker_processes

pytestmark = pytest.mark.slow


def finished(dsn: str, schema: str, key: str) -> list[tuple[str, str | None]]:
    return query(
        dsn,
        schema,
        "SELECT outcome, error FROM {schema}.job_runs "
        "WHERE job_key = %s AND outcome <> 'running' ORDER BY run_id",
        (key,),
    )


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("exit-sync", "SystemExit: 3"),
        ("exit-async", "SystemExit: 4"),
        ("interrupt-sync", "KeyboardInterrupt"),
        ("interrupt-async", "KeyboardInterrupt"),
        ("cancel-itself", "CancelledError: the body raised this itself"),
    ],
)
def test_a_body_that_raises_baseexception_fails_its_run_and_the_worker_carries_on(
    dsn: str, schema: str, tmp_path: Path, key: str, error: str
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    with worker_processes(1, "hostile", env, tmp_path) as [worker]:
        done = run_tenure(["jobs", "trigger", key], env)
        assert done.returncode == 0, done.stderr

        def recorded() -> list[tuple[str, str | None]]:
            code = worker.proc.poll()
            assert code is None, f"the worker exited with {code}:\n{worker.log()}"
            return finished(dsn, schema, key)

        [(outcome, message)] = wait_for(recorded, timeout=30, what=f"{key}'s run to be recorded")
        assert (outcome, message) == ("failed", error)
        # It keeps scheduling: the every-1s job runs again after the bad run.
        [(before,)] = query(
            dsn, schema, "SELECT count(*) FROM {schema}.evidence WHERE job_key = 'innocent'"
        )
        wait_for(
            lambda: query(
                dsn,
                schema,
                "SELECT 1 FROM {schema}.evidence WHERE job_key = 'innocent' HAVING count(*) >= %s",
                (before + 2,),
            ),
            timeout=30,
            what="the innocent job to run twice more",
        )
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.log()
    assert "Traceback" in worker.log()  # the failure is logged with its traceback
    assert f"job {key!r} slot" in worker.log()
