"""What the scheduler's statements cost the database per run, as properties a plan or a row
can show (the rates themselves are measured by bench/profile_worker.py, never here):

* a running job is not due at once: claims do not walk every running job (migration 11);
* the batched start and finish are planned for each call, with the batch's size, so a small
  batch looks its rows up by index however the tables have grown since the worker started.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from typing import Any

import psycopg
import pytest

import tenure
from tenure.db.channels import channel
from tenure.db.queries import query as named_query
from tenure.scheduler import jobs as ops
from tenure.scheduler.claim import Finished, RunIdentity, finish_params
from tenure.scheduler.worker import SCHEMA_VERSION
from tests.support.scheduler_apps import NEVER
from tests.support.scheduler_support import InProcessWorker, claim_batch, prepare, query, wait_for


def due(dsn: str, schema: str, key: str) -> tuple[Any, ...]:
    """due_at as text (psycopg refuses to load -infinity), whether it has passed, how long
    after the run's start it falls, whether it is the next slot, and the running slot."""
    [row] = query(
        dsn,
        schema,
        "SELECT j.due_at::text, j.due_at <= clock_timestamp(), "
        "CASE WHEN isfinite(j.due_at) THEN j.due_at - j.running_started_at END, "
        "j.due_at = j.next_slot, j.running_slot "
        "FROM {schema}.scheduled_jobs AS j "
        "WHERE j.job_key = %s",
        (key,),
    )
    return row


def test_a_running_job_is_due_at_the_end_of_its_lease_term_not_at_once(
    dsn: str, schema: str
) -> None:
    """Before migration 11 a running job was due at -infinity, so every claim of every worker
    read it (and probed its live lease) for as long as it ran."""
    prepare(dsn, schema)
    release = threading.Event()
    app = tenure.Scheduler(dsn, schema=schema)

    @app.job("held", cron=NEVER, ttl="30s")
    def held(ctx: tenure.JobContext) -> None:
        release.wait(20)

    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        ops.trigger(client, "held", channel=channel("jobs", schema))
        text, passed, after_start, is_next_slot, _slot = wait_for(
            lambda: (row := due(dsn, schema, "held"))[2] is not None and row,
            timeout=10,
            what="the run to start",
        )
        # Due when a dead worker's lease would have expired (the next slot is years away).
        assert not passed, text
        assert dt.timedelta(seconds=29) < after_start <= dt.timedelta(seconds=30), text
        assert not is_next_slot
        release.set()
        done = wait_for(
            lambda: (row := due(dsn, schema, "held"))[4] is None and row,
            timeout=10,
            what="the run to finish",
        )
    assert done[3] is True  # done: due at its next slot again


def test_a_run_whose_worker_stops_it_is_due_again_at_once(dsn: str, schema: str) -> None:
    """A finish that leaves the slot to be retried (lease lost, cancelled at shutdown) makes
    the job due at once, as before migration 11."""
    prepare(dsn, schema)
    started = threading.Event()
    app = tenure.Scheduler(dsn, schema=schema)

    @app.job("cancelled", cron=NEVER, ttl="30s")
    def cancelled(ctx: tenure.JobContext) -> None:
        started.set()
        ctx.wait(20)

    with tenure.connect(dsn, schema=schema) as client:
        with InProcessWorker(app, shutdown_grace=0.2):
            ops.trigger(client, "cancelled", channel=channel("jobs", schema))
            assert started.wait(10)
        text, passed, _after_start, _is_next_slot, running_slot = due(dsn, schema, "cancelled")
    assert running_slot is not None  # kept, so that the slot is retried
    assert (text, passed) == ("-infinity", True)


def test_start_and_finish_are_never_prepared(dsn: str, schema: str) -> None:
    """psycopg prepares a statement on its 5th execution and PostgreSQL then keeps one plan
    for the connection's life: a plan made while job_runs was empty kept reading all of it."""
    prepare(dsn, schema)
    with tenure.connect(dsn, schema=schema, pool_size=1) as client:
        where: dict[str, Any] = {
            "channel": channel("jobs", schema),
            "worker": "w",
            "host": "h",
            "pid": 1,
        }
        for _ in range(8):
            client.fetch("sched_finish", finish_params([], **where), doing="finishing")
            claim_batch(client, limit=1)
        with client.connection() as conn:
            prepared = [
                text
                for (text,) in conn.execute(
                    "SELECT statement FROM pg_prepared_statements WHERE NOT from_sql"
                )
            ]
    assert any("FOR UPDATE OF j, s SKIP LOCKED" in text for text in prepared), prepared
    assert not any("json_to_recordset" in text for text in prepared), prepared


