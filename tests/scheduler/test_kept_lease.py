"""A finish that keeps its lease for the job's next slot (``sched_finish``'s kept leases,
docs/safety.md "Keeping the lease for the next slot"): the run's end and the claim of the
job's next slot in one statement, with every rule of a claim (fresh owner, token + 1, the
fence row moved) and none of a claim's exceptions dropped (paused, pending trigger, a
fenced transaction still open, a next slot beyond a tenth of the TTL).

The statement-level tests drive ``sched_claim``, ``sched_start`` and ``sched_finish`` as a
worker sends them; the worker-level ones run real workers."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tenure
from tenure.db.channels import channel
from tenure.db.queries import query as named_query
from tenure.scheduler import jobs as ops
from tenure.scheduler.claim import Claim, Finished, RunIdentity, finish_params, start_params
from tenure.scheduler.rows import ClaimRow, FinishedRow, StartedRow
from tenure.scheduler.schedules import plan
from tenure.scheduler.worker import Worker
from tenure.verify import tables as verify_tables
from tests.support.env import tenure_env
from tests.support.scheduler_support import (
    InProcessWorker,
    claim_batch,
    prepare,
    query,
    slot_in,
    wait_for,
    worker_processes,
)

WHO = {"worker": "w", "host": "h", "pid": 1}


def _app(dsn: str, schema: str, every: str = "1s", ttl: str = "30s") -> tenure.Scheduler:
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    app.add_job("k", lambda ctx: None, every=every, ttl=ttl)
    app.register()
    return app


def _run(client: tenure.Client, dsn: str, schema: str) -> RunIdentity:
    """Claim job 'k' (due now) and record its start as a worker does: its run's identity."""
    slot_in(dsn, schema, "k", -0.05)
    [claim] = claim_batch(client, limit=1)[0]
    return _start(client, claim)


def _start(client: tenure.Client, claim: Claim) -> RunIdentity:
    """``sched_start`` of a claim as the starter sends it: the run's identity (a kept job's
    with the token its start took)."""
    decided = plan(claim.schedule(), claim.policy(), claim.state, claim.at, claim.token)
    assert decided.run_slot is not None and decided.run_kind is not None
    [row] = client.fetch(
        "sched_start",
        start_params([(claim, decided)], **WHO),
        doing="starting",
        wrote=True,
        row=StartedRow,
    )
    assert row.job_key == claim.job_key and row.started_at is not None
    token = claim.token if row.token is None else row.token
    return RunIdentity(
        row.job_key, token, claim.owner, decided.run_slot, decided.run_kind, 1, row.started_at
    )


def _finish(
    client: tenure.Client,
    schema: str,
    ident: RunIdentity,
    keep: bool,
    *,
    retry: bool = False,
    outcome: str = "succeeded",
) -> tuple[list[FinishedRow], list[ClaimRow]]:
    """``sched_finish`` for one run: its end's rows and the rows of the jobs it kept."""
    done = outcome in ("succeeded", "failed")
    params = finish_params(
        [Finished(ident, done, outcome, None, keep)],
        channel=channel("jobs", schema),
        retry=retry,
        **WHO,
    )
    rows = client.fetch("sched_finish", params, doing="finishing", wrote=True, row=FinishedRow)
    return [r for r in rows if r.token is not None], [r.claim() for r in rows if r.token is None]


def _kept_claim(row: ClaimRow) -> Claim:
    """A kept job's row as the worker's claim loop takes it (Claimer.kept)."""
    claim = Claim.from_rows(row, row)
    return dataclasses.replace(
        claim, owner=uuid.uuid4(), lease_until=claim.now + claim.ttl, take=True
    )


def _lease(dsn: str, schema: str) -> tuple[Any, ...]:
    """The job's lease (owner, token, live), fence row token, claim token, running token,
    and whether it is due for other workers' claims now."""
    [row] = query(
        dsn,
        schema,
        "SELECT l.lease_owner, l.fencing_token, l.lease_until >= clock_timestamp(), s.token, "
        "j.claim_token, j.running_token, j.due_at <= clock_timestamp() + interval '0.2 s' "
        "FROM {schema}.job_leases AS l JOIN {schema}.job_state AS s USING (job_key) "
        "JOIN {schema}.scheduled_jobs AS j USING (job_key) WHERE job_key = 'k'",
    )
    return row


def _run_ten_jobs(dsn: str, schema: str, *, runs: int) -> None:
    """Ten every-second jobs (TTL 30 s) on a worker in this process, stopped once they have
    run ``runs`` times in all."""
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    ran = threading.Semaphore(0)
    for n in range(10):
        app.add_job(f"k{n}", lambda ctx: ran.release(), every="1s", ttl="30s")
    with InProcessWorker(app):
        for _ in range(runs):
            assert ran.acquire(timeout=20)


