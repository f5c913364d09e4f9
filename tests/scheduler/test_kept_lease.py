"""A finish that keeps its lease for the job's next slot (``sched_finish``'s kept leases,
docs/safety.md "Keeping the lease for the next slot"): the run's end and the claim of the
job's next slot in one statement, with every rule of a claim (fresh owner, token + 1, the
fence row moved) and none of a claim's exceptions dropped (paused, pending trigger, a
fenced transaction still open, a next slot beyond a tenth of the TTL).

The statement-level tests drive ``sched_claim``, ``sched_start`` and ``sched_finish`` as a
worker sends them; the worker-level ones run real workers."""

from __future__ import annotations

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
from tenure.scheduler import jobs as ops
from tenure.scheduler.claim import Claim, Finished, RunIdentity, finish_params, start_params
from tenure.scheduler.rows import ClaimRow, FinishedRow
from tenure.scheduler.schedules import plan
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
    decided = plan(claim.schedule(), claim.policy(), claim.state, claim.at, claim.token)
    assert decided.run_slot is not None and decided.run_kind is not None
    [(key, started_at)] = client.fetch(
        "sched_start", start_params([(claim, decided)], **WHO), doing="starting", wrote=True
    )
    assert key == claim.job_key
    return RunIdentity(
        key, claim.token, claim.owner, decided.run_slot, decided.run_kind, 1, started_at
    )


def _finish(
    client: tenure.Client,
    schema: str,
    ident: RunIdentity,
    keep: uuid.UUID | None,
    *,
    retry: bool = False,
    outcome: str = "succeeded",
) -> tuple[list[FinishedRow], list[ClaimRow]]:
    """``sched_finish`` for one run: its end's rows and the claims of the leases it kept."""
    done = outcome in ("succeeded", "failed")
    params = finish_params(
        [Finished(ident, done, outcome, None, keep)],
        channel=channel("jobs", schema),
        retry=retry,
        **WHO,
    )
    rows = client.fetch("sched_finish", params, doing="finishing", wrote=True, row=FinishedRow)
    return [r for r in rows if r.token is not None], [r.claim() for r in rows if r.token is None]


def _lease(dsn: str, schema: str) -> tuple[Any, ...]:
    [row] = query(
        dsn,
        schema,
        "SELECT l.lease_owner, l.fencing_token, l.lease_until >= clock_timestamp(), s.token, "
        "j.claim_token, j.running_token, j.due_at > clock_timestamp() "
        "FROM {schema}.job_leases AS l JOIN {schema}.job_state AS s USING (job_key) "
        "JOIN {schema}.scheduled_jobs AS j USING (job_key) WHERE job_key = 'k'",
    )
    return row


def _outcomes(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT token, outcome FROM {schema}.job_runs WHERE job_key = 'k' ORDER BY run_id",
    )


def test_a_finish_keeps_the_lease_for_a_next_slot_within_a_tenth_of_the_ttl(
    dsn: str, schema: str
) -> None:
    """Every 1 s with a 30 s TTL: the next slot is within 3 s, so the finish claims it. The
    claim is a takeover as any: the new owner, token + 1, the fence row moved (a write of
    the ended run's token is refused from now on), the job not due while the lease is held."""
    prepare(dsn, schema)
    _app(dsn, schema)
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        keep = uuid.uuid4()
        [ended], [kept] = _finish(client, schema, ident, keep)
        assert (ended.matched, ended.outcome) == (True, "succeeded")
        claim = Claim.from_rows(kept, kept)
        assert (claim.owner, claim.token) == (keep, ident.token + 1)
        assert claim.state.running_slot is None and claim.state.next_slot > ident.slot
        assert claim.at == claim.state.next_slot  # planned for its slot, as a fire-ahead claim
        assert _lease(dsn, schema) == (keep, ident.token + 1, True, ident.token + 1,
                                       ident.token + 1, None, True)  # fmt: skip
        # Strict fencing: the ended run's token no longer writes.
        with pytest.raises(tenure.StaleTokenError), client.fenced("k", ident.token):
            pass
        # The kept claim starts as any claim does, and its run ends as any run does.
        nxt = _start(client, claim)
        assert nxt.token == ident.token + 1
        [ended], [] = _finish(client, schema, nxt, None)
        assert ended.matched
    assert _outcomes(dsn, schema) == [(ident.token, "succeeded"), (nxt.token, "succeeded")]


