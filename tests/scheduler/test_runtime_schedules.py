"""Runtime schedules (issue 27) through the Python API, against the real database: stored as
scheduled_jobs rows naming a task, added idempotently, in the caller's transaction, in bulk;
refused input changes nothing; every change is recorded; a change commits at one instant
(invariant 8): a claim planned with the old definition cannot start; a removed and re-added
key keeps its token floor."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest

import tenure
from tenure.scheduler.claim import start_params
from tenure.scheduler.definitions import MAX_ARGS_BYTES
from tenure.scheduler.schedules import NEVER, plan
from tests.hardening.hostile import stored
from tests.support.scheduler_support import claim_batch, query


@pytest.fixture
def client(dsn: str, schema: str) -> Any:
    with tenure.connect(dsn, schema=schema, migrate=True) as c:
        yield c


def rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT job_key, task, args, every, cron, timezone, revision FROM {schema}.scheduled_jobs "
        "ORDER BY job_key",
    )


def test_add_stores_a_row_the_claim_path_runs_and_show_reads_it_back(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    done = tenure.add_schedule(
        client,
        "tenant-42:report",
        task="reports.send",
        cron="0 9 * * *",
        timezone="Europe/Paris",
        args={"tenant": 42},
    )
    assert done == "added"
    [row] = rows(dsn, schema)
    assert row == (
        "tenant-42:report",
        "reports.send",
        {"tenant": 42},
        None,
        "0 9 * * *",
        "Europe/Paris",
        1,
    )
    info = tenure.get_schedule(client, "tenant-42:report")
    assert info is not None and info.args == {"tenant": 42} and info.task == "reports.send"
    assert info.next_slot is not None
    local = info.next_slot.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (9, 0)
    [change] = tenure.schedule_changes(client, "tenant-42:report")
    assert change.action == "add" and change.before is None
    assert change.after is not None and change.after["args"] == {"tenant": 42}
    [(role,)] = query(dsn, schema, "SELECT current_user")
    assert change.role == role and change.application_name != ""
    # A coded job's listing shows it too, and the claim path takes it (a fence row exists).
    [(token,)] = query(
        dsn, schema, "SELECT token FROM {schema}.job_state WHERE job_key = 'tenant-42:report'"
    )
    assert token == 0


def test_if_exists_error_keep_replace(client: tenure.Client, dsn: str, schema: str) -> None:
    tenure.add_schedule(client, "feed", task="poll", every="5m", args={"url": "a"})
    with pytest.raises(tenure.ScheduleConflict, match="already exists"):
        tenure.add_schedule(client, "feed", task="poll", every="1m", args={"url": "b"})
    assert (
        tenure.add_schedule(
            client, "feed", task="poll", every="1m", args={"url": "b"}, if_exists="keep"
        )
        == "kept"
    )
    assert rows(dsn, schema)[0][2] == {"url": "a"}
    assert (
        tenure.add_schedule(
            client, "feed", task="poll", every="5m", args={"url": "a"}, if_exists="replace"
        )
        == "unchanged"
    )
    assert rows(dsn, schema)[0][6] == 1  # the same definition bumps nothing
    assert (
        tenure.add_schedule(
            client, "feed", task="poll", every="5m", args={"url": "b"}, if_exists="replace"
        )
        == "changed"
    )
    assert rows(dsn, schema)[0][2:] == ({"url": "b"}, dt.timedelta(minutes=5), None, "UTC", 2)
    actions = [c.action for c in tenure.schedule_changes(client, "feed")]
    assert actions == ["replace", "add"]


def test_in_the_callers_transaction(client: tenure.Client, dsn: str, schema: str) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.transaction(force_rollback=True):
            tenure.add_schedule(
                conn, "acct-1", task="welcome", at="2099-01-01T00:00Z", schema=schema
            )
            assert tenure.get_schedule(conn, "acct-1", schema=schema) is not None
        assert rows(dsn, schema) == []  # rolled back with the caller's transaction
        with conn.transaction():
            conn.execute("SELECT 1")  # the caller's own write would be here
            tenure.add_schedule(
                conn, "acct-1", task="welcome", at="2099-01-01T00:00Z", schema=schema
            )
    [row] = rows(dsn, schema)
    assert row[0] == "acct-1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": "5m", "args": "{not json"}, "args are not JSON"),
        ({"every": "5m", "args": "[1, 2]"}, "must be a JSON object"),
        ({"every": "5m", "args": {"x": "y" * MAX_ARGS_BYTES}}, "over the limit"),
        (
            {"every": "5m", "start": "2030-01-02T00:00Z", "end": "2030-01-01T00:00Z"},
            "is before start",
        ),
        ({"every": "5m", "cron": "* * * * *"}, "exactly one of"),
        ({"at": "2001-01-01T00:00Z"}, "has passed"),
        ({"every": "1m", "jitter": "2m"}, "must be shorter than the gap"),
        ({"every": "5m", "overlap": "queue"}, "overlap must be one of"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    client: tenure.Client, dsn: str, schema: str, kwargs: dict[str, Any], message: str
) -> None:
    tenure.add_schedule(client, "kept", task="t", every="1h", args={"a": 1})
    before = stored(dsn, schema)
    with pytest.raises(tenure.InvalidArgument, match=message) as caught:
        tenure.add_schedule(client, "kept", task="t", if_exists="replace", **kwargs)
    assert "\n" not in str(caught.value)
    assert stored(dsn, schema) == before


def test_unknown_task_is_refused_once_workers_registered_their_tasks(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    # Before any worker registered tasks, any name is accepted (the workers come later).
    tenure.add_schedule(client, "early", task="later.task", every="1h")
    app = tenure.Scheduler(dsn, schema=schema, name="billing")
    app.task("invoices.send")(lambda ctx: None)
    app.register()  # as a deploy step or a starting worker does
    before = stored(dsn, schema)
    with pytest.raises(tenure.InvalidArgument, match=r"unknown task 'invoices\.sned'"):
        tenure.add_schedule(client, "x", task="invoices.sned", every="1h")
    with pytest.raises(tenure.InvalidArgument, match="app 'billing' registered"):
        tenure.add_schedule(client, "x", task="nope", every="1h", app="billing")
    assert stored(dsn, schema) == before
    tenure.add_schedule(client, "x", task="invoices.send", every="1h")
    info = tenure.get_schedule(client, "x")
    assert info is not None and info.app == "billing"  # only its app's workers claim it


def test_coded_jobs_and_runtime_schedules_do_not_take_each_others_keys(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    app = tenure.Scheduler(dsn, schema=schema, name="coded")
    app.job("nightly", cron="0 2 * * *")(lambda ctx: None)
    app.register()
    with pytest.raises(tenure.ScheduleConflict, match="is a coded job"):
        tenure.add_schedule(client, "nightly", task="t", every="1h", if_exists="replace")
    with pytest.raises(tenure.ScheduleConflict, match="is a coded job"):
        tenure.remove_schedule(client, "nightly")
    tenure.add_schedule(client, "dynamic", task="t", every="1h")
    other = tenure.Scheduler(dsn, schema=schema, name="coded")
    other.job("dynamic", every="1m")(lambda ctx: None)
    with pytest.raises(tenure.JobOwnedByAnotherApp, match="is a runtime schedule"):
        other.register()
    assert [r[0] for r in rows(dsn, schema)] == ["dynamic", "nightly"]
    assert rows(dsn, schema)[0][1] == "t"


def test_bulk_add_in_one_statement_then_list_and_search_by_page(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    defs = [
        tenure.schedule_def(f"tenant-{i:05d}", task="reports.send", every="1d", args={"tenant": i})
        for i in range(5000)
    ]
    outcomes = tenure.add_schedules(client, defs)
    assert set(outcomes.values()) == {"added"} and len(outcomes) == 5000
    page = tenure.list_schedules(client, limit=100)
    assert [s.key for s in page] == [f"tenant-{i:05d}" for i in range(100)]
    nxt = tenure.list_schedules(client, after=page[-1].key, limit=100)
    assert nxt[0].key == "tenant-00100"
    found = tenure.list_schedules(client, search="-0420", limit=100)
    assert [s.key for s in found] == [f"tenant-0420{d}" for d in range(10)]
    assert found[0].args == {"tenant": 4200}
    # Again with keep: nothing changes, and nothing is recorded twice.
    again = tenure.add_schedules(client, defs, if_exists="keep")
    assert set(again.values()) == {"kept"}
    [(changes,)] = query(dsn, schema, "SELECT count(*) FROM {schema}.schedule_changes")
    assert changes == 5000


def _start(client: tenure.Client, claim: Any) -> list[tuple[Any, ...]]:
    decided = plan(claim.schedule(), claim.policy(), claim.state, claim.at, claim.token)
    return client.fetch(
        "sched_start",
        start_params([(claim, decided)], worker="w", host="h", pid=1),
        doing="starting",
        wrote=True,
    )


def test_a_claim_planned_before_a_change_cannot_start_after_it(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """Invariant 8: the claim read definition revision 1; the change commits; the start of
    that claim is refused (no run under the old args) and its lease released, so the next
    claim runs the new definition at once."""
    tenure.add_schedule(client, "k", task="t", every="1h", args={"v": 1})
    query(dsn, schema, "UPDATE {schema}.scheduled_jobs SET next_slot = clock_timestamp()")
    [claim], _ = claim_batch(client, app="any")
    assert claim.args == {"v": 1} and claim.task == "t"
    tenure.update_schedule(client, "k", args={"v": 2})
    assert _start(client, claim) == []  # refused: revision moved
    [(held,)] = query(
        dsn, schema, "SELECT lease_until < clock_timestamp() FROM {schema}.job_leases"
    )
    assert held  # released
    [again], _ = claim_batch(client, app="any")
    assert again.args == {"v": 2} and again.token == claim.token + 1
    assert [r[0] for r in _start(client, again)] == ["k"]


def test_a_claim_of_a_removed_or_paused_schedule_cannot_start(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    for key in ("gone", "paused"):
        tenure.add_schedule(client, key, task="t", every="1h")
    query(dsn, schema, "UPDATE {schema}.scheduled_jobs SET next_slot = clock_timestamp()")
    claims, _ = claim_batch(client, app="any")
    by_key = {c.job_key: c for c in claims}
    assert tenure.remove_schedule(client, "gone")
    from tenure.db.channels import channel
    from tenure.scheduler.jobs import pause

    pause(client, "paused", channel=channel("jobs", schema))
    assert _start(client, by_key["gone"]) == []
    assert _start(client, by_key["paused"]) == []
    [change, _add] = tenure.schedule_changes(client, "gone")
    assert change.action == "remove" and change.after is None and change.before is not None


def test_a_removed_and_re_added_key_keeps_its_token_floor(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    tenure.add_schedule(client, "k", task="t", every="1h")
    query(dsn, schema, "UPDATE {schema}.scheduled_jobs SET next_slot = clock_timestamp()")
    [first], _ = claim_batch(client, app="any")
    assert tenure.remove_schedule(client, "k")
    assert not tenure.remove_schedule(client, "k")
    query(dsn, schema, "UPDATE {schema}.job_leases SET lease_until = clock_timestamp()")
    tenure.add_schedule(client, "k", task="t", every="1h")
    query(dsn, schema, "UPDATE {schema}.scheduled_jobs SET next_slot = clock_timestamp()")
    [second], _ = claim_batch(client, app="any")
    assert second.token > first.token


def test_update_changes_the_arguments_and_keeps_the_next_slot(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    tenure.add_schedule(client, "k", task="t", every="1h", args={"v": 1})
    slot = tenure.get_schedule(client, "k").next_slot  # type: ignore[union-attr]
    assert tenure.update_schedule(client, "k", args={"v": 2}) == "changed"
    info = tenure.get_schedule(client, "k")
    assert info is not None and info.args == {"v": 2} and info.next_slot == slot
    assert info.revision == 2
    assert tenure.update_schedule(client, "k", every="2h") == "changed"
    with pytest.raises(tenure.UnknownJob):
        tenure.update_schedule(client, "nope", args={})
    [upd, upd1, _add] = tenure.schedule_changes(client, "k")
    assert upd.action == "update" and upd.before["every"] == "01:00:00"  # type: ignore[index]
    assert upd1.after["args"] == {"v": 2}  # type: ignore[index]


def test_a_one_shot_ends_after_its_run() -> None:
    definition = tenure.schedule_def("once", task="t", at="2030-01-01T02:00+01:00")
    s = definition.schedule
    now = dt.datetime(2029, 1, 1, tzinfo=dt.UTC)
    assert s.next_after(now) == dt.datetime(2030, 1, 1, 1, 0, tzinfo=dt.UTC)
    assert s.next_after(dt.datetime(2030, 1, 1, 1, 0, tzinfo=dt.UTC)) == NEVER
    assert json.loads(json.dumps(definition.row(now)))["run_at"].startswith("2030-01-01T01:00")


def test_jobs_list_pause_and_resume_work_on_runtime_schedules(
    client: tenure.Client, schema: str
) -> None:
    from tenure.db.channels import channel
    from tenure.scheduler.jobs import list_jobs, pause, resume

    tenure.add_schedule(client, "once", task="t", at="2099-01-01T00:00Z")
    [job] = list_jobs(client)
    assert job.task == "t" and job.schedule.startswith("at 2099-01-01T00:00:00")
    assert pause(client, "once", channel=channel("jobs", schema))
    resumed = resume(client, "once", channel=channel("jobs", schema))
    assert resumed is not None
    assert resumed.next_slot == dt.datetime(2099, 1, 1, tzinfo=dt.UTC)


# -- the plan's rules for runtime schedules (pure: database times passed in) -----------------

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def _every(seconds: int, **options: Any) -> Any:
    from tenure.scheduler.schedules import Schedule

    base = Schedule.build("k", every=dt.timedelta(seconds=seconds))
    return __import__("dataclasses").replace(base, **options)


def _first(schedule: Any) -> dt.datetime:
    return schedule.next_after(T0)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("overlap", "runs"), [("skip", False), ("buffer_one", True)])
def test_overlap_skips_or_buffers_the_slots_that_came_while_the_previous_run_held_the_job(
    overlap: str, runs: bool
) -> None:
    from tenure.scheduler.schedules import JobState, Policy

    s = _every(10)
    first = _first(s)
    # The previous run held the lease until 25 s after `first`: slots +10 and +20 came then.
    state = JobState(first + dt.timedelta(seconds=10), freed_at=first + dt.timedelta(seconds=25))
    decided = plan(s, Policy(overlap=overlap), state, first + dt.timedelta(seconds=26), 5)
    if runs:
        assert decided.run_slot == first + dt.timedelta(seconds=20)
        [skip] = decided.skipped
        assert (skip.slot, skip.count) == (first + dt.timedelta(seconds=10), 1)
    else:
        assert decided.run_slot is None
        [skip] = decided.skipped
        assert skip.count == 2 and "overlap='skip'" in skip.error
    assert decided.next_slot == first + dt.timedelta(seconds=30)
    # A slot after the lease ended is not an overlap: it runs under the misfire policy.
    later = plan(s, Policy(overlap="skip"), state, first + dt.timedelta(seconds=31), 5)
    assert later.run_slot == first + dt.timedelta(seconds=30)


def test_max_runs_ends_the_schedule_after_its_last_run() -> None:
    from tenure.scheduler.schedules import JobState, Policy

    s = _every(10)
    first = _first(s)
    last = plan(s, Policy(max_runs=3), JobState(first, runs_started=2), first, 1)
    assert last.run_slot == first and last.next_slot == NEVER
    over = plan(s, Policy(max_runs=3), JobState(first, runs_started=3), first, 1)
    assert over.run_slot is None and over.next_slot == NEVER


def test_backfill_runs_its_slots_one_per_claim_then_ends() -> None:
    from tenure.scheduler.schedules import JobState, Policy

    s = _every(3600)
    first = _first(s)
    to = first + dt.timedelta(hours=1)
    state = JobState(first + dt.timedelta(days=1), backfill_next=first, backfill_to=to)
    one = plan(s, Policy(), state, first + dt.timedelta(hours=5), 1)
    assert (one.run_slot, one.run_kind, one.backfill_next) == (first, "backfill", to)
    state = JobState(first + dt.timedelta(days=1), backfill_next=to, backfill_to=to)
    two = plan(s, Policy(), state, first + dt.timedelta(hours=5), 2)
    assert (two.run_slot, two.backfill_from, two.backfill_next) == (to, to, None)
    # A backfill run left unfinished is retried as a backfill run, its slot not "done".
    crashed = JobState(
        first + dt.timedelta(days=1), running_slot=to, running_kind="backfill", running_token=2
    )
    retry = plan(s, Policy(), crashed, first + dt.timedelta(hours=5), 3)
    assert (retry.run_slot, retry.run_kind, retry.done_slot) == (to, "backfill", None)


def test_jitter_is_stable_below_the_gap_and_bounds_apply() -> None:
    s = _every(
        60,
        jitter_us=20_000_000,
        starts_at=T0 + dt.timedelta(minutes=5),
        ends_at=T0 + dt.timedelta(minutes=10),
    )
    slots = list(__import__("itertools").islice(s.iter_after(T0), 7))
    assert slots[-1] == NEVER and slots[-2] == NEVER
    real = [x for x in slots if x != NEVER]
    assert len(real) == 5 and real == sorted(real)
    assert all(
        T0 + dt.timedelta(minutes=5) <= x < T0 + dt.timedelta(minutes=10, seconds=20) for x in real
    )
    assert real == [x for x in __import__("itertools").islice(s.iter_after(T0), 5)]
    # Every worker computes the same jitter; each slot starts after its nominal instant.
    nominal = _every(60).next_after(T0 + dt.timedelta(minutes=5) - dt.timedelta(microseconds=1))
    assert dt.timedelta(0) <= real[0] - nominal < dt.timedelta(seconds=20)
    assert s.next_after(real[0]) == real[1]


def test_a_task_no_worker_has_is_reported_once_not_retried_in_a_loop(
    client: tenure.Client, dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Added before any worker registered its tasks (so any app's worker may claim it), a
    schedule of a task this worker lacks is logged once, given back and left alone, while
    the worker's own task keeps running."""
    from tests.support.scheduler_support import InProcessWorker, wait_for

    tenure.add_schedule(client, "orphan", task="nobody.has.this", every="1s")
    ran: list[int] = []
    app = tenure.Scheduler(dsn, schema=schema, name="mine")
    app.task("mine.tick")(lambda ctx: ran.append(ctx.token))
    caplog.set_level("WARNING", logger="tenure")
    with InProcessWorker(app):
        wait_for(lambda: "task 'nobody.has.this'" in caplog.text, timeout=20, what="the report")
        [(token,)] = query(
            dsn, schema, "SELECT fencing_token FROM {schema}.job_leases WHERE job_key = 'orphan'"
        )
        tenure.add_schedule(client, "own", task="mine.tick", every="1s")
        wait_for(lambda: len(ran) >= 3, timeout=20, what="three runs of the worker's own task")
        [(after,)] = query(
            dsn, schema, "SELECT fencing_token FROM {schema}.job_leases WHERE job_key = 'orphan'"
        )
    assert after == token  # claimed once, never again
    assert caplog.text.count("task 'nobody.has.this'") == 1


@pytest.mark.parametrize(
    "args",
    [
        {"deep": __import__("functools").reduce(lambda acc, _: [acc], range(10_000), 1)},
        '{"deep": ' + "[" * 10_000 + "]" * 10_000 + "}",
        {"nan": float("nan")},
        {"key\x00": 1},
        {"s": "\ud800"},
        {"set": {1, 2}},
    ],
    ids=["deep", "deep-text", "nan", "nul-key", "surrogate", "set"],
)
def test_args_json_cannot_store_are_refused_in_one_line(args: Any) -> None:
    with pytest.raises(tenure.InvalidArgument) as caught:
        tenure.schedule_def("k", task="t", every="1h", args=args)
    assert "\n" not in str(caught.value)