def test_a_small_finish_batch_reads_its_rows_by_index(dsn: str, schema: str) -> None:
    """Told nothing, the planner takes a JSON batch for 100 rows and, on tables of a few
    thousand rows, joined 3 runs by reading every row of scheduled_jobs, job_leases and
    job_runs (seen in the workers at 3,000 runs/s). The batch's size is its estimate."""
    prepare(dsn, schema)
    query(
        dsn,
        schema,
        "INSERT INTO {schema}.scheduled_jobs (job_key, every, timezone, ttl, misfire, on_crash, "
        "defined_at, defined_by, next_slot) SELECT 'job-' || n, interval '1 s', 'UTC', "
        "interval '30 s', 'latest', 'retry', now(), 't', now() FROM generate_series(1, 3000) n",
    )
    query(
        dsn,
        schema,
        "INSERT INTO {schema}.job_leases (job_key, lease_owner, lease_until, fencing_token, "
        "lease_ttl, acquired_at, renewed_at) SELECT 'job-' || n, gen_random_uuid(), now(), 1, "
        "interval '30 s', now(), now() FROM generate_series(1, 3000) n",
    )
    query(
        dsn,
        schema,
        "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
        "started_at, outcome) SELECT 'job-' || (n %% 3000), now(), 'scheduled', n, 'w', 'h', 1, "
        "now(), 'succeeded' FROM generate_series(1, 9000) n",
    )
    for table in ("scheduled_jobs", "job_leases", "job_runs"):
        query(dsn, schema, f"VACUUM ANALYZE {{schema}}.{table}")
    now = dt.datetime.now(dt.UTC)
    batch = [
        Finished(
            RunIdentity(f"job-{n}", n, uuid.uuid4(), now, "scheduled", 1, now),
            True,
            "succeeded",
            None,
        )
        for n in (1, 2, 3)
    ]
    params = finish_params(batch, channel=channel("jobs", schema), worker="w", host="h", pid=1)
    with psycopg.connect(dsn) as conn:
        [(doc,)] = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + named_query(schema, "sched_finish"), params
        ).fetchall()
        conn.rollback()
    scans = sorted(
        {f"{node['Node Type']} on {node['Relation Name']}" for node in _nodes(doc[0]["Plan"])
         if "Relation Name" in node}
    )  # fmt: skip
    assert not [s for s in scans if s.startswith("Seq Scan")], json.dumps(scans)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


