"""The faults the HA tests inject, and one fault's whole scenario under load.

Each fault returns once it has been injected; :func:`run_fault` then waits for the cluster
to heal, for the workload to succeed again on the new primary, stops the load and checks
its history (tests/ha/workload.py).

``TENURE_HA_ALL=1`` runs every fault in both modes; by default CI runs a few (the suite's
time budget): see tests/ha/test_patroni_*.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
from psycopg import sql

from tenure.exec.history import WAIT as HISTORY_WAIT
from tenure.verify import VerifyConfig, VerifyResult
from tenure.verify import run as verify_run
from tenure.verify.config import RESTART
from tests.support.env import run_tenure

from .cluster import PatroniCluster
from .workload import EXEC_KEY, Recovery, Workload

WARM_UP_TIMEOUT = 60.0
RECOVERY_TIMEOUT = 60.0
STEADY = 2.0  # seconds of load before the fault and after the recovery
#: How long cut_clients cuts the leader off the clients: over the load's TTLs (6 s), so that
#: every lease held at the cut expires by the database clock during it.
CLIENT_CUT = 12.0
#: A run whose claim was answered just before the cut may start this long after it.
CUT_GRACE = 1.0
#: A tenure exec whose acquire was answered just before the cut starts its command up to the
#: exec history's bounded wait later (the start's history row gets no answer, which is not a
#: reason to leave a valid lease unused: tenure/exec/history.py), plus the same slack.
EXEC_CUT_GRACE = HISTORY_WAIT + CUT_GRACE
ALL = os.environ.get("TENURE_HA_ALL", "") not in ("", "0")


#: A token's timeline is in its high bits (queries.sql's token floor).
TIMELINE_SHIFT = 40


def is_loss(violation: str) -> bool:
    """What losing acknowledged commits does downstream, not a fault of tenure: a run
    acknowledged on the old primary and lost runs its slot again on the new one; a run whose
    evidence reached the new primary but whose finish was lost (the finish commits after
    it) runs its slot again there too, on the new timeline, unless the same worker claims it
    (it knows the run ended: scheduler/finisher.py ``last_done``); the relay may have
    delivered the lost run's message before the primary died. No token is told twice and no
    stale write commits even then (the timeline floor): those checks stay. A slot committed
    twice on one timeline is never a loss."""
    if violation.startswith("outbox-phantom:"):
        return True
    if violation.startswith("slot-twice:") and " acknowledged " in violation:
        return True
    if violation.startswith("slot-twice:") and "(tokens [" in violation:
        tokens = [int(t) for t in violation.split("(tokens [", 1)[1].rstrip("])").split(",")]
        return len({t >> TIMELINE_SHIFT for t in tokens}) == len(tokens)
    return False


def kill_postmaster(c: PatroniCluster) -> str:
    leader = c.leader()
    assert leader is not None
    c.kill_postmaster(leader)
    return f"kill -9 of {leader}'s postmaster"


def switchover(c: PatroniCluster) -> str:
    leader, candidate = c.leader(), c.replicas()[0]
    assert leader is not None
    c.switchover(leader, candidate)
    return f"patronictl switchover {leader} -> {candidate}"


def failover(c: PatroniCluster) -> str:
    candidate = c.replicas()[0]
    c.failover(candidate)
    return f"patronictl failover to {candidate}"


def partition(c: PatroniCluster) -> str:
    """Cut the leader's Patroni off etcd until another member leads, then heal."""
    leader = c.leader()
    assert leader is not None
    c.partition(leader)
    try:
        c._wait(lambda: c.leader() not in (None, leader), 90, "a new leader")
    finally:
        c.heal(leader)
    return f"{leader}'s Patroni partitioned from etcd until another member led"


def lagging_failover(c: PatroniCluster) -> str:
    """The failover asynchronous replication can lose commits in: the leader's WAL senders
    stop for 2 s of load, then the whole leader dies (Patroni and PostgreSQL, WAL senders
    included); a standby is promoted after the leader key's TTL (its lag is under
    maximum_lag_on_failover), and the old leader comes back, is rewound and follows. In
    synchronous mode the primary's commits wait for the standby instead, so none of those
    2 s is acknowledged."""
    leader = c.leader()
    assert leader is not None
    assert c.stop_wal_senders(leader) == len(c.members) - 1
    time.sleep(2.0)
    c.crash(leader)
    c._wait(lambda: c.leader() not in (None, leader), 90, "a new leader")
    c.revive(leader)
    return f"{leader} crashed whole after its standbys got no WAL for 2 s"


