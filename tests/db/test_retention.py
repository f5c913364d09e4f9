"""Retention (tenure.db.retention, `tenure prune`): each table pruned by age in bounded
batches, and what must never be pruned is not: a running run, a slot that can still be asked
for, an undelivered or dead message, an inbox claim a redelivery could still need, a lease.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tenure
from tenure.db import pruning
from tenure.db import retention as rt
from tenure.exec.slots import EARLY_TOLERANCE, record_slot, slot_state
from tenure.scheduler import background
from tests.support.env import run_tenure, tenure_env

OLD = "10 days"  # past the default 7-day retention
NEW = "1 hour"


def run(dsn: str, schema: str, text: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql.SQL(text).format(schema=sql.Identifier(schema)), params)
        return cur.fetchall() if cur.description else []


def seed(dsn: str, schema: str, table: str, n: int, age: str, *, key: str = "k") -> None:
    """``n`` rows of ``table`` that retention may delete once ``age`` is past it."""
    if table == "job_runs":
        run(
            dsn,
            schema,
            "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
            "started_at, outcome, recorded_at) SELECT %s, now(), 'scheduled', t, 'w', 'h', 1, "
            "now(), 'succeeded', now() - %s::interval FROM generate_series(1, %s) t",
            (key, age, n),
        )
    elif table == "exec_runs":
        run(
            dsn,
            schema,
            "INSERT INTO {schema}.exec_runs (job_key, token, host, pid, started_at, outcome, "
            "recorded_at) SELECT %s, t, 'h', 1, now(), 'succeeded', now() - %s::interval "
            "FROM generate_series(1, %s) t",
            (key, age, n),
        )
    elif table == "exec_slots":
        run(
            dsn,
            schema,
            "INSERT INTO {schema}.exec_slots (job_key, slot, token, completed_at, open_until) "
            "SELECT %s, %s || t, 1, now() - %s::interval, now() - %s::interval "
            "FROM generate_series(1, %s) t",
            (key, f"{age}-", age, age, n),
        )
    elif table == "outbox":
        run(
            dsn,
            schema,
            "INSERT INTO {schema}.outbox (topic, key, payload, state, delivered_at, created_at) "
            "SELECT 't', %s || t, '{{}}', 'delivered', now() - %s::interval, "
            "now() - %s::interval FROM generate_series(1, %s) t",
            (f"{key}-{age}-", age, age, n),
        )
    elif table == "lease_events":
        run(
            dsn,
            schema,
            "INSERT INTO {schema}.lease_events (job_key, token, event, at) "
            "SELECT %s, t, 'acquired', now() - %s::interval FROM generate_series(1, %s) t",
            (key, age, n),
        )
    elif table == "inbox":
        run(
            dsn,
            schema,
            "INSERT INTO {schema}.inbox (consumer, key, applied_at) "
            "SELECT 'c', %s || t, now() - %s::interval FROM generate_series(1, %s) t",
            (f"{key}-{age}-", age, n),
        )


def count(dsn: str, schema: str, table: str) -> int:
    [(n,)] = run(dsn, schema, f"SELECT count(*) FROM {{schema}}.{table}")
    return int(n)


POLICY = rt.Retention.of("7d", "30d")


@pytest.mark.parametrize("table", rt.NAMES)
def test_each_table_is_pruned_by_age_in_bounded_batches(
    client: tenure.Client, dsn: str, schema: str, table: str
) -> None:
    old = "40 days" if table == "inbox" else OLD  # the inbox keeps 30 days by default
    seed(dsn, schema, table, 25, old)
    seed(dsn, schema, table, 2, NEW, key="new")
    # One statement deletes one batch, however much is due.
    first = pruning.prune(client, POLICY, tables=[table], batch=10, max_batches=1)
    assert first == {table: 10}
    assert count(dsn, schema, table) == 17
    # A pass repeats batches until one comes back short; the young rows stay.
    assert pruning.prune(client, POLICY, tables=[table], batch=10, pause=0) == {table: 15}
    assert count(dsn, schema, table) == 2
    assert pruning.prune(client, POLICY, tables=[table], batch=10) == {table: 0}


def test_old_lease_events_are_pruned_by_workers_and_exec(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """Migration 18's lease events (bare leases' takeovers and refused writes) are history:
    pruned by age like job_runs, by every worker and by tenure exec's own pass; a young
    event stays."""
    assert "lease_events" in rt.WORKER_TABLES and "lease_events" in rt.EXEC_TABLES
    seed(dsn, schema, "lease_events", 3, OLD)
    client.acquire("young", ttl=30)  # records its own event, now
    assert pruning.prune(client, POLICY, tables=["lease_events"]) == {"lease_events": 3}
    assert run(dsn, schema, "SELECT job_key, event FROM {schema}.lease_events") == [
        ("young", "acquired")
    ]


def test_dry_run_counts_without_deleting(client: tenure.Client, dsn: str, schema: str) -> None:
    for table in rt.NAMES:
        seed(dsn, schema, table, 3, "40 days")
        seed(dsn, schema, table, 1, NEW, key="new")
    assert pruning.preview(client, POLICY) == dict.fromkeys(rt.NAMES, 3)
    assert all(count(dsn, schema, t) == 4 for t in rt.NAMES)


def test_never_a_running_run(client: tenure.Client, dsn: str, schema: str) -> None:
    # job_runs: a row still 'running' is never pruned, however old.
    run(
        dsn,
        schema,
        "INSERT INTO {schema}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
        "started_at, outcome, recorded_at) VALUES ('job', now(), 'scheduled', 1, 'w', 'h', 1, "
        "now(), 'running', now() - interval '1 year')",
    )
    # exec_runs: 'running' under a live lease with its token is kept; 'running' rows whose
    # lease moved on (a newer token) or never existed are abandoned runs and go.
    lease = client.acquire("live", ttl=60)
    assert lease is not None
    insert = (
        "INSERT INTO {schema}.exec_runs (job_key, token, host, pid, started_at, outcome, "
        "recorded_at) VALUES (%s, %s, 'h', 1, now(), 'running', now() - interval '1 year')"
    )
    run(dsn, schema, insert, ("live", lease.token))
    run(dsn, schema, insert, ("live", lease.token - 1 if lease.token > 1 else 10**9))
    run(dsn, schema, insert, ("gone", 1))
    counts = pruning.prune(client, POLICY, tables=["job_runs", "exec_runs"])
    assert counts == {"job_runs": 0, "exec_runs": 2}
    assert run(dsn, schema, "SELECT job_key, token, outcome FROM {schema}.exec_runs") == [
        ("live", lease.token, "running")
    ]
    assert count(dsn, schema, "job_runs") == 1
    lease.release()


def test_never_a_slot_that_can_still_be_asked_for(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    # A slot named by the caller (--slot VALUE alone) may be asked for again at any time:
    # no open_until, never pruned, however long ago it completed.
    run(
        dsn,
        schema,
        "INSERT INTO {schema}.exec_slots (job_key, slot, token, completed_at) "
        "VALUES ('named', '2020-01-01', 1, now() - interval '5 years')",
    )
    # A periodic slot completed long ago whose window is still open (a long period) stays.
    run(
        dsn,
        schema,
        "INSERT INTO {schema}.exec_slots (job_key, slot, token, completed_at, open_until) "
        "VALUES ('monthly', 'open', 1, now() - interval '1 year', now() + interval '1 day')",
    )
    seed(dsn, schema, "exec_slots", 1, OLD, key="closed")
    assert pruning.prune(client, POLICY, tables=["exec_slots"]) == {"exec_slots": 1}
    assert {r[0] for r in run(dsn, schema, "SELECT job_key FROM {schema}.exec_slots")} == {
        "named",
        "monthly",
    }


def test_completed_slots_record_the_end_of_their_window(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """What tenure exec and @tenure.once write: a slot from --every P is named from the early
    tolerance (2 s) before its time until that long before the next slot, so its window ends
    at its time plus P less 2 s; a slot named by the caller has no end."""
    periodic = slot_state(client, "job", None, 600)
    named = slot_state(client, "job", "2026-12-01", None)
    with client.lease("job", ttl=30) as lease:
        record_slot(client, lease, periodic.slot, open_until=periodic.open_until)
        record_slot(client, lease, named.slot, open_until=named.open_until)
    rows = dict(
        run(
            dsn,
            schema,
            "SELECT slot, open_until - slot::timestamptz FROM {schema}.exec_slots "
            "WHERE slot LIKE '%%Z'",
        )
    )
    assert rows == {periodic.slot: dt.timedelta(seconds=600 - EARLY_TOLERANCE)}
    [(open_until,)] = run(
        dsn, schema, "SELECT open_until FROM {schema}.exec_slots WHERE slot = '2026-12-01'"
    )
    assert open_until is None


def test_never_an_undelivered_or_dead_message(client: tenure.Client, dsn: str, schema: str) -> None:
    for state in ("pending", "dead"):
        run(
            dsn,
            schema,
            "INSERT INTO {schema}.outbox (topic, key, payload, state, created_at, "
            "last_attempt_at) VALUES ('t', %s, '{{}}', %s, now() - interval '1 year', "
            "now() - interval '1 year')",
            (state, state),
        )
    seed(dsn, schema, "outbox", 1, OLD)
    assert pruning.prune(client, POLICY, tables=["outbox"]) == {"outbox": 1}
    assert sorted(r[0] for r in run(dsn, schema, "SELECT state FROM {schema}.outbox")) == [
        "dead",
        "pending",
    ]


def test_never_an_inbox_claim_a_redelivery_could_need(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """A dead message can be re-driven at any time: while it exists, no claim applied after
    it was created goes, whatever its age (claims from before it were for other messages)."""
    run(
        dsn,
        schema,
        "INSERT INTO {schema}.outbox (topic, key, payload, state, created_at) "
        "VALUES ('t', 'stuck', '{{}}', 'dead', now() - interval '50 days')",
    )
    seed(dsn, schema, "inbox", 3, "60 days", key="before")
    seed(dsn, schema, "inbox", 2, "40 days", key="after")
    assert pruning.prune(client, POLICY, tables=["inbox"]) == {"inbox": 3}
    assert count(dsn, schema, "inbox") == 2
    # Once the message is delivered (or purged), nothing can redeliver it: age alone decides.
    run(dsn, schema, "UPDATE {schema}.outbox SET state = 'delivered', delivered_at = now()")
    assert pruning.prune(client, POLICY, tables=["inbox"]) == {"inbox": 2}


def test_never_a_lease(client: tenure.Client, dsn: str, schema: str) -> None:
    """Leases and fence rows are never deleted (a token must only go up), expired or not."""
    held = client.acquire("held", ttl=60)
    expired = client.acquire("expired", ttl=0.05)
    assert held is not None and expired is not None
    run(dsn, schema, "UPDATE {schema}.job_leases SET acquired_at = now() - interval '1 year'")
    for table in rt.NAMES:
        seed(dsn, schema, table, 2, "40 days")
    pruning.prune(client, rt.Retention.of("1s", "1d"))
    assert [i.job_key for i in client.leases()] == ["expired", "held"]
    assert count(dsn, schema, "job_state") == 2
    held.release()


def test_pruning_skips_locked_rows_instead_of_waiting(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """A row another transaction holds (a finishing run, a claim) is left for the next pass:
    the pruner never queues behind it, nor does the other transaction queue behind the
    pruner's batch for longer than one short statement."""
    seed(dsn, schema, "exec_runs", 3, OLD)
    with psycopg.connect(dsn) as other:
        other.execute(
            sql.SQL("SELECT 1 FROM {}.exec_runs WHERE token = 1 FOR UPDATE").format(
                sql.Identifier(schema)
            )
        )
        assert pruning.prune(client, POLICY, tables=["exec_runs"]) == {"exec_runs": 2}
        other.rollback()
    assert pruning.prune(client, POLICY, tables=["exec_runs"]) == {"exec_runs": 1}


