"""Several real worker processes on one schedule: every slot runs exactly once, tokens only go
up, and a worker whose wall clock is wrong by minutes changes nothing."""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.env import tenure_env
from tests.support.scheduler_support import (
    faketime_lib,
    prepare,
    query,
    wait_for,
    worker_processes,
)

pytestmark = pytest.mark.slow

SECOND = dt.timedelta(seconds=1)


def check_every_slot_ran_once(
    dsn: str, schema: str, jobs: int, started: dt.datetime, stopped: dt.datetime
) -> list[tuple[Any, ...]]:
    """Evidence rows (written in fenced transactions) and history agree: per job, slots are
    consecutive 1s slots covering the whole time the workers ran, each exactly once, with
    tokens strictly increasing. Returns the evidence rows."""
    rows = query(
        dsn,
        schema,
        "SELECT job_key, slot, token, pid, kind, wall, at FROM {schema}.evidence "
        "WHERE job_key LIKE 'tick-%%' ORDER BY job_key, slot",
    )
    by_job: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        by_job[row[0]].append(row)
    assert len(by_job) == jobs
    for key, runs in by_job.items():
        slots = [r[1] for r in runs]
        tokens = [r[2] for r in runs]
        assert len(set(slots)) == len(slots), f"{key}: a slot ran twice"
        assert all(b - a == SECOND for a, b in itertools.pairwise(slots)), f"{key}: a gap"
        assert all(a < b for a, b in itertools.pairwise(tokens)), f"{key}: tokens {tokens}"
        # Coverage: from the first slot after all workers started to the last before the stop.
        assert slots[0] <= started + 1.5 * SECOND, (key, slots[0], started)
        assert slots[-1] >= stopped - 2.5 * SECOND, (key, slots[-1], stopped)
        assert {r[4] for r in runs} == {"scheduled"}
    history = query(
        dsn,
        schema,
        "SELECT job_key, slot, token, outcome, started_at FROM {schema}.job_runs "
        "WHERE job_key LIKE 'tick-%%' ORDER BY job_key, slot",
    )
    assert {h[3] for h in history} == {"succeeded"}  # no misfire, no lost lease, no retry
    assert [(h[0], h[1], h[2]) for h in history] == [(r[0], r[1], r[2]) for r in rows]
    for h in history:
        assert h[4] >= h[1], "a run started before its slot (database clock)"
    return rows


def test_three_workers_twenty_jobs_every_slot_exactly_once(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """3 worker processes x 20 jobs every second for 20 seconds."""
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, SCHED_JOBS="20")
    with worker_processes(3, "many", env, tmp_path) as workers:
        [(started,)] = query(dsn, schema, "SELECT clock_timestamp()")
        time.sleep(20)
        [(stopped,)] = query(dsn, schema, "SELECT clock_timestamp()")
        for w in workers:
            w.signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
        logs = [w.log() for w in workers]
    assert codes == [0, 0, 0], logs
    rows = check_every_slot_ran_once(dsn, schema, 20, started, stopped)
    assert len(rows) >= 20 * 18
    assert {r[3] for r in rows} == {w.pid for w in workers}  # all three took part
    for log in logs:
        # One startup and one shutdown line, naming the worker and the job count.
        assert len([ln for ln in log.splitlines() if " started: 21 jobs" in ln]) == 1, log
        assert len([ln for ln in log.splitlines() if " stopped: 21 jobs" in ln]) == 1, log
        assert "Traceback" not in log and "WARNING" not in log, log


def _runners(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    """The worker processes that have started runs of the tick jobs."""
    return query(
        dsn, schema, "SELECT DISTINCT pid FROM {schema}.job_runs WHERE job_key LIKE 'tick-%%'"
    )


def test_workers_with_wall_clocks_wrong_by_minutes_behave_identically(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Two workers under libfaketime, one 7 minutes ahead, one 7 minutes behind: slots still
    run once each, never early, never late by more than normal latency (database clock)."""
    lib = faketime_lib()
    if lib is None:
        pytest.skip("libfaketime is not installed (Debian/Ubuntu package: faketime)")
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, SCHED_JOBS="6")
    skews = [
        {"LD_PRELOAD": lib, "FAKETIME": "+7m", "FAKETIME_DONT_RESET": "1"},
        {"LD_PRELOAD": lib, "FAKETIME": "-7m", "FAKETIME_DONT_RESET": "1"},
    ]
    with worker_processes(2, "many", env, tmp_path, extra_env=skews) as workers:
        [(started,)] = query(dsn, schema, "SELECT clock_timestamp()")
        # Eight seconds of slots at least, and until each worker has run one: the first to
        # start may keep every job until its presence beat (every 10 s) tells it of the
        # other (docs/safety.md, "A job kept for its next slot"); seen once in CI.
        least = time.monotonic() + 8
        wait_for(
            lambda: time.monotonic() >= least and len(_runners(dsn, schema)) == 2,
            timeout=60,
            what="both workers to run jobs",
        )
        [(stopped,)] = query(dsn, schema, "SELECT clock_timestamp()")
        for w in workers:
            w.signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
    assert codes == [0, 0], [w.log() for w in workers]
    rows = check_every_slot_ran_once(dsn, schema, 6, started, stopped)
    # The skew was real: each worker's own clock was 7 minutes off the database's.
    skew = {w.pid: s for w, s in zip(workers, (7, -7), strict=True)}
    seen = set()
    for _key, _slot, _token, pid, _kind, wall, at in rows:
        offset = (wall - at).total_seconds() / 60
        assert abs(offset - skew[pid]) < 0.5, (pid, offset)
        seen.add(pid)
    assert seen == set(skew)
    history = query(
        dsn,
        schema,
        "SELECT min(started_at - slot), max(started_at - slot) FROM {schema}.job_runs "
        "WHERE job_key LIKE 'tick-%%'",
    )
    # Never minutes early or late: a skew would show as +-7 minutes. (Seconds of lateness
    # are the loaded machine's scheduling, not the clocks: this is not a latency test.)
    earliest, latest = history[0]
    assert earliest >= dt.timedelta(0) and latest < dt.timedelta(minutes=1), history
