"""The scheduler against a real PostgreSQL: registration, misfire policies, lease loss during a
run, operator commands across processes, retention. Worker-process fault tests are in
test_scheduler_faults.py and test_scheduler_processes.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg import sql

import tenure
from tenure import metrics
from tenure.db.channels import channel
from tenure.scheduler import jobs as ops
from tenure.scheduler.background import prune_once
from tenure.scheduler.schedules import Schedule
from tests.support.env import ROOT, run_tenure, tenure_env
from tests.support.scheduler_apps import NEVER
from tests.support.scheduler_support import (
    InProcessWorker,
    WorkerProcess,
    prepare,
    query,
    wait_for,
    worker_processes,
)


def noop(ctx: tenure.JobContext) -> None:
    pass


@contextmanager
def captured(logger: str = "tenure.scheduler") -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    log = logging.getLogger(logger)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def runs(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT slot, kind, attempt, token, outcome, started_at, error FROM {schema}.job_runs "
        "WHERE job_key = %s ORDER BY run_id",
        (key,),
    )


# -- registration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "0 25 * * *"}, "invalid cron expression"),
        ({"cron": "0 2 * * *", "timezone": "Europe/Atlantis"}, "unknown time zone"),
        ({"every": "soon"}, "not a duration"),
        ({"every": "1s", "misfire": "sometimes"}, "misfire must be one of"),
        ({"every": "1s", "on_crash": "panic"}, "on_crash must be one of"),
        ({"every": "1s", "ttl": "0s"}, "ttl"),
        ({"every": "1s", "misfire_grace": -1}, "must not be negative"),
    ],
)
def test_bad_job_definitions_fail_at_registration(kwargs: dict[str, Any], message: str) -> None:
    app = tenure.Scheduler()
    with pytest.raises(tenure.InvalidArgument, match=message):
        app.job("bad", **kwargs)(noop)
    assert not app.jobs


def test_duplicate_key_non_callable_and_bad_signature_fail_at_registration() -> None:
    app = tenure.Scheduler()
    app.job("dup", every="1s")(noop)
    with pytest.raises(tenure.InvalidArgument, match="defined twice"):
        app.job("dup", every="5s")(noop)
    with pytest.raises(tenure.InvalidArgument, match="not callable"):
        app.add_job("x", 42, every="1s")  # type: ignore[arg-type]

    def two_args(ctx: tenure.JobContext, extra: int) -> None:
        pass

    with pytest.raises(tenure.InvalidArgument, match="must accept one argument"):
        app.job("y", every="1s")(two_args)  # type: ignore[arg-type]
    assert list(app.jobs) == ["dup"]


def _worker_cli(
    args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tenure", "worker", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("app", "message", "code"),
    [
        # Not MODULE:ATTR at all is bad usage (exit 2); the rest is found out by importing.
        ("scheduler_apps", "must look like MODULE:ATTRIBUTE", 2),
        ("tests.no_such_module:app", "no module named 'tests.no_such_module'", 1),
        ("tests.support.scheduler_apps:nothing", "has no attribute 'nothing'", 1),
        ("tests.support.scheduler_apps:NEVER", "is a str, not a tenure.Scheduler", 1),
    ],
)
def test_worker_refuses_a_bad_app_path(
    dsn: str, schema: str, app: str, message: str, code: int
) -> None:
    done = _worker_cli([app], tenure_env(dsn, schema), ROOT)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("tenure: error: ")


def test_bad_definition_stops_the_worker_before_it_registers_anything(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    (tmp_path / "badapp.py").write_text(
        "import tenure\n"
        "app = tenure.Scheduler()\n"
        "@app.job('good', every='1m')\n"
        "def good(ctx): pass\n"
        "@app.job('bad', cron='0 0 31 2 *')\n"  # February 31st never comes
        "def bad(ctx): pass\n"
    )
    done = _worker_cli(["badapp:app"], tenure_env(dsn, schema), tmp_path)
    assert done.returncode == 1
    assert "job 'bad': invalid cron expression '0 0 31 2 *'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert query(dsn, schema, "SELECT count(*) FROM {schema}.scheduled_jobs") == [(0,)]


def test_registration_upserts_and_the_newest_definition_wins(dsn: str, schema: str) -> None:
    prepare(dsn, schema)
    v1 = tenure.Scheduler(dsn, schema=schema)
    v1.job("report", every="10s", ttl="30s")(noop)
    v1.register()
    sel = (
        "SELECT revision, cron, every, timezone, ttl, next_slot, defined_at "
        "FROM {schema}.scheduled_jobs WHERE job_key = 'report'"
    )
    [first] = query(dsn, schema, sel)
    assert first[:5] == (1, None, dt.timedelta(seconds=10), "UTC", dt.timedelta(seconds=30))
    v1.register()  # an identical definition writes nothing
    assert query(dsn, schema, sel) == [first]

    v2 = tenure.Scheduler(dsn, schema=schema)
    v2.job("report", cron="0 3 * * *", timezone="Europe/Berlin", ttl="2m")(noop)
    with captured() as records:
        v2.register()
    [second] = query(dsn, schema, sel)
    assert second[:5] == (2, "0 3 * * *", None, "Europe/Berlin", dt.timedelta(minutes=2))
    local = second[5].astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (3, 0)
    changed = [r for r in records if "definition changed" in r.getMessage()]
    assert len(changed) == 1 and changed[0].levelno == logging.WARNING
    assert "every 10s -> cron '0 3 * * *' Europe/Berlin" in changed[0].getMessage()

    v3 = tenure.Scheduler(dsn, schema=schema)
    v3.job("report", cron="0 3 * * *", timezone="Europe/Berlin", ttl="5m")(noop)
    v3.register()
    [third] = query(dsn, schema, sel)
    assert third[0] == 3 and third[5] == second[5]  # only the ttl changed: same next slot


def test_registering_an_unchanged_definition_does_not_wait_for_a_locked_job_row(
    dsn: str, schema: str
) -> None:
    """A worker joining a busy fleet re-registers definitions that are already there, while
    the other workers' claims, starts and finishes hold those rows locked. Writing nothing
    must not wait for them (it waited past the statement timeout with 120,000 jobs)."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    app.job("busy", every="10s")(noop)
    app.register()
    with psycopg.connect(dsn) as holder:  # a claim's row lock, held
        holder.execute(
            sql.SQL("SELECT 1 FROM {}.scheduled_jobs WHERE job_key = 'busy' FOR UPDATE").format(
                sql.Identifier(schema)
            )
        )
        again = tenure.Scheduler(dsn, schema=schema)
        again.job("busy", every="10s")(noop)
        again.register()  # before: waited for the lock until "statement timeout"
        holder.rollback()


