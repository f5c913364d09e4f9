"""Missed slots recorded as runs of slots (issue 31): a worker that comes back after all
workers were down writes one ``misfire_skipped`` history row with a count for the slots it
skipped, not a row per slot (an hour of an every-1s job wrote 3,457 rows)."""

from __future__ import annotations

import datetime as dt
import json

import tenure
from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import InProcessWorker, prepare, query, wait_for

SECOND = dt.timedelta(seconds=1)


def noop(ctx: tenure.JobContext) -> None:
    pass


def test_an_hour_of_missed_slots_is_one_history_row_with_its_count(dsn: str, schema: str) -> None:
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    app.job("tick", every="1s")(noop)
    app.register()
    # The schedule stood still for an hour, as if every worker had been down.
    [(first,)] = query(
        dsn,
        schema,
        "UPDATE {schema}.scheduled_jobs SET next_slot = next_slot - interval '1 hour' "
        "WHERE job_key = 'tick' RETURNING next_slot",
    )
    with InProcessWorker(app):
        wait_for(
            lambda: query(
                dsn,
                schema,
                "SELECT 1 FROM {schema}.job_runs WHERE job_key = 'tick' AND outcome = 'succeeded'",
            ),
            timeout=20,
            what="the first run after the downtime",
        )
    rows = query(
        dsn,
        schema,
        "SELECT slot, outcome, started_at FROM {schema}.job_runs WHERE job_key = 'tick' "
        "ORDER BY run_id",
    )
    skipped = [r for r in rows if r[1] == "misfire_skipped"]
    assert len(skipped) == 1, f"{len(skipped)} misfire_skipped rows for one hour of downtime"
    [(slot, slots, last_slot, error)] = query(
        dsn,
        schema,
        "SELECT slot, slots, last_slot, error FROM {schema}.job_runs "
        "WHERE job_key = 'tick' AND outcome = 'misfire_skipped'",
    )
    ran = [r[0] for r in rows if r[2] is not None]
    # Every slot from the first missed one to the first run is accounted for, none twice.
    assert slot == first and last_slot == ran[0] - SECOND
    assert slots == (ran[0] - first) // SECOND >= 3600 - 1
    assert error.startswith(f"{slots} slots missed")
    # The history shows the count; --json gives it as a field.
    env = tenure_env(dsn, schema)
    out = run_tenure(["jobs", "history", "tick"], env)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "misfire_skipped" in x)
    assert f"misfire_skipped x{slots}" in line
    out = run_tenure(["jobs", "history", "tick", "--json"], env)
    docs = json.loads(out.stdout)
    [doc] = [d for d in docs if d["outcome"] == "misfire_skipped"]
    assert doc["slots"] == slots and doc["last_slot"] == last_slot.isoformat()