@pytest.mark.parametrize(
    ("history", "inbox", "error"),
    [
        ("0s", "30d", tenure.InvalidArgument),
        ("soon", "30d", tenure.InvalidArgument),
        ("-1d", "30d", tenure.InvalidArgument),
        (True, "30d", tenure.InvalidArgumentType),
        ("7d", "12h", tenure.InvalidArgument),  # shorter than the inbox's floor
        ("7d", "999999999d", tenure.InvalidArgument),
    ],
)
def test_bad_retention_is_refused(history: Any, inbox: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        rt.Retention.of(history, inbox)
    with pytest.raises(error):
        tenure.Scheduler(history_retention=history, inbox_retention=inbox)


def test_a_bad_batch_is_refused(client: tenure.Client) -> None:
    with pytest.raises(tenure.InvalidArgument):
        pruning.prune(client, POLICY, batch=0)
    with pytest.raises(tenure.InvalidArgument):
        pruning.prune(client, POLICY, tables=["job_leases"])


def test_relay_refuses_a_bad_retention(dsn: str, schema: str) -> None:
    from tenure.outbox.relay import Relay

    async def main() -> None:
        async with await tenure.connect_async(dsn, schema=schema, migrate=True) as aclient:
            with pytest.raises(tenure.InvalidArgument, match="at least 1d"):
                Relay(aclient, {"t": lambda m: None}, inbox_retention="1h")
            assert Relay(aclient, {"t": lambda m: None}, retention=None).settings.pruning is None

    asyncio.run(main())


def test_a_worker_prunes_every_table_in_the_background(
    client: tenure.Client, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `tenure worker` runs (the relay runs the same for outbox and inbox), its first
    pass brought forward from up to 30 s to 1 s."""
    monkeypatch.setattr(rt, "FIRST_WITHIN", 1.0)
    for table in rt.NAMES:
        seed(dsn, schema, table, 3, "40 days")
    done = threading.Event()

    async def main() -> None:
        async with await tenure.connect_async(dsn, schema=schema) as aclient:
            task = asyncio.create_task(background.prune(aclient, POLICY))
            while not all(count(dsn, schema, t) == 0 for t in rt.NAMES):
                await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            done.set()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert done.is_set()


# -- tenure prune, and tenure exec's own pruning ----------------------------------------------


def test_prune_command(client: tenure.Client, dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    for table in rt.NAMES:
        seed(dsn, schema, table, 2, "40 days")
    dry = run_tenure(["prune", "--dry-run", "--json"], env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["would_delete"] == dict.fromkeys(rt.NAMES, 2)
    assert all(count(dsn, schema, t) == 2 for t in rt.NAMES)

    only = run_tenure(["prune", "--table", "outbox", "--table", "inbox"], env)
    assert only.returncode == 0, only.stderr
    assert "outbox      deleted 2 row(s) older than 7d" in only.stdout
    assert "inbox       deleted 2 row(s) older than 30d" in only.stdout
    assert count(dsn, schema, "job_runs") == 2

    done = run_tenure(["prune", "--json"], {**env, "TENURE_RETENTION": "20d"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["older_than"] == 20 * 86400
    assert report["deleted"] == {**dict.fromkeys(rt.NAMES, 2), "outbox": 0, "inbox": 0}


@pytest.mark.parametrize(
    ("args", "env", "code", "says"),
    [
        (["--older-than", "soon"], {}, 2, "not a duration"),
        (["--older-than", "0s"], {}, 2, "must be positive"),
        (["--inbox-older-than", "1h"], {}, 2, "at least 1d"),
        ([], {"TENURE_INBOX_RETENTION": "2h"}, 2, "at least 1d"),
        (["--table", "job_leases"], {}, 2, "job_leases"),
        ([], {"TENURE_DSN": "postgresql://127.0.0.1:1/none?connect_timeout=2"}, 1, "error"),
    ],
)
def test_prune_command_exits(
    dsn: str, schema: str, args: list[str], env: dict[str, str], code: int, says: str
) -> None:
    out = run_tenure(["prune", *args], {**tenure_env(dsn, schema), **env})
    assert out.returncode == code, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and says in out.stderr


def test_exec_prunes_its_own_history_after_a_run(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    seed(dsn, schema, "exec_runs", 3, OLD)
    seed(dsn, schema, "exec_slots", 3, OLD)
    out = run_tenure(
        ["exec", "--key", "job", "--every", "60", "--", "true"], tenure_env(dsn, schema)
    )
    assert out.returncode == 0, out.stderr
    # The old rows are gone; this run's own history and slot are there.
    assert run(dsn, schema, "SELECT job_key, outcome FROM {schema}.exec_runs") == [
        ("job", "succeeded")
    ]
    [(slot, open_until)] = run(dsn, schema, "SELECT slot, open_until FROM {schema}.exec_slots")
    assert open_until is not None and slot.endswith("Z")


def test_status_finds_each_jobs_newest_run_through_its_key_at_retention_size(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """`tenure status` looks up every job's newest run. With a week of exec history for a
    few keys and many scheduled jobs without any, the planner chose to walk exec_runs'
    primary key backwards for each job, filtering on its key: the whole table per job that
    has no exec run (seconds at retention size). The lookup must go through the job's key."""
    run(
        dsn,
        schema,
        "INSERT INTO {schema}.exec_runs (job_key, token, host, pid, started_at, outcome, "
        "recorded_at) SELECT 'exec-' || (n %% 10), n, 'h', 1, now(), 'succeeded', "
        "now() - (n || ' s')::interval FROM generate_series(1, 20000) n",
    )
    run(
        dsn,
        schema,
        "INSERT INTO {schema}.scheduled_jobs (job_key, every, timezone, ttl, misfire, on_crash, "
        "defined_at, defined_by, next_slot) SELECT 'job-' || n, interval '1 s', 'UTC', "
        "interval '30 s', 'latest', 'retry', now(), 't', now() FROM generate_series(1, 300) n",
    )
    seed(dsn, schema, "job_runs", 20000, NEW, key="job-1")
    for table in ("exec_runs", "job_runs", "scheduled_jobs"):
        run(dsn, schema, f"VACUUM ANALYZE {{schema}}.{table}")
    from tenure.db.queries import query

    with psycopg.connect(dsn) as conn:
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                b"EXPLAIN " + query(schema, "status_jobs"), {"window": dt.timedelta(hours=1)}
            )
        )
    assert "exec_runs_pkey" not in plan and "job_runs_pkey" not in plan, plan