def _outcomes(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT token, outcome FROM {schema}.job_runs WHERE job_key = 'k' ORDER BY run_id",
    )


def test_a_kept_job_s_start_takes_its_released_lease_over(dsn: str, schema: str) -> None:
    """Every second: the next slot is within KEEP_AHEAD, so the finish keeps the job. It
    releases the lease as any finish does (the ended run's token writes nothing from now on),
    and the job is not due for other workers' claims until RESERVE after its next slot. The
    start of that slot takes the lease over as a claim would: after its expiry, a new owner,
    token + 1, the fence row moved."""
    prepare(dsn, schema)
    _app(dsn, schema)
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        [ended], [row] = _finish(client, schema, ident, True)
        assert (ended.matched, ended.outcome) == (True, "succeeded")
        assert (row.lease_owner, row.fencing_token, row.lease_until) == (None, ident.token, None)
        # Released, and left to this worker: not due for anyone's claim.
        assert _lease(dsn, schema) == (ident.owner, ident.token, False, ident.token,
                                       ident.token, None, False)  # fmt: skip
        with pytest.raises(tenure.StaleTokenError), client.fenced("k", ident.token):
            pass
        claim = _kept_claim(row)
        assert claim.at == claim.state.next_slot > ident.slot  # planned for its slot
        nxt = _start(client, claim)
        assert nxt.token == ident.token + 1
        assert _lease(dsn, schema) == (claim.owner, nxt.token, True, nxt.token, nxt.token,
                                       nxt.token, False)  # fmt: skip
        [ended], [] = _finish(client, schema, nxt, False)
        assert ended.matched
    assert _outcomes(dsn, schema) == [(ident.token, "succeeded"), (nxt.token, "succeeded")]


@pytest.mark.parametrize("change", ["far", "paused", "triggered", "not-done", "no-keep"])
def test_a_finish_lets_the_job_go_when_it_may_not_keep_it(
    dsn: str, schema: str, change: str
) -> None:
    """A next slot beyond KEEP_AHEAD, a pause, a pending trigger, a run that did not end done
    or a worker without room: the job is due for any worker's claim as before."""
    prepare(dsn, schema)
    _app(dsn, schema, every="1s" if change != "far" else "10s")
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        outcome = "succeeded"
        if change == "paused":
            ops.pause(client, "k", channel=channel("jobs", schema))
        elif change == "triggered":
            ops.trigger(client, "k", channel=channel("jobs", schema))
        elif change == "not-done":
            outcome = "lease_lost"
        _ended, kept = _finish(client, schema, ident, change != "no-keep", outcome=outcome)
    assert kept == []
    [(held_until,)] = query(
        dsn, schema, "SELECT held_until FROM {schema}.scheduled_jobs WHERE job_key = 'k'"
    )
    assert held_until is None


@pytest.mark.parametrize("change", ["claimed-elsewhere", "acquired", "fenced", "redefined"])
def test_a_kept_job_s_start_takes_no_lease_it_may_not(dsn: str, schema: str, change: str) -> None:
    """Between the finish that kept the job and the start of its next slot: another worker
    claimed it (this worker was late), the lease was acquired by a bare client, a fenced
    transaction of the ended run is still open (the start must not wait for it), or the job
    was redefined. The start records nothing and takes no lease."""
    prepare(dsn, schema)
    _app(dsn, schema)
    hold: psycopg.Connection[Any] | None = None
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        if change == "fenced":
            # Opened while the run held its lease, left open past its end (a leaked one).
            hold = psycopg.connect(dsn)
            tenure.fence(hold, "k", ident.token, schema=schema)
        try:
            _ended, [row] = _finish(client, schema, ident, True)
            claim = _kept_claim(row)
            if change == "claimed-elsewhere":
                query(
                    dsn, schema, "UPDATE {schema}.scheduled_jobs SET held_until = NULL "
                    "WHERE job_key = 'k'",
                )  # fmt: skip
                slot_in(dsn, schema, "k", -0.05)
                [other] = claim_batch(client, limit=1)[0]
                assert other.token == ident.token + 1
            elif change == "acquired":
                assert client.acquire("k", ttl=30) is not None
            elif change == "redefined":  # as a re-registration or a schedule change does
                query(
                    dsn, schema, "UPDATE {schema}.scheduled_jobs SET revision = revision + 1 "
                    "WHERE job_key = 'k'",
                )  # fmt: skip
            t0 = time.monotonic()
            decided = plan(claim.schedule(), claim.policy(), claim.state, claim.at, claim.token)
            rows = client.fetch(
                "sched_start",
                start_params([(claim, decided)], **WHO),
                doing="starting",
                wrote=True,
                row=StartedRow,
            )
            assert time.monotonic() - t0 < 2.0
        finally:
            if hold is not None:
                hold.rollback()
                hold.close()
    assert rows == []
    owner, _token, _live, _fence, _claim_token, running, _due = _lease(dsn, schema)
    assert owner != claim.owner and running is None


