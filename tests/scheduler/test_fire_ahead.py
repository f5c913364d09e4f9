"""Fire-ahead: a job whose slot comes within ``FIRE_AHEAD`` is claimed and planned before the
slot, and its start is recorded at the slot (docs/safety.md, "Claiming ahead of the slot").

The claim's round trip and the planning then no longer count as the slot's lateness. What
must hold: no run starts before its slot by the database clock, only jobs whose TTL is at
least ten times the fire-ahead are claimed early, and a worker that stops gives back the
claims it took ahead instead of keeping them until their leases expire.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

import tenure
from tenure.scheduler import claimer as claimer_module
from tenure.scheduler.claim import Claim
from tenure.scheduler.schedules import JobState, plan, schedule_from_row
from tests.support.scheduler_support import (
    InProcessWorker,
    claim_batch,
    prepare,
    query,
    slot_in,
    wait_for,
)


def test_the_claim_takes_a_job_ahead_of_its_slot_only_within_the_fire_ahead_and_a_long_ttl(
    dsn: str, schema: str
) -> None:
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    app.add_job("long", lambda ctx: None, every="1h", ttl="30s")
    app.add_job("short", lambda ctx: None, every="1h", ttl="1s")
    app.register()
    slot = slot_in(dsn, schema, "long", 1.0)
    short_slot = slot_in(dsn, schema, "short", 1.5)
    with tenure.connect(dsn, schema=schema) as client:
        claims, summary = claim_batch(client, 0.0)
        assert claims == []
        # Without fire-ahead: look again when the first slot comes.
        assert summary.ready_at == slot

        claims, summary = claim_batch(client, 2.0)
        # "short" (1 s TTL) may hold a lease only a tenth of its TTL longer than its run:
        # it waits for its slot, and the worker is told to look again then.
        assert [c.job_key for c in claims] == ["long"]
        assert summary.ready_at == short_slot
        [taken] = claims
        assert taken.now < slot
        assert taken.at == slot  # planned for its slot, not for the claim's now
        decided = plan(
            schedule_from_row(taken.job_key, taken.cron, taken.every, taken.timezone),
            taken.policy(),
            taken.state,
            taken.at,
            taken.token,
        )
        assert decided.run_slot == slot
        assert decided.skipped == ()


def test_a_worker_claims_ahead_and_starts_the_run_at_its_slot_by_the_database_clock(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claimer_module, "FIRE_AHEAD", 5.0)
    prepare(dsn, schema)
    seen: list[tuple[Any, ...]] = []
    app = tenure.Scheduler(dsn, schema=schema, name="a")

    @app.job("k", every="1h", ttl="60s")
    def k(ctx: tenure.JobContext) -> None:
        [row] = query(
            dsn,
            schema,
            "SELECT acquired_at, clock_timestamp() FROM {schema}.job_leases WHERE job_key = %s",
            (ctx.job_key,),
        )
        seen.append(row)

    app.register()
    slot = slot_in(dsn, schema, "k", 3.0)
    with InProcessWorker(app):
        wait_for(lambda: seen, timeout=20, what="the run")
    [(acquired_at, in_body)] = seen
    [(started_at, run_slot, outcome)] = query(
        dsn,
        schema,
        "SELECT started_at, slot, outcome FROM {schema}.job_runs WHERE job_key = 'k'",
    )
    assert (run_slot, outcome) == (slot, "succeeded")
    assert acquired_at < slot  # claimed ahead of the slot...
    assert started_at >= slot  # ...but its start recorded at or after it
    assert in_body >= started_at


def test_a_stopping_worker_gives_back_the_claims_it_took_ahead(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claimer_module, "FIRE_AHEAD", 30.0)
    prepare(dsn, schema)
    ran: list[str] = []
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    app.add_job("k", lambda ctx: ran.append("k"), every="1h", ttl="600s")
    app.register()
    slot = slot_in(dsn, schema, "k", 20.0)
    with InProcessWorker(app):
        wait_for(
            lambda: query(
                dsn,
                schema,
                "SELECT 1 FROM {schema}.job_leases WHERE job_key = 'k' "
                "AND lease_until > clock_timestamp()",
            ),
            timeout=20,
            what="the claim ahead of the slot",
        )
    [(live, held_until, next_slot, due_at)] = query(
        dsn,
        schema,
        "SELECT l.lease_until > clock_timestamp(), j.held_until, j.next_slot, j.due_at "
        "FROM {schema}.scheduled_jobs AS j JOIN {schema}.job_leases AS l USING (job_key) "
        "WHERE j.job_key = 'k'",
    )
    # Released at once and due at its slot again, for any worker; nothing ran or was recorded.
    assert (live, held_until, next_slot, due_at) == (False, None, slot, slot)
    assert ran == []
    assert query(dsn, schema, "SELECT count(*) FROM {schema}.job_runs") == [(0,)]


NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def claimed(
    next_slot: dt.datetime,
    *,
    running_slot: dt.datetime | None = None,
    trigger_at: dt.datetime | None = None,
    lease_until: dt.datetime = NOW + dt.timedelta(seconds=30),
) -> Claim:
    state = JobState(next_slot, None, running_slot, None, None, None, trigger_at, False, 0)
    return Claim(
        "k", uuid.uuid4(), 7, lease_until, None, dt.timedelta(hours=1), "UTC",
        dt.timedelta(seconds=30), "skip", None, "retry", 1, state, NOW,
    )  # fmt: skip


def test_a_claim_is_planned_for_its_slot_only_when_it_was_taken_ahead_of_it() -> None:
    soon, past = NOW + dt.timedelta(seconds=0.1), NOW - dt.timedelta(seconds=1)
    assert claimed(soon).at == soon
    assert claimed(past).at == NOW  # due already: planned for now, as every claim was
    # A pending retry or manual trigger is due at once: it runs now, not at the next slot.
    assert claimed(soon, running_slot=past).at == NOW
    assert claimed(soon, trigger_at=past).at == NOW
    # Never planned for a slot the lease just taken would not live to see.
    assert claimed(soon, lease_until=soon).at == NOW