@pytest.mark.parametrize(
    "change",
    ["far", "paused", "triggered", "fenced", "not-done", "taken-over", "no-keep"],
)
def test_a_finish_releases_the_lease_when_it_may_not_keep_it(
    dsn: str, schema: str, change: str
) -> None:
    """Each condition under which a claim would not take the job now, or a run that did not
    end done: the lease is released as before, and the job is due for any worker."""
    prepare(dsn, schema)
    _app(dsn, schema, every="1s" if change != "far" else "10s")
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        outcome = "succeeded"
        hold: psycopg.Connection[Any] | None = None
        if change == "paused":
            ops.pause(client, "k", channel=channel("jobs", schema))
        elif change == "triggered":
            ops.trigger(client, "k", channel=channel("jobs", schema))
        elif change == "fenced":
            # A fenced transaction of the run still open (a body that leaked it): the finish
            # does not wait for it, it lets the job go.
            hold = psycopg.connect(dsn)
            tenure.fence(hold, "k", ident.token, schema=schema)
        elif change == "not-done":
            outcome = "lease_lost"
        elif change == "taken-over":
            # The lease is no longer the run's (a takeover the job row does not show: a bare
            # acquire of the job's key after the run's lease expired).
            query(
                dsn,
                schema,
                "UPDATE {schema}.job_leases SET lease_owner = gen_random_uuid(), "
                "fencing_token = fencing_token + 1, lease_until = clock_timestamp() "
                "WHERE job_key = 'k'",
            )
        try:
            keep = None if change == "no-keep" else uuid.uuid4()
            t0 = time.monotonic()
            _ended, kept = _finish(client, schema, ident, keep, outcome=outcome)
            assert time.monotonic() - t0 < 2.0
        finally:
            if hold is not None:
                hold.rollback()
                hold.close()
    assert kept == []
    owner, token, live, fence_token, claim_token, _running, _not_due = _lease(dsn, schema)
    if change == "taken-over":
        assert (token, live, fence_token, claim_token) == (ident.token + 1, False, ident.token,
                                                           ident.token)  # fmt: skip
        return
    assert (owner, token, live, fence_token, claim_token) == (
        ident.owner,
        ident.token,
        False,
        ident.token,
        ident.token,
    )


def test_a_finish_sent_again_after_its_answer_was_lost_keeps_what_it_did(
    dsn: str, schema: str
) -> None:
    """The worker retries a finish whose connection broke (the commit may have happened).
    The retry must neither turn the run's recorded success into a lost lease nor lose the
    lease the first attempt kept (nobody would hold it: the job would wait out its TTL)."""
    prepare(dsn, schema)
    _app(dsn, schema)
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        keep = uuid.uuid4()
        _finish(client, schema, ident, keep)  # committed; its answer "lost"
        [ended], [kept] = _finish(client, schema, ident, keep, retry=True)
        assert (ended.matched, ended.outcome) == (True, "succeeded")
        assert (kept.lease_owner, kept.fencing_token) == (keep, ident.token + 1)
        # The claim it gives back is the one the first attempt took, and it starts.
        nxt = _start(client, Claim.from_rows(kept, kept))
        assert nxt.token == ident.token + 1
    assert _outcomes(dsn, schema) == [(ident.token, "succeeded")]


def test_a_finish_sent_again_keeps_a_run_s_recorded_success(dsn: str, schema: str) -> None:
    """Without a kept lease too: the second attempt found the job's running_token cleared by
    the first, took the run for one another worker had taken over, and recorded its success
    as lease_lost."""
    prepare(dsn, schema)
    _app(dsn, schema)
    with tenure.connect(dsn, schema=schema) as client:
        ident = _run(client, dsn, schema)
        _finish(client, schema, ident, None)
        _finish(client, schema, ident, None, retry=True)
    assert _outcomes(dsn, schema) == [(ident.token, "succeeded")]