def test_a_finish_sent_again_after_its_answer_was_lost_keeps_the_run_s_success(
    dsn: str, schema: str
) -> None:
    """The worker retries a finish whose connection broke; the first attempt may have
    committed. The second attempt found the job's running_token cleared by the first, took
    the run for one that another worker had taken over, and recorded its success as
    lease_lost (and logged so). Now the run's own end stands and it matched."""
    prepare(dsn, schema)
    _app(dsn, schema)
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        _finish(client, schema, ident, False)
        [again], [] = _finish(client, schema, ident, False, retry=True)
    assert (again.matched, again.outcome) == (True, "succeeded")
    assert _outcomes(dsn, schema) == [(ident.token, "succeeded")]


def test_a_worker_starts_a_kept_job_at_its_slot_with_a_lease_taken_then(
    dsn: str, schema: str
) -> None:
    """A worker running an every-second job keeps it from one run to the next: its runs'
    leases are taken by their starts, at or after their slots (a claim takes one up to
    FIRE_AHEAD before the slot). Each run still has an owner and a token of its own, one
    above the run before."""
    prepare(dsn, schema)
    seen: list[tuple[int, float]] = []
    app = tenure.Scheduler(dsn, schema=schema, name="a")

    @app.job("k", every="1s", ttl="30s")
    def k(ctx: tenure.JobContext) -> None:
        [(after,)] = query(
            dsn,
            schema,
            "SELECT extract(epoch FROM acquired_at - %s)::float8 FROM {schema}.job_leases "
            "WHERE job_key = 'k'",
            (ctx.slot,),
        )
        seen.append((ctx.token, after))

    with InProcessWorker(app):
        wait_for(lambda: len(seen) >= 9, timeout=30, what="nine runs")
    runs = seen[1:9]  # the first run's lease came from a claim
    tokens = [token for token, _ in runs]
    assert tokens == list(range(tokens[0], tokens[0] + len(tokens))), seen
    taken_at_start = [after for _, after in runs if after >= 0]
    # A worker alone keeps all of them (no share to respect); one may have been claimed if the
    # worker fell behind for a moment on a loaded machine (it keeps nothing while saturated).
    assert len(taken_at_start) >= len(runs) - 1, seen
    owners = query(dsn, schema, "SELECT count(DISTINCT owner), count(*) FROM {schema}.job_runs")
    assert owners[0][0] == owners[0][1]