def etcd_leader_and_postmaster(c: PatroniCluster) -> str:
    """With a three-member etcd: SIGKILL the etcd leader and the Patroni leader's postmaster
    at once. The two etcd members left elect a leader; Patroni restarts or replaces its
    PostgreSQL through them. Once the cluster is healthy on a new timeline, with one etcd
    member still down, that member is started again and rejoins."""
    assert len(c.etcd) >= 3, "needs a three-member etcd (ETCD_MEMBERS = 3)"
    etcd, leader = c.etcd_leader(), c.leader()
    assert etcd is not None and leader is not None
    before = c.timeline()
    t0 = time.monotonic()
    c.kill_etcd(etcd)
    c.kill_postmaster(leader)
    c._wait(lambda: c.etcd_leader() not in (None, etcd), 30, "a new etcd leader")
    elected = time.monotonic() - t0

    def promoted() -> bool:
        try:
            return c.healthy() and c.timeline() > before
        except psycopg.Error:
            return False

    c._wait(promoted, 90, "a healthy cluster on a new timeline with one etcd member down")
    healed = time.monotonic() - t0
    c.revive_etcd(etcd)
    c._wait(lambda: all(e.healthy() for e in c.etcd), 30, f"etcd {etcd.name} to rejoin")
    return (
        f"kill -9 of etcd leader {etcd.name} and {leader}'s postmaster at once (etcd leader "
        f"again after {elected:.1f}s, cluster healthy on 2 of 3 etcd after {healed:.1f}s)"
    )


FAULTS: dict[str, Callable[[PatroniCluster], str]] = {
    "kill9": kill_postmaster,
    "switchover": switchover,
    "failover": failover,
    "partition": partition,
    "lagging": lagging_failover,
}


def cut_clients(c: PatroniCluster) -> str:
    """Cut the leader off the clients only, for CLIENT_CUT seconds (longer than every TTL of
    the load), then heal. Patroni, etcd and the replicas still reach it, so it stays the
    leader: nothing fails over, the clients' leases expire, and work stops until the heal."""
    leader = c.leader()
    assert leader is not None
    c.cut_clients(leader)
    try:
        time.sleep(CLIENT_CUT)
        assert c.leader() == leader, f"{c.leader()} leads: the cut caused a failover"
    finally:
        c.heal_clients(leader)
    return f"{leader} cut off the clients for {CLIENT_CUT:g}s"


#: Faults that need a three-member etcd (a module with ``ETCD_MEMBERS = 3``): not in EVERY.
ETCD_FAULTS: dict[str, Callable[[PatroniCluster], str]] = {
    "etcd-kill9": etcd_leader_and_postmaster,
}
#: Faults that need the clients' proxies (a module with ``CLIENT_PROXIES = True``), and
#: that do not fail over: the cluster ends on the same leader and timeline, and nothing
#: through the endpoint succeeds while the cut lasts. Not in EVERY.
CLIENT_FAULTS: dict[str, Callable[[PatroniCluster], str]] = {
    "clientcut": cut_clients,
}


@contextlib.contextmanager
def exec_caught_after_acquire(c: PatroniCluster, load: Workload, leader: str) -> Iterator[int]:
    """Hold a tenure exec of the load between its acquire and its command's start, then
    yield its token: the fault injected in the block then falls after an acquire the leader
    answered and before its command began, every time (the edge a client cut's grace is
    for). On the leader directly, not through the clients' way: an uncommitted history row
    for the exec key's next token makes that exec's own start row wait on it. Rolled back
    when the block ends."""
    with psycopg.connect(c.member(leader).dsn) as conn:
        schema = sql.Identifier(load.schema)
        me = conn.info.backend_pid
        deadline = time.monotonic() + WARM_UP_TIMEOUT
        while True:
            assert time.monotonic() < deadline, "no tenure exec acquired in time"
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {}.exec_runs (job_key, token, host, pid, started_at, outcome) "
                    "SELECT job_key, fencing_token + 1, 'ha-test', 0, now(), 'running' "
                    "FROM {}.job_leases WHERE job_key = %s "
                    "ON CONFLICT (job_key, token) DO NOTHING RETURNING token"
                ).format(schema, schema),
                (EXEC_KEY,),
            ).fetchone()
            if row is not None:
                break
            conn.rollback()  # an exec took that token meanwhile: the next one
            time.sleep(0.05)
        token = int(row[0])
        # pg_locks is read live (pg_stat_activity would be one snapshot per transaction).
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND %s = ANY(pg_blocking_pids(pid))"
        )
        while conn.execute(waiting, (me,)).fetchone() == (0,):
            assert time.monotonic() < deadline, f"no tenure exec acquired token {token} in time"
            time.sleep(0.005)
        try:
            yield token
        finally:
            conn.rollback()


def _wait(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.2)


def answered_by_leader(c: PatroniCluster, load: Workload, timeline: int) -> None:
    """``tenure status`` through the endpoint names the member that is Patroni's leader now,
    and the new timeline (issue 30): after the fault, not the member that led before."""
    leader = c.leader()
    assert leader is not None
    out = run_tenure(["status", "--json"], load.env)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows, out.stdout
    seen = {(r["answered_by"], r["timeline"], r["standby"]) for r in rows}
    assert seen == {(f"127.0.0.1:{c.member(leader).pg_port}", timeline, False)}, (leader, seen)