# -- misfire policies -------------------------------------------------------------------------

MIN = dt.timedelta(minutes=1)


def _key_with_newest_slot_late_by(dsn: str, low: float, high: float) -> tuple[str, dt.datetime]:
    """A job key whose every-minute slot grid puts the newest slot low..high seconds ago."""
    with tenure.connect(dsn) as c:
        now = c.now()
    for i in range(10_000):
        key = f"misfire-{i}"
        newest = Schedule.build(key, every=MIN).next_after(now) - MIN
        if low <= (now - newest).total_seconds() <= high:
            return key, newest
    raise AssertionError("no key found")


@pytest.mark.parametrize(
    ("misfire", "grace", "ran", "skipped"),
    [
        ("latest", None, [0], [-3, -2, -1]),
        ("latest", "2s", [], [-3, -2, -1, 0]),
        ("all", None, [-3, -2, -1, 0], []),
        ("all", "90s", [-1, 0], [-3, -2]),
        ("skip", None, [], [-3, -2, -1, 0]),
    ],
)
def test_misfire_policies_after_all_workers_were_down(
    dsn: str, schema: str, misfire: str, grace: str | None, ran: list[int], skipped: list[int]
) -> None:
    """The job's schedule stood still for 3 minutes (as if every worker were down): the
    slots newest-3min .. newest are due when a worker comes back. Newest is 5-12s late when
    the test starts: more than the 2s grace, and newest-1min less than 90s late even if the
    worker takes 15s to start."""
    prepare(dsn, schema)
    key, newest = _key_with_newest_slot_late_by(dsn, 5, 12)
    app = tenure.Scheduler(dsn, schema=schema)
    app.job(key, every="1m", misfire=misfire, misfire_grace=grace)(noop)
    app.register()
    query(
        dsn, schema, "UPDATE {schema}.scheduled_jobs SET next_slot = %s WHERE job_key = %s",
        (newest - 3 * MIN, key),
    )  # fmt: skip
    # The skipped slots are one history row with their count (issue 31).
    rows = len(ran) + bool(skipped)
    with InProcessWorker(app):
        wait_for(
            lambda: len([r for r in runs(dsn, schema, key) if r[4] != "running"]) == rows,
            timeout=20,
            what=f"{rows} history rows",
        )
    history = runs(dsn, schema, key)
    assert len(history) == rows
    ran_rows = [r for r in history if r[5] is not None]
    skipped_rows = query(
        dsn,
        schema,
        "SELECT slot, slots, coalesce(last_slot, slot), outcome FROM {schema}.job_runs "
        "WHERE job_key = %s AND started_at IS NULL",
        (key,),
    )
    assert [r[0] for r in ran_rows] == [newest + n * MIN for n in ran]
    assert {r[4] for r in ran_rows} <= {"succeeded"}
    assert [(r[0], r[1], r[2]) for r in skipped_rows] == (
        [(newest + skipped[0] * MIN, len(skipped), newest + skipped[-1] * MIN)] if skipped else []
    )
    assert {r[3] for r in skipped_rows} <= {"misfire_skipped"}
    tokens = [r[3] for r in ran_rows]
    assert tokens == sorted(set(tokens))  # oldest first, each run with a higher token
    [(next_slot,)] = query(
        dsn, schema, "SELECT next_slot FROM {schema}.scheduled_jobs WHERE job_key = %s", (key,)
    )
    assert next_slot == newest + MIN


