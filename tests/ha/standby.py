"""What works on a hot standby (a Patroni replica) and what needs the primary, for
docs/scale.md's advice to move read-only views off the primary.

Run by ``test_patroni_async.py`` on its cluster (a cluster start per module is the HA
tests' largest fixed cost). A schema with a job, a lease, a result and an outbox message is
written through HAProxy; once a replica has replayed it, each command runs with ``--dsn``
pointing at that replica. Read-only views must answer there; anything that writes must fail
with tenure's one-line error saying the server is read-only and to connect to the primary
(never a traceback), and exit 1; ``tenure doctor`` fails its server check, naming the
standby.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg

import tenure
from tenure import outbox
from tests.support.env import run_tenure

from .cluster import PatroniCluster
from .workload import REPO

READS = [
    ["status"],
    ["status", "--json"],
    ["jobs", "list"],
    ["outbox", "list"],
    ["result", "get", "--key", "ha-standby"],
]
WRITES = [
    ["release", "--key", "ha-standby"],
    ["result", "put", "--key", "ha-standby", "--token", "1"],
    ["exec", "--key", "ha-standby-exec", "--", "true"],
    ["migrate"],
]


def _replayed(replica_dsn: str, primary_dsn: str) -> None:
    with psycopg.connect(primary_dsn, autocommit=True) as conn:
        row = conn.execute(b"SELECT pg_current_wal_lsn()").fetchone()
    assert row is not None
    deadline = time.monotonic() + 30
    while True:
        with psycopg.connect(replica_dsn, autocommit=True) as conn:
            done = conn.execute(
                b"SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
            ).fetchone()
        if done == (True,):
            return
        assert time.monotonic() < deadline, "the replica did not replay the schema"
        time.sleep(0.1)


def check_standby(cluster: PatroniCluster) -> None:
    """The test (run in tests/ha/test_patroni_async.py, on that module's cluster)."""
    schema = f"ha_{uuid.uuid4().hex[:10]}"
    with tenure.connect(cluster.dsn, schema=schema, migrate=True) as client:
        lease = client.acquire("ha-standby", ttl=600)
        assert lease is not None
        client.results.put("ha-standby", {"ok": True}, token=lease.token)
    with psycopg.connect(cluster.dsn) as conn, conn.transaction():
        outbox.enqueue(conn, "ha", "m1", {"n": 1}, schema=schema)
    replica = cluster.member(cluster.replicas()[0])
    _replayed(replica.dsn, cluster.dsn)
    env = {
        **os.environ,
        "TENURE_DSN": replica.dsn,
        "TENURE_SCHEMA": schema,
        "PYTHONPATH": str(REPO),
    }
    env.pop("TENURE_TRACEBACK", None)
    commands = [*READS, *WRITES, ["doctor"]]
    # At once: a command is a Python start (seconds each on a loaded machine), not a fault.
    with ThreadPoolExecutor(len(commands)) as pool:
        procs = list(pool.map(lambda args: run_tenure(args, env, input="{}"), commands))
    seen = {
        " ".join(args): (p.returncode, p.stdout, p.stderr)
        for args, p in zip(commands, procs, strict=True)
    }
    print("\n".join(f"{k}: {v}" for k, v in seen.items()), file=sys.stderr)
    for args in READS:
        rc, out, err = seen[" ".join(args)]
        assert rc == 0, (args, out, err)
    for args in WRITES:
        rc, out, err = seen[" ".join(args)]
        assert rc == 1, (args, rc, out, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert "read-only" in err and "connect to the primary" in err, (args, err)
    # status names the replica that answered, as a standby (its timeline issues no token).
    rows = json.loads(seen["status --json"][1])
    assert {(r["answered_by"], r["standby"], r["timeline"]) for r in rows} == {
        (f"127.0.0.1:{replica.pg_port}", True, None)
    }, rows
    assert f"answered by 127.0.0.1:{replica.pg_port} (standby)" in seen["status"][1]
    # doctor answers, and its server check fails, naming the standby and what to do.
    rc, out, err = seen["doctor"]
    assert rc == 1 and "is a standby (in recovery)" in out and "primary" in out, (out, err)
