"""The HA tests' workload, run in real processes through the cluster's HA endpoint:

    python -m tenure worker tests.ha.apps:sched          # two of them
    python -m tenure relay --handlers tests.ha.apps:handlers

Configured by the environment: TENURE_DSN / TENURE_SCHEMA as for every tenure command, and
HA_LOG, a directory where each process appends JSON lines (one file per process, a line
flushed per write: a killed process loses at most the line in flight). These client-side
records are the evidence that survives a failover that loses commits: what each run was
told (its token), whether its commit was acknowledged, what the relay delivered.

Each run of a scheduled job writes, in one transaction fenced with its token, an evidence
row and an outbox message whose key names the run: so a delivered message must match a
committed evidence row, and every committed row's message must be delivered.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

import tenure
from tenure import outbox

SCHEMA = os.environ.get("TENURE_SCHEMA", "tenure")
DSN = os.environ.get("TENURE_DSN", "")
JOBS = int(os.environ.get("HA_JOBS", "3"))
TOPIC = "ha"

EVIDENCE = """
CREATE TABLE {schema}.ha_evidence (
    id bigserial PRIMARY KEY,
    job_key text NOT NULL,
    slot timestamptz NOT NULL,
    token bigint NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_lock = threading.Lock()
_files: dict[str, Any] = {}


def log_line(kind: str, **fields: Any) -> None:
    """Append one JSON line to this process's ``HA_LOG/<kind>-<pid>.jsonl``."""
    with _lock:
        f = _files.get(kind)
        if f is None:
            path = os.path.join(os.environ["HA_LOG"], f"{kind}-{os.getpid()}.jsonl")
            f = _files[kind] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        f.write(json.dumps({**fields, "pid": os.getpid(), "t": time.time()}, default=str) + "\n")
        f.flush()


def _run(ctx: tenure.JobContext) -> None:
    run = {"job": ctx.job_key, "slot": ctx.slot.isoformat(), "token": ctx.token}
    # A run must never start after its lease's local deadline: record how much was left.
    log_line("sched", ph="begin", left=ctx.lease.deadline_in, **run)
    insert = sql.SQL(
        "INSERT INTO {}.ha_evidence (job_key, slot, token, pid) VALUES (%s, %s, %s, %s)"
    ).format(sql.Identifier(SCHEMA))
    try:
        with (
            psycopg.connect(DSN, connect_timeout=3, application_name="ha-job") as conn,
            conn.transaction(),
        ):
            ctx.fence(conn)
            conn.execute(insert, (ctx.job_key, ctx.slot, ctx.token, os.getpid()))
            outbox.enqueue(
                conn,
                TOPIC,
                f"{ctx.job_key}@{ctx.slot.isoformat()}@{ctx.token}",
                run,
                job_key=ctx.job_key,
                token=ctx.token,
                schema=SCHEMA,
            )
            # COMMIT follows: from here on the outcome is unknown until it returns.
            log_line("sched", ph="commit", left=ctx.lease.deadline_in, **run)
    except tenure.StaleTokenError:
        log_line("sched", ph="stale", **run)
        raise
    except Exception as exc:
        log_line("sched", ph="failed", error=type(exc).__name__, **run)
        raise
    log_line("sched", ph="ok", **run)


sched = tenure.Scheduler(concurrency=4)
for _i in range(JOBS):
    sched.add_job(f"ha-{_i}", _run, every="1s", ttl="6s")


def _deliver(msg: outbox.Message) -> None:
    log_line("relay", key=msg.key, id=msg.id, attempt=msg.attempts)


handlers = {TOPIC: _deliver}