# -- lease loss during a run ------------------------------------------------------------------


def test_async_job_is_cancelled_when_its_lease_is_lost_and_the_slot_retried(
    dsn: str, schema: str
) -> None:
    prepare(dsn, schema)
    started = threading.Event()
    seen: list[str] = []
    app = tenure.Scheduler(dsn, schema=schema)

    @app.job("async-job", cron=NEVER, ttl="1s")
    async def job(ctx: tenure.JobContext) -> None:
        if ctx.attempt == 1:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append(f"cancelled token {ctx.token}")
                raise
        else:
            stored = await ctx.results.put_async({"attempt": ctx.attempt})
            seen.append(f"stored token {stored.token}")
            try:
                ctx.results.put({"wrong": "thread"})
            except tenure.InvalidArgument as exc:
                seen.append(str(exc))

    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        ops.trigger(client, "async-job", channel=channel("jobs", schema))
        assert started.wait(10)
        assert client.release("async-job") is not None  # an operator expires the lease
        wait_for(
            lambda: [r[4] for r in runs(dsn, schema, "async-job")] == ["lease_lost", "succeeded"],
            timeout=15,
            what="the retry to succeed",
        )
        result = client.results.get("async-job")
    (slot1, kind1, att1, tok1, *_), (slot2, kind2, att2, tok2, *_) = runs(dsn, schema, "async-job")
    assert slot1 == slot2 and (kind1, kind2) == ("manual", "manual") and (att1, att2) == (1, 2)
    assert tok2 == tok1 + 1
    assert seen[0] == f"cancelled token {tok1}"
    assert seen[1] == f"stored token {tok2}"
    assert "use `await ctx.results.put_async(payload)`" in seen[2]
    assert result is not None and result.token == tok2