def run_fault(c: PatroniCluster, fault: str) -> tuple[str, Recovery]:
    """One fault under load; asserts the checks; returns what was done and the recovery.
    ``fault`` is a name of :data:`FAULTS`, with ``@multihost`` when the clients connect with
    libpq's multi-host DSN (``target_session_attrs=read-write``) instead of HAProxy.
    The processes' logs are deleted after a pass and kept (the path is in the failure)
    otherwise: not under pytest's tmp_path, which other runs on the machine rotate away."""
    fault, _, via = fault.partition("@")
    dsn = c.multi_host_dsn if via == "multihost" else c.dsn
    out = Path(tempfile.mkdtemp(prefix=f"tenure-ha-{fault}-"))
    load = Workload(dsn, f"ha_{uuid.uuid4().hex[:10]}", out)
    try:
        load.start()
        _wait(
            lambda: load.relay_lines() and load.exec_lines() and load.probes,
            WARM_UP_TIMEOUT,
            "the workload's first delivery, exec run and acquire",
        )
        time.sleep(STEADY)
        assert not load.running(), load.running()
        before, leader = c.timeline(), c.leader()
        assert leader is not None
        caught = None
        with contextlib.ExitStack() as stack:
            if fault in CLIENT_FAULTS:
                caught = stack.enter_context(exec_caught_after_acquire(c, load, leader))
            fault_t = time.time()
            what = {**FAULTS, **ETCD_FAULTS, **CLIENT_FAULTS}[fault](c)
            end_t = time.time()
        c.wait_healthy()
        timeline = c.timeline()
        if fault in CLIENT_FAULTS:
            # No failover: the same leader on the same timeline, and no work done while cut.
            assert (timeline, c.leader()) == (before, leader), (what, timeline, c.leader())
            done = load.done_between(fault_t, end_t, grace=CUT_GRACE, exec_grace=EXEC_CUT_GRACE)
            assert not done, f"{what}: succeeded during the cut:\n" + "\n".join(done[:20])
            # The exec caught between its acquire and its command's start began the command
            # during the cut, on the lease it holds: the edge was there.
            began = [e["t"] - fault_t for e in load.exec_lines() if e["token"] == caught]
            assert began and 0 < began[0] < EXEC_CUT_GRACE, (caught, began)
            what += f" ({load.cut_outcomes(fault_t, end_t)})"
        else:
            # Every one of these faults ends with a promotion (Patroni promotes even the
            # crashed leader it restarts in place): a fault that changed nothing tested nothing.
            assert timeline > before, f"{what}: still on timeline {before}"
        answered_by_leader(c, load, timeline)
        _wait(
            lambda: all(v is not None for v in vars(load.recovery(fault_t, timeline)).values()),
            RECOVERY_TIMEOUT,
            f"an acquire, a claim and a delivery on timeline {timeline} after the fault",
        )
        recovery = load.recovery(fault_t, timeline)
        exec_before = len(load.exec_lines())
        _wait(lambda: len(load.exec_lines()) > exec_before, RECOVERY_TIMEOUT, "an exec run")
        time.sleep(STEADY)
        assert not load.running(), load.running()
        load.stop()
        report = load.check()
    finally:
        load.kill()
    summary = (
        f"{what} ({'synchronous' if c.synchronous else 'asynchronous'}, "
        f"{'multi-host DSN' if via else 'HAProxy'}): {recovery.describe()}; "
        f"the fault returned after {end_t - fault_t:.1f}s; "
        f"timeline {timeline}; {report.counts}; lost acknowledged runs {len(report.lost_acks)}"
    )
    print(summary)
    with (Path(os.environ.get("TENURE_HA_REPORT", os.devnull))).open("a") as f:
        f.write(summary + "\n")
    found = report.violations + (report.lost_acks if c.synchronous else [])
    if fault == "lagging" and not c.synchronous:
        # Asynchronous replication lost acknowledged commits: the scenario's point. What
        # tenure still guarantees is checked; the topology's losses are listed apart.
        assert report.lost_acks, f"{what}: nothing was lost, the scenario tested nothing"
        found = [f for f in found if not is_loss(f)]
        print("lost with the old primary:", report.lost_acks, report.violations)
    assert not found, f"{what}: logs in {out}\n" + "\n".join(found[:20])
    shutil.rmtree(out, ignore_errors=True)
    return what, recovery


def verify_with_patroni_faults(c: PatroniCluster, seconds: float) -> VerifyResult:
    """``tenure verify``'s workload and checker through the HA endpoint, its nemesis' server
    restart replaced by Patroni faults: ``fast`` is a switchover, ``immediate`` a kill -9 of
    the leader's postmaster; each returns once the cluster has healed."""

    def restart(mode: str) -> None:
        (switchover if mode == "fast" else kill_postmaster)(c)
        c.wait_healthy()

    cfg = VerifyConfig(
        dsn=c.dsn,
        duration=seconds,
        workers=5,
        keys=3,
        ttl=2.0,
        faults=("pause", "kill", RESTART),
        restart=restart,
    )
    return verify_run(cfg)


#: ``TENURE_HA_ALL=1``: every fault, through HAProxy and through the multi-host DSN.
EVERY = [*FAULTS, *(f"{name}@multihost" for name in FAULTS)]
