"""When a claim that did not fill its batch tells the worker to look again (its last row,
``ready_at``): the earliest of the next slot beyond the fire-ahead (less the fire-ahead), the
slot of a job that may not be claimed ahead (its TTL is short), the expiry of a live lease on
a due job, and now if a due job was left unclaimed (locked by another claim). A worker sleeps
until then unless a notification wakes it, so a wrong answer is a late run, not a wrong one."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from psycopg import sql

import tenure
from tests.support.scheduler_support import claim_batch, prepare, query, slot_in


def claim(client: tenure.Client, ahead: float, limit: int = 10) -> tuple[list[str], Any, Any]:
    """The keys claimed, the database's now and the look-again time."""
    claims, summary = claim_batch(client, ahead, limit=limit)
    return [c.job_key for c in claims], summary.now, summary.ready_at


def app_with(dsn: str, schema: str, *jobs: tuple[str, str]) -> None:
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    for key, ttl in jobs:
        app.add_job(key, lambda ctx: None, every="1h", ttl=ttl)
    app.register()


def test_look_again_when_the_next_slot_comes_within_the_fire_ahead(dsn: str, schema: str) -> None:
    prepare(dsn, schema)
    app_with(dsn, schema, ("k", "30s"))
    slot = slot_in(dsn, schema, "k", 5.0)
    with tenure.connect(dsn, schema=schema) as client:
        claimed, _now, ready_at = claim(client, 0.5)
    assert claimed == []
    assert ready_at == slot - dt.timedelta(seconds=0.5)


def test_look_again_at_the_slot_of_a_job_whose_ttl_is_too_short_to_claim_it_ahead(
    dsn: str, schema: str
) -> None:
    prepare(dsn, schema)
    app_with(dsn, schema, ("short", "1s"), ("later", "30s"))
    slot = slot_in(dsn, schema, "short", 1.0)
    slot_in(dsn, schema, "later", 10.0)
    with tenure.connect(dsn, schema=schema) as client:
        claimed, _now, ready_at = claim(client, 2.0)
    assert claimed == []
    assert ready_at == slot


def test_look_again_when_the_live_lease_on_a_due_job_expires(dsn: str, schema: str) -> None:
    """Someone holds the lease of a due job (a manual acquire on its key, or a run renewing
    past its held time): the claim skips it and says when that lease expires."""
    prepare(dsn, schema)
    app_with(dsn, schema, ("held", "30s"), ("later", "30s"))
    slot_in(dsn, schema, "held", -1.0)
    slot_in(dsn, schema, "later", 60.0)
    with tenure.connect(dsn, schema=schema) as client:
        lease = client.acquire("held", ttl="20s")
        assert lease is not None
        [(lease_until,)] = query(
            dsn, schema, "SELECT lease_until FROM {schema}.job_leases WHERE job_key = 'held'"
        )
        claimed, now, ready_at = claim(client, 0.2)
    assert claimed == []
    assert ready_at == lease_until
    assert ready_at > now + dt.timedelta(seconds=15)


def test_look_again_at_once_when_a_due_job_was_left_unclaimed(dsn: str, schema: str) -> None:
    """A due job another claim has locked is skipped (SKIP LOCKED), not waited for: the batch
    was not full, yet a due job is left, so the worker looks again at once."""
    prepare(dsn, schema)
    app_with(dsn, schema, ("locked", "30s"), ("free", "30s"), ("held", "30s"))
    slot_in(dsn, schema, "locked", -1.0)
    slot_in(dsn, schema, "free", -1.0)
    slot_in(dsn, schema, "held", -1.0)
    with tenure.connect(dsn, schema=schema) as client, psycopg.connect(dsn) as other:
        lease = client.acquire("held", ttl="20s")  # a live lease: not what makes it "now"
        assert lease is not None
        other.execute(
            sql.SQL("SELECT 1 FROM {}.scheduled_jobs WHERE job_key = 'locked' FOR UPDATE").format(
                sql.Identifier(schema)
            )
        )
        claimed, now, ready_at = claim(client, 0.2)
        other.rollback()
        assert claimed == ["free"]
        assert ready_at == now
        # Once the lock is gone the job is claimed; with nothing left due but the held one,
        # the answer is that lease's expiry again.
        claimed, now, ready_at = claim(client, 0.2)
    assert claimed == ["locked"]
    assert ready_at > now + dt.timedelta(seconds=15)


def test_a_full_batch_says_nothing_the_worker_claims_again_at_once(dsn: str, schema: str) -> None:
    prepare(dsn, schema)
    app_with(dsn, schema, ("a1", "30s"), ("a2", "30s"), ("a3", "30s"))
    for key in ("a1", "a2", "a3"):
        slot_in(dsn, schema, key, -1.0)
    with tenure.connect(dsn, schema=schema) as client:
        claimed, _now, ready_at = claim(client, 0.2, limit=2)
    assert len(claimed) == 2
    assert ready_at is None