def test_every_takeover_of_a_kept_job_comes_after_its_lease_expired(dsn: str, schema: str) -> None:
    """Invariant 2, as `tenure verify` checks it on the database's record of every change of
    a lease row (its trigger): no token is issued while the one before it is live. A finish
    that handed the lease straight to the job's next run in one update (an earlier design)
    failed this: the row went from a live lease to the next token."""
    prepare(dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        verify_tables.setup(conn, schema)
    _run_ten_jobs(dsn, schema, runs=60)
    [(takeovers, early)] = query(
        dsn,
        schema,
        "SELECT count(*), count(*) FILTER (WHERE at <= old_until) "
        "FROM {schema}.verify_lease_history WHERE change = 'takeover' AND old_until IS NOT NULL",
    )
    assert takeovers >= 40 and early == 0, (takeovers, early)


def test_a_worker_that_joins_gets_its_share_of_jobs_kept_by_another(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Kept jobs must not stay with the worker that ran them first: once the first counts
    the second (its presence beat), it keeps no more than its share and lets the others go,
    so a second worker started later runs its part of the jobs within seconds (without
    that it would run none of them while the first keeps up)."""
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    with worker_processes(1, "KEPT", env, tmp_path) as [first]:
        wait_for(
            lambda: query(dsn, schema, "SELECT count(*) FROM {schema}.job_runs")[0][0] >= 60,
            timeout=30,
            what="the first worker's runs",
        )
        (tmp_path / "b").mkdir()
        with worker_processes(1, "KEPT", env, tmp_path / "b") as [second]:
            # The first worker counts the second at its next beat (PRESENCE_EVERY, 10 s),
            # then lets go the jobs over its share as they run.
            time.sleep(24)
            since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
            rows = query(
                dsn,
                schema,
                "SELECT pid, count(*) FROM {schema}.job_runs WHERE started_at >= %s GROUP BY pid",
                (since,),
            )
    by_pid = dict(rows)
    total = sum(by_pid.values())
    # A share is 7 of the 10 jobs (5, its slack and one more): the second runs 3 or more, a
    # quarter asked here, against none without the share.
    assert by_pid.get(second.pid, 0) >= total // 4, (by_pid, first.pid, second.pid)


def test_a_killed_worker_s_kept_jobs_run_again_soon_elsewhere(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """A worker that dies while it keeps jobs holds no lease for them (only for the runs it
    has in flight): another worker runs each of them once its reserve has passed, with
    higher tokens, every slot at most once."""
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    with worker_processes(1, "KEPT", env, tmp_path) as [victim]:
        wait_for(
            lambda: query(dsn, schema, "SELECT count(*) FROM {schema}.job_runs")[0][0] >= 50,
            timeout=30,
            what="runs",
        )
        victim.signal(9)
        victim.wait()
        [(held, kept)] = query(
            dsn,
            schema,
            "SELECT count(*) FILTER (WHERE l.lease_until > clock_timestamp()), "
            "count(*) FILTER (WHERE j.held_until > j.next_slot) "
            "FROM {schema}.job_leases AS l JOIN {schema}.scheduled_jobs AS j USING (job_key)",
        )
        assert kept >= 5 and held <= 3, (kept, held)  # kept jobs, and few live leases
        (tmp_path / "b").mkdir()
        with worker_processes(1, "KEPT", env, tmp_path / "b") as [heir]:
            wait_for(
                lambda: (
                    query(
                        dsn,
                        schema,
                        "SELECT count(DISTINCT job_key) FROM {schema}.job_runs WHERE pid = %s",
                        (heir.pid,),
                    )[0][0]
                    == 10
                ),
                timeout=40,
                what="the heir to run every job",
            )
    [(twice,)] = query(
        dsn,
        schema,
        "SELECT count(*) FROM (SELECT job_key, slot FROM {schema}.job_runs "
        "WHERE outcome = 'succeeded' GROUP BY 1, 2 HAVING count(*) > 1) AS d",
    )
    assert twice == 0


def test_a_stopping_worker_gives_back_the_jobs_it_kept(dsn: str, schema: str) -> None:
    """A worker stopped gives its kept jobs back (as it gives back claims taken ahead of
    their slots): each is due at its slot for any worker, and no lease is left live."""
    prepare(dsn, schema)
    _run_ten_jobs(dsn, schema, runs=40)
    [(live, kept)] = query(
        dsn,
        schema,
        "SELECT count(*) FILTER (WHERE l.lease_until > clock_timestamp()), "
        "count(*) FILTER (WHERE j.held_until IS NOT NULL) "
        "FROM {schema}.job_leases AS l JOIN {schema}.scheduled_jobs AS j USING (job_key)",
    )
    assert (live, kept) == (0, 0)


def test_a_saturated_worker_lets_its_jobs_go_only_while_another_is_not(
    dsn: str, schema: str
) -> None:
    """A saturated worker keeps no job where another live worker of its app could take its
    jobs: the presence beat counts the other workers that were not saturated at their last
    beat. Where every worker is saturated, letting go only adds a claim to each run (at
    10,000 runs/s asked of two workers both let go, claimed, and fell further behind), so it
    keeps them as a worker alone does."""
    prepare(dsn, schema)
    app = _app(dsn, schema)
    worker = Worker(app.settings(), app.jobs, app.tasks)

    async def kept_with_the_other(saturated: bool) -> int:
        async with await tenure.connect_async(dsn, schema=schema) as client:
            await worker.presence.enter(client)
            query(
                dsn,
                schema,
                "UPDATE {schema}.scheduler_workers SET saturated = %s WHERE worker_id = 'other'",
                (saturated,),
            )
            worker.saturation.saturated = True
            await worker.presence.beat(client)
        reserved = worker.claimer.reserve(1)
        worker.starter.starting -= reserved
        return reserved

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            named_query(schema, "sched_presence_enter"),
            {"worker": "other", "app": "a", "keys": ["k"], "host": "h", "pid": 2,
             "ttl": dt.timedelta(seconds=30)},
        )  # fmt: skip
    assert asyncio.run(kept_with_the_other(saturated=False)) == 0
    assert worker.finisher.share is not None  # two live workers: a share applies
    assert asyncio.run(kept_with_the_other(saturated=True)) == 1
