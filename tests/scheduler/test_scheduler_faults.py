"""Worker processes that die, stall or are stopped mid-run, with real signals: the slot is
retried elsewhere with a higher token, a stalled holder's write is rejected, and a stopping
worker hands its runs over at once."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

import tenure
from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import (
    WorkerProcess,
    prepare,
    query,
    wait_for,
    worker_processes,
)

pytestmark = pytest.mark.slow


def evidence(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT pid, token, phase, slot FROM {schema}.evidence WHERE job_key = %s ORDER BY at",
        (key,),
    )


def history(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT slot, token, pid, attempt, outcome, started_at, finished_at, error "
        "FROM {schema}.job_runs WHERE job_key = %s ORDER BY run_id",
        (key,),
    )


def holder(workers: list[WorkerProcess], pid: int) -> tuple[WorkerProcess, WorkerProcess]:
    [held] = [w for w in workers if w.pid == pid]
    [other] = [w for w in workers if w.pid != pid]
    return held, other


def trigger(env: dict[str, str], key: str) -> None:
    done = run_tenure(["jobs", "trigger", key], env)
    assert done.returncode == 0, done.stderr


def test_sigkill_mid_run_retries_the_slot_elsewhere_with_the_next_token(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, SCHED_SLOW="2", SCHED_TTL="1.5s")
    with worker_processes(2, "slow", env, tmp_path) as workers:
        trigger(env, "slow")
        [(pid, token, _, slot)] = wait_for(
            lambda: evidence(dsn, schema, "slow"), timeout=10, what="the run to start"
        )
        dead, survivor = holder(workers, pid)
        dead.signal(signal.SIGKILL)
        assert dead.wait(timeout=10) == -signal.SIGKILL
        done = wait_for(
            lambda: [e for e in evidence(dsn, schema, "slow") if e[2] == "finished"],
            timeout=20,
            what="the slot to be retried and finish",
        )
    assert done == [(survivor.pid, token + 1, "finished", slot)]
    first, second = history(dsn, schema, "slow")
    assert (first[0], first[1], first[2], first[4]) == (slot, token, pid, "lease_lost")
    assert (second[0], second[1], second[2], second[3], second[4]) == (
        slot, token + 1, survivor.pid, 2, "succeeded",
    )  # fmt: skip
    with tenure.connect(dsn, schema=schema) as client:
        result = client.results.get("slow")
    assert result is not None and result.token == token + 1
    assert result.payload == {"pid": survivor.pid, "token": token + 1}


def test_sigstop_past_ttl_then_resume_its_write_is_rejected(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """The seed's scenario with a scheduled job: the paused holder's result write fails even
    though its successor has not written yet (strict fence), and the successor's stands."""
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, SCHED_SLOW="3", SCHED_TTL="1.5s")
    with worker_processes(2, "slow", env, tmp_path) as workers:
        trigger(env, "slow")
        [(pid, token, _, slot)] = wait_for(
            lambda: evidence(dsn, schema, "slow"), timeout=10, what="the run to start"
        )
        stalled, successor = holder(workers, pid)
        stalled.signal(signal.SIGSTOP)
        try:
            wait_for(
                lambda: [e for e in evidence(dsn, schema, "slow") if e[1] == token + 1],
                timeout=15,
                what="the successor to take the slot over",
            )
        finally:
            stalled.signal(signal.SIGCONT)

        def both_ended() -> list[tuple[Any, ...]] | None:
            rows = history(dsn, schema, "slow")
            return rows if [r[4] for r in rows] == ["stale_rejected", "succeeded"] else None

        rows = wait_for(both_ended, timeout=20, what="both runs to end")
        log = stalled.log()
    (slot1, tok1, pid1, _, _, _, _, err1), (slot2, tok2, pid2, att2, _, _, _, _) = rows
    assert (slot1, tok1, pid1) == (slot, token, stalled.pid)
    assert (slot2, tok2, pid2, att2) == (slot, token + 1, successor.pid, 2)
    assert "stale fencing token" in err1
    assert [e[:3] for e in evidence(dsn, schema, "slow") if e[2] == "finished"] == [
        (successor.pid, token + 1, "finished")
    ]
    with tenure.connect(dsn, schema=schema) as client:
        result = client.results.get("slow")
    assert result is not None and result.payload == {"pid": successor.pid, "token": token + 1}
    assert "stale_rejected" in log
    # The result write itself was refused (strict fence: the successor had taken over),
    # not just a later write of the run.
    assert f"result write rejected: token {token}" in log
    assert "result write accepted" not in log
    assert f"result write accepted: token {token + 1}" in successor.log()


def test_sigterm_hands_a_running_slot_over_within_a_second(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    with worker_processes(2, "long", env, tmp_path, args=["--shutdown-grace", "0.3s"]) as workers:
        trigger(env, "long-sync")
        [(pid, token, _, slot)] = wait_for(
            lambda: evidence(dsn, schema, "long-sync"), timeout=10, what="the run to start"
        )
        leaving, staying = holder(workers, pid)
        leaving.signal(signal.SIGTERM)
        assert leaving.wait(timeout=15) == 0
        wait_for(
            lambda: len(evidence(dsn, schema, "long-sync")) == 2, timeout=5, what="the takeover"
        )
        log = leaving.log()
        # A run in progress gets its history row a second after its start (RUNNING_ROW_AFTER).
        first, second = wait_for(
            lambda: rows if len(rows := history(dsn, schema, "long-sync")) == 2 else None,
            timeout=5,
            what="the successor's run in history",
        )
    assert (first[1], first[2], first[4]) == (token, leaving.pid, "cancelled")
    assert (second[0], second[1], second[2], second[4]) == (slot, token + 1, staying.pid, "running")
    handover = (second[5] - first[6]).total_seconds()  # database clock, TTL is 30s
    assert 0 <= handover < 1.0, handover
    assert "1 handed over" in log
    assert len([ln for ln in log.splitlines() if " stopped: 2 jobs" in ln]) == 1


def test_sigterm_lets_a_running_job_finish_and_a_second_sigterm_cancels(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, SCHED_SLOW="1.5")
    with worker_processes(1, "long", env, tmp_path, args=["--shutdown-grace", "20s"]) as [w]:
        trigger(env, "long-sync")
        wait_for(lambda: evidence(dsn, schema, "long-sync"), timeout=10, what="a run")
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=15) == 0
    [run] = history(dsn, schema, "long-sync")
    assert run[4] == "succeeded"  # it finished within the grace
    assert [e[2] for e in evidence(dsn, schema, "long-sync")] == ["started", "finished"]

    env = tenure_env(dsn, schema, SCHED_SLOW="60")
    with worker_processes(1, "long", env, tmp_path, args=["--shutdown-grace", "60s"]) as [w]:
        trigger(env, "long-async")
        wait_for(lambda: evidence(dsn, schema, "long-async"), timeout=10, what="a run")
        w.signal(signal.SIGTERM)
        time.sleep(0.5)
        assert w.proc.poll() is None  # still waiting for the job, within its grace
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=10) == 0
        log = w.log()
    [run] = history(dsn, schema, "long-async")
    assert run[4] == "cancelled"
    assert "received again: cancelling 1 running job and" in log
    [(running_slot,)] = query(
        dsn,
        schema,
        "SELECT running_slot FROM {schema}.scheduled_jobs WHERE job_key = 'long-async'",
    )
    assert running_slot == run[0]  # handed over: the next worker retries it