def test_a_worker_claims_its_job_s_next_slot_as_the_run_ends(dsn: str, schema: str) -> None:
    """A worker running an every-second job (TTL 30 s) takes most next slots in the finish:
    the lease a run starts with was acquired when the run before it ended, about a second
    before its slot, where a claim takes it at most FIRE_AHEAD (0.2 s) before. Each run still
    has an owner and a token of its own, one above the run before."""
    prepare(dsn, schema)
    seen: list[tuple[int, float]] = []
    app = tenure.Scheduler(dsn, schema=schema, name="a")

    @app.job("k", every="1s", ttl="30s")
    def k(ctx: tenure.JobContext) -> None:
        [(ahead,)] = query(
            dsn,
            schema,
            "SELECT extract(epoch FROM %s - acquired_at)::float8 FROM {schema}.job_leases "
            "WHERE job_key = 'k'",
            (ctx.slot,),
        )
        seen.append((ctx.token, ahead))

    with InProcessWorker(app):
        wait_for(lambda: len(seen) >= 9, timeout=30, what="nine runs")
    runs = seen[1:9]  # the first run's lease came from a claim
    tokens = [token for token, _ in runs]
    assert tokens == list(range(tokens[0], tokens[0] + len(tokens))), seen
    kept = [ahead for _, ahead in runs if ahead > 0.5]
    assert len(kept) >= len(runs) // 2, seen  # one in RELEASE_ODDS (8) is released
    owners = query(dsn, schema, "SELECT count(DISTINCT owner), count(*) FROM {schema}.job_runs")
    assert owners[0][0] == owners[0][1]


def test_a_worker_that_joins_gets_its_share_of_jobs_kept_by_another(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Kept leases must not pin every job to the worker that ran it first: one run in eight
    lets its job go, so a second worker started later runs a fair part of the jobs within
    seconds (without that it would run none of them while the first keeps up)."""
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
            time.sleep(12)
            since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=4)
            rows = query(
                dsn,
                schema,
                "SELECT pid, count(*) FROM {schema}.job_runs WHERE started_at >= %s GROUP BY pid",
                (since,),
            )
    by_pid = dict(rows)
    total = sum(by_pid.values())
    assert by_pid.get(second.pid, 0) >= total // 4, (by_pid, first.pid, second.pid)


def test_a_killed_worker_s_kept_jobs_run_again_once_their_leases_expire(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """A worker that dies holding leases kept for its jobs' next slots: another worker runs
    those jobs once the leases expire, with higher tokens, every slot at most once."""
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, KEPT_TTL="10s")
    with worker_processes(1, "KEPT", env, tmp_path) as [victim]:
        wait_for(
            lambda: query(dsn, schema, "SELECT count(*) FROM {schema}.job_runs")[0][0] >= 50,
            timeout=30,
            what="runs",
        )
        victim.signal(9)
        victim.wait()
        [(held,)] = query(
            dsn,
            schema,
            "SELECT count(*) FROM {schema}.job_leases WHERE lease_until > clock_timestamp()",
        )
        assert held > 0  # it died holding leases (kept, or of runs in flight)
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
                timeout=30,
                what="the heir to run every job",
            )
    [(twice,)] = query(
        dsn,
        schema,
        "SELECT count(*) FROM (SELECT job_key, slot FROM {schema}.job_runs "
        "WHERE outcome = 'succeeded' GROUP BY 1, 2 HAVING count(*) > 1) AS d",
    )
    assert twice == 0


def test_a_stopping_worker_gives_back_the_leases_it_kept(dsn: str, schema: str) -> None:
    """A worker stopped with SIGTERM hands its kept leases back (as it does claims taken ahead
    of their slots): no lease is left live, so another worker takes the jobs at once."""
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema, name="a")
    runs = threading.Semaphore(0)
    for n in range(10):
        app.add_job(f"k{n}", lambda ctx: runs.release(), every="1s", ttl="30s")
    with InProcessWorker(app):
        for _ in range(40):
            assert runs.acquire(timeout=20)
    [(live,)] = query(
        dsn,
        schema,
        "SELECT count(*) FROM {schema}.job_leases WHERE lease_until > clock_timestamp()",
    )
    assert live == 0
