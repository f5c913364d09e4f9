"""A run whose body ended but whose end reached the database only after its lease expired
is not run again by its own worker (found by tests/ha/test_late_claim.py in CI: a stall
that began while a finish was in flight let the worker's next claim retake the job and
retry the slot that had already run and committed).

Here the finish is held up on purpose: the test locks ``job_runs`` (EXCLUSIVE: reads go on,
writes wait) after the body has begun, opens the gate, and keeps the lock past the lease's
TTL, so the worker's claim retakes the job while the finish of its own ended run waits
behind the lock. Real worker process, real PostgreSQL locks."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import tenure
from tenure.db.channels import channel
from tenure.scheduler import jobs as ops
from tests.support.env import tenure_env
from tests.support.scheduler_apps import gated_app
from tests.support.scheduler_support import WorkerProcess, prepare, query, wait_for

TTL = 1.5  # the gated jobs' lease TTL (scheduler_apps' SCHED_TTL default)


def _phases(dsn: str, schema: str) -> list[tuple[str, int]]:
    return [
        (r[0], r[1])
        for r in query(
            dsn,
            schema,
            "SELECT phase, token FROM {schema}.evidence WHERE job_key = 'gate-a' ORDER BY at",
        )
    ]


def _retaken(dsn: str, schema: str, token: int, timeout: float) -> None:
    """Wait until the job's lease has a token above ``token``: the worker claimed it again."""
    wait_for(
        lambda: query(
            dsn,
            schema,
            "SELECT fencing_token FROM {schema}.job_leases "
            "WHERE job_key = 'gate-a' AND fencing_token > %s",
            (token,),
        ),
        timeout=timeout,
        what="the job to be claimed again",
    )


def _stop_and_check_one_run(
    dsn: str,
    schema: str,
    w: WorkerProcess,
    settle: float,
    once: tuple[str, ...] = ("started", "finished"),
) -> None:
    """Let the worker do what it does next (within ``settle`` s), stop it, and check that the
    body ran once (its phases were ``once``)."""
    time.sleep(settle)
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.log()
    phases = _phases(dsn, schema)
    assert tuple(p for p, _ in phases) == once, (phases, w.log())