def test_sync_job_sees_check_raise_and_cancelled_when_its_lease_is_lost(
    dsn: str, schema: str
) -> None:
    prepare(dsn, schema)
    started = threading.Event()
    seen: list[Any] = []
    app = tenure.Scheduler(dsn, schema=schema)

    @app.job("sync-job", cron=NEVER, ttl="1s", on_crash="skip")
    def job(ctx: tenure.JobContext) -> None:
        started.set()
        deadline = time.monotonic() + 15
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(ctx.cancelled)
        try:
            ctx.check()
        except tenure.LeaseLost as exc:
            seen.append(exc)
            raise

    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        ops.trigger(client, "sync-job", channel=channel("jobs", schema))
        assert started.wait(10)
        client.release("sync-job")
        wait_for(
            lambda: [r[4] for r in runs(dsn, schema, "sync-job")] == ["lease_lost", "abandoned"],
            timeout=15,
            what="lease_lost, then abandoned (on_crash='skip')",
        )
    assert seen[0] is True and isinstance(seen[1], tenure.LeaseLost)
    history = runs(dsn, schema, "sync-job")
    assert history[1][5] is None  # abandoned: recorded, not run again
    assert "on_crash='skip'" in history[1][6]


# -- jobs this worker does not have, metrics --------------------------------------------------


def test_jobs_unknown_to_a_worker_are_left_alone_and_runs_emit_metrics(
    dsn: str, schema: str
) -> None:
    prepare(dsn, schema)
    theirs = tenure.Scheduler(dsn, schema=schema)
    theirs.job("theirs", every="1s")(noop)
    theirs.register()
    events: list[metrics.Event] = []
    unsubscribe = metrics.subscribe(events.append)
    mine = tenure.Scheduler(dsn, schema=schema)
    mine.job("mine", every="1s")(noop)
    try:
        with captured() as records, InProcessWorker(mine):
            wait_for(lambda: len(runs(dsn, schema, "mine")) >= 3, timeout=15, what="3 runs")
    finally:
        unsubscribe()
    assert runs(dsn, schema, "theirs") == []
    # Left out of its claims from the start (its presence beat, issue 31): never claimed only
    # to be given back, so no token was taken for it.
    left = [r.getMessage() for r in records if "this worker does not define it" in r.getMessage()]
    assert len(left) == 1 and "'theirs'" in left[0]
    assert not [r for r in records if "no function for it" in r.getMessage()]
    assert query(dsn, schema, "SELECT 1 FROM {schema}.job_leases WHERE job_key = 'theirs'") == []
    done = [e for e in events if e.name == metrics.JOB and e.job == "mine"]
    assert done and all(e.outcome == "succeeded" and e.value is not None for e in done)
    late = [e.value for e in events if e.name == metrics.JOB_LATENESS and e.job == "mine"]
    assert late and all(v is not None and 0 <= v < 5 for v in late)
    lines = [r.getMessage() for r in records]
    assert sum(" started: 1 jobs" in m for m in lines) == 1
    assert sum(" stopped: 1 jobs" in m for m in lines) == 1


# -- operator commands across processes -------------------------------------------------------


def evidence_count(dsn: str, schema: str, key: str) -> int:
    [(n,)] = query(dsn, schema, "SELECT count(*) FROM {schema}.evidence WHERE job_key = %s", (key,))
    return int(n)