def test_a_claimed_job_is_not_due_again_until_its_lease_expires(dsn: str, schema: str) -> None:
    """Between the claim and the recorded start, the job is not due: the claims that follow
    (every worker's) do not read it and probe its lease. A claim given back (a worker without
    the job's function) makes it due at once again."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    app.add_job("k", lambda ctx: None, cron=NEVER, ttl="30s")
    app.register()
    with tenure.connect(dsn, schema=schema) as client:
        ops.trigger(client, "k", channel=channel("jobs", schema))
        [claim] = claim_batch(client, limit=5)[0]
        [(due_at, passed)] = query(
            dsn,
            schema,
            "SELECT due_at, due_at <= clock_timestamp() FROM {schema}.scheduled_jobs "
            "WHERE job_key = 'k'",
        )
        assert (due_at, passed) == (claim.lease_until, False)
        assert claim_batch(client, limit=5)[0] == []
        client.fetch(
            "sched_unclaim",
            {"keys": ["k"], "tokens": [claim.token], "owners": [claim.owner]},
            doing="giving back",
        )
        [(text, passed)] = query(
            dsn,
            schema,
            "SELECT due_at::text, due_at <= clock_timestamp() FROM {schema}.scheduled_jobs "
            "WHERE job_key = 'k'",
        )
        assert (text, passed) == ("-infinity", True)  # the trigger is still pending
        [retaken] = claim_batch(client, limit=5)[0]
    assert retaken.token == claim.token + 1


def _writes(dsn: str, schema: str, table: str) -> tuple[int, int, int]:
    """Rows inserted, updated, and updated heap-only in ``table`` (pg_stat_user_tables)."""
    [row] = query(
        dsn,
        schema,
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = %s",
        (schema, table),
    )
    return row


def test_a_run_writes_its_history_row_once(dsn: str, schema: str) -> None:
    """Before migration 12 the start inserted a 'running' row and the finish updated it. That
    update is never heap-only (outcome is in two of job_runs' indexes), so each run wrote an
    entry in each of its six indexes twice, and the insert doubled the start statement."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    keys = [f"k{n}" for n in range(20)]
    for key in keys:
        app.add_job(key, lambda ctx: None, cron=NEVER, ttl="30s")
    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        for key in keys:
            ops.trigger(client, key, channel=channel("jobs", schema))
        wait_for(
            lambda: (
                query(
                    dsn,
                    schema,
                    "SELECT count(*) FROM {schema}.job_runs WHERE outcome = 'succeeded'",
                )[0][0]
                == len(keys)
            ),
            timeout=20,
            what="the runs",
        )
    # A backend's counts reach pg_stat_user_tables when it goes idle or exits (the worker's
    # connections closed with it).
    inserted, updated, _hot = wait_for(
        lambda: (row := _writes(dsn, schema, "job_runs"))[0] >= len(keys) and row,
        timeout=15,
        what="the table statistics",
    )
    assert (inserted, updated) == (len(keys), 0)


def test_a_long_run_is_in_history_while_it_runs_and_completed_in_place(
    dsn: str, schema: str
) -> None:
    """A run that outlives RUNNING_ROW_AFTER gets its 'running' row while it runs (history and
    the dashboard show it); its finish completes that row, it does not add a second one."""
    prepare(dsn, schema)
    release = threading.Event()
    app = tenure.Scheduler(dsn, schema=schema)

    @app.job("long", cron=NEVER, ttl="30s")
    def long(ctx: tenure.JobContext) -> None:
        release.wait(20)

    history = (
        "SELECT run_id, outcome, started_at, finished_at, recorded_at, worker_id, owner "
        "FROM {schema}.job_runs WHERE job_key = 'long'"
    )
    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        ops.trigger(client, "long", channel=channel("jobs", schema))
        [running] = wait_for(lambda: query(dsn, schema, history), timeout=10, what="a row")
        [(started_at, owner)] = query(
            dsn,
            schema,
            "SELECT running_started_at, running_owner FROM {schema}.scheduled_jobs "
            "WHERE job_key = 'long'",
        )
        release.set()
        [done] = wait_for(
            lambda: [r for r in query(dsn, schema, history) if r[1] != "running"],
            timeout=10,
            what="the finish",
        )
    assert running[1] == "running" and running[3] is None
    assert (running[2], running[4], running[6]) == (started_at, started_at, owner)
    assert (done[0], done[1], done[2], done[4], done[5]) == (
        running[0],
        "succeeded",
        started_at,
        started_at,
        running[5],
    )
    assert done[3] is not None and done[3] > started_at
    assert len(query(dsn, schema, history)) == 1


def test_a_worker_refuses_a_schema_before_the_one_it_needs(dsn: str, schema: str) -> None:
    """Its start statement records runs in migration 12's columns (and skipped slots in 13's):
    on an older schema every start failed, logged as a warning, slot after slot, instead of
    the worker refusing to start with what to do."""
    prepare(dsn, schema)
    query(dsn, schema, "DELETE FROM {schema}.tenure_migrations WHERE version >= 12")
    app = tenure.Scheduler(dsn, schema=schema)
    app.add_job("k", lambda ctx: None, cron=NEVER, ttl="30s")
    worker = InProcessWorker(app)
    with pytest.raises(AssertionError, match="worker failed"):
        worker.__enter__()
    assert isinstance(worker.error, tenure.SchemaNotReady), worker.error
    assert f"version 11, need {SCHEMA_VERSION}" in str(worker.error)
    assert "tenure migrate" in str(worker.error)


def test_a_claimed_every_job_is_due_at_its_following_slot_where_its_start_leaves_it(
    dsn: str, schema: str
) -> None:
    """The claim moves the job's due index entry out of the claims' way, and the start used to
    move it a second time, to the following slot: neither update could be heap-only. Now the
    claim of an `every` job due for its next slot puts it there at once (the earlier of that
    slot and its lease's expiry), so the start's update moves no index entry."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    app.add_job("e", lambda ctx: None, every="2s", ttl="30s")
    app.register()
    with tenure.connect(dsn, schema=schema) as client:
        # Claimed ahead of its slot (within 2.5 s: every slot of a 2 s job is).
        [claim] = claim_batch(client, 2.5, limit=5)[0]
        [(due_at, next_slot)] = query(
            dsn,
            schema,
            "SELECT due_at, next_slot FROM {schema}.scheduled_jobs WHERE job_key = 'e'",
        )
    assert next_slot == claim.state.next_slot
    assert due_at == next_slot + dt.timedelta(seconds=2) < claim.lease_until


def _job_row_updates(dsn: str, schema: str, every: str, runs_each: int = 3) -> tuple[int, int, int]:
    """20 jobs ``every`` so often (TTL 30 s) run at least ``runs_each`` times each by one
    worker: the succeeded runs, and the job rows' updates and heap-only updates meanwhile."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    keys = [f"k{n}" for n in range(20)]
    for key in keys:
        app.add_job(key, lambda ctx: None, every=every, ttl="30s")
    runs = "SELECT count(*) FROM {schema}.job_runs WHERE outcome = 'succeeded'"
    with InProcessWorker(app):
        wait_for(
            lambda: query(dsn, schema, runs)[0][0] >= runs_each * len(keys),
            timeout=10 + 4 * runs_each,
            what="runs",
        )
    [(done,)] = query(dsn, schema, runs)
    # A backend's counts reach pg_stat_user_tables when it goes idle or exits.
    _inserted, updated, hot = wait_for(
        lambda: (row := _writes(dsn, schema, "scheduled_jobs"))[1] >= 2 * done and row,
        timeout=15,
        what="the table statistics",
    )
    return done, updated, hot


def test_two_of_a_runs_three_job_row_updates_are_heap_only(dsn: str, schema: str) -> None:
    """Claim, start and finish each update the job's row. Only the claim has to move its
    entry in the due index (out of the way of the claims that follow); the start and the
    finish leave due_at where it is, so PostgreSQL writes no index entry for them (bench:
    bench/profile_worker.py's rows/run). Every 3 s: beyond KEEP_AHEAD, no job is kept."""
    done, updated, hot = _job_row_updates(dsn, schema, "3s")
    # Per run: 2 heap-only updates (the start and the finish) where the code before
    # bb4f598 made 1. Counted per succeeded run, not as a share of all updates: under load
    # skipped slots add updates that move due_at, and a page whose dead versions a
    # concurrent snapshot still sees has no room for a heap-only one (CI at load 10-17
    # measured 1.79-1.90 per run, 0.57-0.60 of all updates).
    assert updated >= 3 * done, (updated, hot, done)
    assert hot >= 1.5 * done, (updated, hot, done)


def test_a_kept_job_s_run_updates_its_job_row_twice(dsn: str, schema: str) -> None:
    """A job kept for its next run (every second) is not claimed: its start takes the lease
    over in the same update of the job's row (which moves the due index entry, as the claim
    did) and the finish's is heap-only (the start put the job's due time where the finish
    keeps it): two updates per run where the claim, the start and the finish made three. One
    run in eight lets its job go, and it is claimed again. Each job's first run is claimed,
    and its kept next run given back at the stop: four updates per job beside the runs'."""
    done, updated, hot = _job_row_updates(dsn, schema, "1s", runs_each=8)
    assert updated - 4 * 20 <= 2.3 * done, (updated, hot, done)
    assert hot >= 0.8 * done, (updated, hot, done)


def test_a_presence_beat_reads_the_worker_s_keys_once(dsn: str, schema: str) -> None:
    """The beat lists the app's jobs the worker's code lacks. Its anti-join against the
    worker's own keys was a nested loop, every job against every key: 0.6-0.9 s of server
    time per beat at 4,000 jobs (every 10 s, per worker), growing with the square. Now the
    keys are hashed once."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    keys = [f"k{n:04d}" for n in range(500)]
    for key in keys:
        app.add_job(key, lambda ctx: None, every="1s")
    app.register()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            named_query(schema, "sched_presence_enter"),
            {"worker": "w", "app": "a", "keys": keys, "host": "h", "pid": 1,
             "ttl": dt.timedelta(seconds=30)},
        )  # fmt: skip
        params = {"worker": "w", "app": "a", "ttl": dt.timedelta(seconds=30),
                  "loop_lag": None, "saturated": None, "keep_ahead": 2.0}  # fmt: skip
        [(doc,)] = conn.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + named_query(schema, "sched_presence_beat"),
            params,
        ).fetchall()
    scans = [n for n in _nodes(doc[0]["Plan"]) if n.get("CTE Name") == "mine"]
    assert scans and max(n["Actual Loops"] for n in scans) <= 1, json.dumps(scans)