def test_an_ended_run_whose_finish_is_late_is_not_run_again_by_its_worker(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    gated_app(dsn, schema).register()
    env = tenure_env(dsn, schema, SCHED_GATE=str(tmp_path / "gate"))
    w = WorkerProcess("gated", env, tmp_path / "worker.log", args=["--shutdown-grace", "1s"])
    try:
        w.wait_started()
        with tenure.connect(dsn, schema=schema) as client:
            ops.trigger(client, "gate-a", channel=channel("jobs", schema))
        wait_for(lambda: _phases(dsn, schema), timeout=20, what="the body to begin")
        with psycopg.connect(dsn) as locker:
            locker.execute(
                sql.SQL("LOCK TABLE {}.job_runs IN EXCLUSIVE MODE").format(sql.Identifier(schema))
            )
            (tmp_path / "gate").touch()  # the body ends; its finish waits behind the lock
            wait_for(
                lambda: ("finished", _phases(dsn, schema)[0][1]) in _phases(dsn, schema),
                timeout=20,
                what="the body to end",
            )
            # The lease expires with the finish still waiting; the worker's claim retakes
            # the job (claims only read job_runs) and its start waits behind the lock too.
            _retaken(dsn, schema, _phases(dsn, schema)[0][1], timeout=4 * TTL + 10)
            time.sleep(0.5)
            locker.rollback()
        # Whatever the worker does next happens within a lease or two.
        _stop_and_check_one_run(dsn, schema, w, settle=3 * TTL)
    finally:
        w.stop()


@pytest.mark.parametrize("since", ["nothing", "a lost claim"])
def test_a_run_whose_recorded_end_the_database_lost_is_not_run_again_by_its_worker(
    dsn: str, schema: str, tmp_path: Path, since: str
) -> None:
    # A failover with asynchronous replication can lose the last commits: here the run's
    # recorded end is taken back by hand (the job row says the run is still going, as the
    # new primary's would), and the worker's next claim finds it (found in CI by
    # tests/ha/test_patroni_async.py's lagging fault: the same worker ran the slot again).
    prepare(dsn, schema)
    gated_app(dsn, schema).register()
    (tmp_path / "gate").touch()
    env = tenure_env(dsn, schema, SCHED_GATE=str(tmp_path / "gate"))
    w = WorkerProcess("gated", env, tmp_path / "worker.log", args=["--shutdown-grace", "1s"])
    try:
        w.wait_started()
        with tenure.connect(dsn, schema=schema) as client:
            ops.trigger(client, "gate-a", channel=channel("jobs", schema))
        [(slot, token)] = wait_for(
            lambda: query(
                dsn,
                schema,
                "SELECT slot, token FROM {schema}.job_runs "
                "WHERE job_key = 'gate-a' AND outcome = 'succeeded'",
            ),
            timeout=20,
            what="the run's end to be recorded",
        )
        if since == "a lost claim":
            # Another worker's claim took the job after the end went missing and left the
            # slot unfinished under its own token (its answer came too late to start it: the
            # clientcut fault of tests/ha/test_patroni_async.py, in CI).
            token += 1
            query(
                dsn,
                schema,
                "UPDATE {schema}.job_leases SET fencing_token = %s, "
                "lease_until = clock_timestamp() WHERE job_key = 'gate-a'",
                (token,),
            )
            query(
                dsn, schema, "UPDATE {schema}.job_state SET token = %s WHERE job_key = 'gate-a'",
                (token,),
            )  # fmt: skip
        query(
            dsn,
            schema,
            "UPDATE {schema}.scheduled_jobs SET running_slot = %s, running_kind = 'manual', "
            "running_token = %s, claim_token = %s, running_attempt = 1 "
            "WHERE job_key = 'gate-a'",
            (slot, token, token),
        )
        query(dsn, schema, "NOTIFY {schema}")  # any wake-up; the claim loop looks within 1 s
        _retaken(dsn, schema, token, timeout=10)
        _stop_and_check_one_run(dsn, schema, w, settle=2 * TTL)
    finally:
        w.stop()


def test_a_body_blind_to_its_lost_lease_that_returns_is_not_run_again_if_nobody_took_over(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    # A sync body writes (fenced), then sleeps without looking at its context while no
    # renewal gets through for longer than its TTL (a row lock on its lease holds them), and
    # returns once the database answers again. Nobody took the job over meanwhile (the
    # worker's one body slot is busy, so it claims nothing), so the run's end stands: the
    # finish's fence (the job's claim_token is still the run's) says no other run of the slot
    # happened. Before, the run ended lease_lost and the worker ran the slot again under the
    # next token, although its first run had done the work (at least once; docs/safety.md).
    prepare(dsn, schema)
    gated_app(dsn, schema).register()
    gate = tmp_path / "gate"
    env = tenure_env(dsn, schema, SCHED_GATE=str(gate), SCHED_GATE_BLIND="1")
    w = WorkerProcess("gated", env, tmp_path / "worker.log", args=["--shutdown-grace", "1s"])
    try:
        w.wait_started()
        with tenure.connect(dsn, schema=schema) as client:
            ops.trigger(client, "gate-a", channel=channel("jobs", schema))
        [(_phase, token)] = wait_for(lambda: _phases(dsn, schema), timeout=20,
                                     what="the body to begin")  # fmt: skip
        with psycopg.connect(dsn) as locker:
            locker.execute(
                sql.SQL("SELECT 1 FROM {}.job_leases WHERE job_key = 'gate-a' FOR UPDATE").format(
                    sql.Identifier(schema)
                )
            )
            wait_for(lambda: f"lease 'gate-a' token {token} lost" in w.log(), timeout=4 * TTL,
                     what="the worker to count the lease lost")  # fmt: skip
            time.sleep(TTL)  # the database's lease has expired too
            locker.rollback()
        gate.touch()  # the body returns
        finished = wait_for(
            lambda: query(
                dsn, schema,
                "SELECT token, outcome FROM {schema}.job_runs WHERE job_key = 'gate-a' "
                "AND finished_at IS NOT NULL",
            ),
            timeout=20,
            what="the run's end to be recorded",
        )  # fmt: skip
        _stop_and_check_one_run(dsn, schema, w, settle=3 * TTL, once=("started",))
        assert finished == [(token, "succeeded")], (finished, w.log())
        runs = query(dsn, schema, "SELECT token, outcome FROM {schema}.job_runs "
                     "WHERE job_key = 'gate-a' ORDER BY run_id")  # fmt: skip
        assert runs == [(token, "succeeded")], (runs, w.log())
    finally:
        w.stop()