def test_pause_resume_trigger_and_history_from_another_process(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    worker = WorkerProcess("many", env, tmp_path / "w.log", extra_env={"SCHED_JOBS": "2"})
    try:
        worker.wait_started()
        wait_for(lambda: evidence_count(dsn, schema, "tick-00") >= 1, timeout=10, what="a run")

        paused = run_tenure(["jobs", "pause", "tick-00"], env)
        assert paused.returncode == 0 and "tick-00: paused" in paused.stdout
        time.sleep(1.2)  # a run that had started when we paused may still finish
        before = evidence_count(dsn, schema, "tick-00")
        other = evidence_count(dsn, schema, "tick-01")
        time.sleep(2.5)
        assert evidence_count(dsn, schema, "tick-00") == before  # nothing while paused
        assert evidence_count(dsn, schema, "tick-01") >= other + 2  # the other job goes on
        listed = json.loads(run_tenure(["jobs", "list", "--json"], env).stdout)
        assert {j["job"]: j["paused"] for j in listed} == {
            "manual": False,
            "tick-00": True,
            "tick-01": False,
        }

        resumed = run_tenure(["jobs", "resume", "tick-00"], env)
        assert resumed.returncode == 0 and "resumed, next slot" in resumed.stdout
        wait_for(lambda: evidence_count(dsn, schema, "tick-00") > before, timeout=5, what="resume")

        triggered = run_tenure(["jobs", "trigger", "manual"], env)
        assert triggered.returncode == 0 and "manual: triggered at" in triggered.stdout
        wait_for(lambda: evidence_count(dsn, schema, "manual") == 1, timeout=5, what="trigger")
        time.sleep(1.0)
        assert evidence_count(dsn, schema, "manual") == 1  # once
        history = run_tenure(["jobs", "history", "manual", "--json"], env)
        [row] = json.loads(history.stdout)
        assert (row["kind"], row["outcome"], row["pid"]) == ("manual", "succeeded", worker.pid)

        unknown = run_tenure(["jobs", "trigger", "no-such-job"], env)
        assert unknown.returncode == 1 and "no scheduled job 'no-such-job'" in unknown.stderr
    finally:
        worker.stop()
    # Slots that passed while paused were not run, nor recorded as misfires.
    assert not [r for r in runs(dsn, schema, "tick-00") if r[4] == "misfire_skipped"]


# -- retention --------------------------------------------------------------------------------


def test_history_retention_prunes_old_finished_rows(client: tenure.Client, dsn: str) -> None:
    insert = (
        "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
        "started_at, outcome, recorded_at) VALUES (%s, now(), 'scheduled', %s, 'w', 'h', 1, "
        "now(), %s, now() - %s::interval)"
    )
    rows = [
        ("old", 1, "succeeded", "10 days"),
        ("old", 2, "running", "10 days"),
        ("new", 3, "succeeded", "1 hour"),
    ]
    for row in rows:
        query(dsn, client.schema, insert, row)
    [(deleted,)] = client.fetch(
        "sched_prune", {"retention": dt.timedelta(days=7), "batch": 100}, doing="pruning"
    )
    assert deleted == 1
    left = query(dsn, client.schema, "SELECT job_key, outcome FROM {schema}.job_runs ORDER BY 1")
    assert left == [("new", "succeeded"), ("old", "running")]


def test_pruning_keeps_up_with_more_than_one_batch_of_old_history(
    client: tenure.Client, dsn: str
) -> None:
    """At 1,000 runs/s a 10-minute prune interval sees 600,000 new rows: one bounded batch
    per interval would never catch up. A prune pass deletes batch after batch until the old
    history is gone (here 2.5 batches of 1,000)."""
    query(
        dsn,
        client.schema,
        "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
        "started_at, outcome, recorded_at) SELECT 'old', now(), 'scheduled', t, 'w', 'h', 1, "
        "now(), 'succeeded', now() - interval '10 days' FROM generate_series(1, 2500) t",
    )
    query(
        dsn,
        client.schema,
        "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
        "started_at, outcome, recorded_at) VALUES ('new', now(), 'scheduled', 1, 'w', 'h', 1, "
        "now(), 'succeeded', now())",
    )

    async def prune() -> int:
        async with await tenure.connect_async(dsn, schema=client.schema) as aclient:
            return await prune_once(aclient, dt.timedelta(days=7), batch=1000)

    assert asyncio.run(prune()) == 2500
    left = query(dsn, client.schema, "SELECT job_key, count(*) FROM {schema}.job_runs GROUP BY 1")
    assert left == [("new", 1)]


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        ((), "history kept 7d (inbox claims 30d)"),
        (("--retention", "2d", "--inbox-retention", "40d"), "history kept 2d (inbox claims 40d)"),
    ],
)
def test_the_worker_says_what_history_it_keeps_and_its_flags_override_the_app(
    dsn: str, schema: str, tmp_path: Path, args: tuple[str, ...], kept: str
) -> None:
    """The defaults when the app and the operator say nothing; the operator's flags win."""
    prepare(dsn, schema)
    with worker_processes(1, "slow", tenure_env(dsn, schema), tmp_path, args=args) as [worker]:
        started = [line for line in worker.log().splitlines() if " started: " in line]
    assert len(started) == 1 and started[0].endswith(kept), started
