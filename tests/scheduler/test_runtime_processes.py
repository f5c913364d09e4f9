"""Runtime schedules (issue 27) with real worker processes: schedules added, changed and
removed from another process while two workers run; each slot once; a changed argument used
from the next run on; a removed schedule never runs again; a backfill of 50 slots runs each
once across two workers; a SIGSTOPped run of a runtime schedule is fenced like a coded one.

The workers run ``tests.support.scheduler_apps:tasks``; each run writes an evidence row in a
transaction fenced with its token, whose phase is its ``ctx.args`` as JSON."""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import tenure
from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import prepare, query, wait_for, worker_processes

pytestmark = pytest.mark.slow


def runs(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    """Each run's evidence (slot, token, kind, pid, args) and its start by the database
    clock (history), in slot order."""
    return query(
        dsn,
        schema,
        "SELECT e.slot, e.token, e.kind, e.pid, e.phase, r.started_at, r.outcome "
        "FROM {schema}.evidence AS e "
        "LEFT JOIN {schema}.job_runs AS r ON r.job_key = e.job_key AND r.token = e.token "
        "WHERE e.job_key = %s ORDER BY e.slot",
        (key,),
    )


def db_now(dsn: str, schema: str) -> dt.datetime:
    [(now,)] = query(dsn, schema, "SELECT clock_timestamp()")
    return now  # type: ignore[no-any-return]


def cli(env: dict[str, str], *args: str) -> None:
    done = run_tenure(["schedules", *args], env)
    assert done.returncode == 0, done.stderr


def check_once(found: list[tuple[Any, ...]], key: str) -> None:
    slots = [r[0] for r in found]
    tokens = [r[1] for r in found]
    assert len(set(slots)) == len(slots), f"{key}: a slot ran twice"
    assert all(a < b for a, b in itertools.pairwise(tokens)), f"{key}: tokens {tokens}"
    assert {r[6] for r in found} == {"succeeded"}, f"{key}: {found}"


def test_added_changed_removed_while_two_workers_run(dsn: str, schema: str, tmp_path: Path) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    with (
        worker_processes(2, "tasks", env, tmp_path) as workers,
        tenure.connect(dsn, schema=schema) as client,
    ):
        tenure.add_schedule(client, "a", task="echo", every="1s", args={"v": 1}, ttl="5s")
        tenure.add_schedule(client, "b", task="echo-async", every="1s", args={"v": 1}, ttl="5s")
        cli(env, "add", "c", "--task", "echo", "--every", "1s", "--args", '{"c": 1}')
        wait_for(lambda: len(runs(dsn, schema, "c")) >= 3, timeout=20, what="c to run")
        before_a = db_now(dsn, schema)
        cli(env, "update", "a", "--args", '{"v": 2}')
        after_a = db_now(dsn, schema)
        cli(env, "remove", "c")
        after_c = db_now(dsn, schema)
        cli(env, "add", "d", "--task", "echo-async", "--every", "1s", "--args", '{"d": 1}')
        wait_for(lambda: len(runs(dsn, schema, "d")) >= 3, timeout=20, what="d to run")
        wait_for(
            # A run's history row is written at its end: one still being recorded has
            # evidence but no start yet (seen under load).
            lambda: len([r for r in runs(dsn, schema, "a") if r[5] and r[5] > after_a]) >= 3,
            timeout=20,
            what="a to run with its new arguments",
        )
        for w in workers:
            w.signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
        logs = [w.log() for w in workers]
    assert codes == [0, 0], logs
    for log in logs:
        assert "Traceback" not in log, log
    for key in "abcd":
        check_once(runs(dsn, schema, key), key)
    a = runs(dsn, schema, "a")
    assert {r[4] for r in a if r[5] < before_a} == {'{"v": 1}'}
    # Every run that started after the change committed used the new arguments.
    assert {r[4] for r in a if r[5] > after_a} == {'{"v": 2}'}
    assert {r[4] for r in runs(dsn, schema, "b")} == {'{"v": 1}'}
    # No run of the removed schedule started after its removal committed.
    c = runs(dsn, schema, "c")
    assert c and all(r[5] < after_c for r in c), c
    [(late,)] = query(
        dsn,
        schema,
        "SELECT count(*) FROM {schema}.job_runs WHERE job_key = 'c' AND started_at > %s",
        (after_c,),
    )
    assert late == 0
    assert {r[4] for r in runs(dsn, schema, "d")} == {'{"d": 1}'}
    assert {r[3] for r in a + c} <= {w.pid for w in workers}


def test_backfill_of_50_slots_runs_each_once_in_order_across_two_workers(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    with (
        worker_processes(2, "tasks", env, tmp_path) as workers,
        tenure.connect(dsn, schema=schema) as client,
    ):
        tenure.add_schedule(client, "bf", task="echo", every="1h", args={"b": 1}, ttl="5s")
        info = tenure.get_schedule(client, "bf")
        assert info is not None
        now = db_now(dsn, schema)
        past = info.definition().schedule.iter_after(now - dt.timedelta(hours=60))
        wanted = list(itertools.islice(past, 50))
        assert wanted[-1] < now
        slots = tenure.backfill_schedule(client, "bf", wanted[0], wanted[-1])
        assert slots == wanted
        wait_for(
            lambda: len([r for r in runs(dsn, schema, "bf") if r[6]]) >= 50,
            timeout=60,
            what="the 50 backfill runs",
        )
        time.sleep(0.5)  # a duplicate, if any, would show now
        for w in workers:
            w.signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
        done = tenure.get_schedule(client, "bf")
    assert codes == [0, 0], [w.log() for w in workers]
    found = runs(dsn, schema, "bf")
    check_once(found, "bf")
    assert [r[0] for r in found] == wanted  # each slot once, none other
    assert {r[2] for r in found} == {"backfill"}
    # In order: each slot started after the one before it, with a higher token.
    starts = [r[5] for r in found]
    assert starts == sorted(starts)
    assert done is not None and done.backfill_next is None and done.state == "scheduled"
    # The schedule itself did not move: its next slot is still to come.
    assert done.next_slot is not None and done.next_slot > wanted[-1]


def test_a_sigstopped_run_of_a_runtime_schedule_is_fenced(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """As the coded job's test (test_scheduler_faults): the stalled holder's lease expires,
    the other worker retries the slot with token + 1, and the stalled one's result write is
    rejected when it resumes."""
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, SCHED_SLOW="3")
    with (
        worker_processes(2, "tasks", env, tmp_path) as workers,
        tenure.connect(dsn, schema=schema) as client,
    ):
        tenure.add_schedule(client, "s", task="slow-task", cron="0 0 1 1 *", ttl="1.5s")
        done = run_tenure(["jobs", "trigger", "s"], env)
        assert done.returncode == 0, done.stderr

        def evidence() -> list[tuple[Any, ...]]:
            return query(
                dsn,
                schema,
                "SELECT pid, token, phase FROM {schema}.evidence WHERE job_key = 's' ORDER BY at",
            )

        [(pid, token, _)] = wait_for(evidence, timeout=10, what="the run to start")
        [stalled] = [w for w in workers if w.pid == pid]
        [successor] = [w for w in workers if w.pid != pid]
        stalled.signal(signal.SIGSTOP)
        try:
            wait_for(
                lambda: [e for e in evidence() if e[1] == token + 1],
                timeout=15,
                what="the successor to take the slot over",
            )
        finally:
            stalled.signal(signal.SIGCONT)

        def both_ended() -> list[tuple[Any, ...]] | None:
            rows = query(
                dsn,
                schema,
                "SELECT token, pid, outcome, kind FROM {schema}.job_runs WHERE job_key = 's' "
                "ORDER BY run_id",
            )
            return rows if [r[2] for r in rows] == ["stale_rejected", "succeeded"] else None

        ended = wait_for(both_ended, timeout=20, what="both runs to end")
        log = stalled.log()
        result = client.results.get("s")
    assert [r[:2] for r in ended] == [(token, stalled.pid), (token + 1, successor.pid)]
    assert [e[:3] for e in evidence() if e[2] == "finished"] == [
        (successor.pid, token + 1, "finished")
    ]
    assert result is not None and result.payload == {"pid": successor.pid, "token": token + 1}
    assert f"result write rejected: token {token}" in log
    assert f"result write accepted: token {token + 1}" in successor.log()
