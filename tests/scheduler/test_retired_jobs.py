"""A job removed from the code (issue 31): after its worker was SIGKILLed mid-run and a new
worker without the job was deployed, it lingered for ever, shown running / due now, its
history row 'running', claimed by every new worker (a token each time) only to be given
back. Real worker processes, as in a rolling deploy."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from tenure.ui.data import Reader
from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import WorkerProcess, prepare, query, wait_for

ENV = {"RETIRE_PRESENCE_TTL": "3", "RETIRE_PRESENCE_EVERY": "0.5"}


def _one(dsn: str, schema: str, text: str, params: tuple[Any, ...] = ()) -> Any:
    rows = query(dsn, schema, text, params)
    return rows[0][0] if rows else None


def _dashboard_states(dsn: str, schema: str) -> dict[str, str]:
    async def read() -> dict[str, str]:
        reader = Reader(dsn, schema)
        try:
            return {row.job_key: row.state for row in (await reader.jobs()).rows}
        finally:
            await reader.close()

    return asyncio.run(read())


def test_a_job_removed_from_the_code_is_not_claimed_its_run_is_lost_and_it_can_be_removed(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, **ENV)
    token_of = "SELECT fencing_token FROM {schema}.job_leases WHERE job_key = %s"
    v1 = WorkerProcess("deploy_v1", env, tmp_path / "v1.log")
    try:
        v1.wait_started()
        assert run_tenure(["jobs", "trigger", "gone"], env).returncode == 0
        running = "SELECT token FROM {schema}.job_runs WHERE job_key = 'gone' AND outcome = %s"
        wait_for(
            lambda: query(dsn, schema, running, ("running",)),
            timeout=30,
            what="gone's run in history as running",
        )
        token = _one(dsn, schema, running, ("running",))
        v1.signal(signal.SIGKILL)  # mid-run
        v1.wait()
    finally:
        v1.stop()

    # The rolling deploy: the new version of the app no longer has the job.
    v2 = WorkerProcess("deploy_v2", env, tmp_path / "v2.log")
    try:
        v2.wait_started()
        # Once its lease and the dead worker's presence have expired, the dead run is lost.
        wait_for(
            lambda: query(dsn, schema, running, ("lease_lost",)),
            timeout=30,
            what="the dead run recorded as lost",
        )
        error = _one(dsn, schema, "SELECT error FROM {schema}.job_runs WHERE job_key = 'gone'")
        assert "no live worker of app deploy defines the job" in error
        # Due at once (a trigger too), yet never claimed: keep's run shows the claims go on.
        assert run_tenure(["jobs", "trigger", "gone"], env).returncode == 0
        assert run_tenure(["jobs", "trigger", "keep"], env).returncode == 0
        ran = "SELECT 1 FROM {schema}.evidence WHERE job_key = 'keep'"
        wait_for(lambda: query(dsn, schema, ran), timeout=30, what="keep to run")
        assert _one(dsn, schema, token_of, ("gone",)) == token, "a token taken for gone"
        assert "no function" not in v2.log(), v2.log()

        listed = json.loads(run_tenure(["jobs", "list", "--json"], env).stdout)
        states = {j["job"]: j["state"] for j in listed}
        assert states == {"gone": "no worker defines it", "keep": "idle"}
        assert "no worker defines it" in run_tenure(["jobs", "list"], env).stdout
        status = json.loads(run_tenure(["status", "--json"], env).stdout)
        assert {j["job"]: j["defined"] for j in status} == {"gone": False, "keep": True}
        assert "no worker defines it" in run_tenure(["status"], env).stdout
        assert _dashboard_states(dsn, schema)["gone"] == "no worker defines it"

        # Refused while a live worker of the app defines the job.
        refused = run_tenure(["jobs", "remove", "keep"], env)
        assert refused.returncode == 1, refused
        assert "still defined by live workers of app 'deploy'" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        removed = run_tenure(["jobs", "remove", "gone"], env)
        assert removed.returncode == 0, removed.stderr
        assert f"its tokens stay above {token}" in removed.stdout
        assert not query(
            dsn, schema, "SELECT 1 FROM {schema}.scheduled_jobs WHERE job_key = 'gone'"
        )
        assert _one(dsn, schema, token_of, ("gone",)) == token  # the lease row stays
        again = run_tenure(["jobs", "remove", "gone"], env)
        assert again.returncode == 1 and "no scheduled job 'gone'" in again.stderr
    finally:
        v2.stop()

    # The key comes back (the old version is deployed again): its tokens continue above.
    v1 = WorkerProcess("deploy_v1", env, tmp_path / "v1-again.log")
    try:
        v1.wait_started()
        assert run_tenure(["jobs", "trigger", "gone"], env).returncode == 0
        started = "SELECT token FROM {schema}.evidence WHERE job_key = 'gone' AND token > %s"
        wait_for(lambda: query(dsn, schema, started, (token,)), timeout=30, what="gone again")
        assert _one(dsn, schema, started, (token,)) == token + 1
    finally:
        v1.stop()
