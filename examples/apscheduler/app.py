"""APScheduler 3 in every process, each job run once per slot across all of them.

Run it in as many processes as you like (web workers, replicas); ``sync_invoices`` runs once
per 1-second slot in total, not once per process:

    TENURE_DSN=postgresql://... python app.py setup        # once: tables
    TENURE_DSN=postgresql://... python app.py run 30       # in each process, for 30 seconds
"""

from __future__ import annotations

import os
import sys
import time

import psycopg
from apscheduler.schedulers.background import BackgroundScheduler
from psycopg import sql

import tenure

DSN = os.environ.get("TENURE_DSN")
SCHEMA = os.environ.get("TENURE_SCHEMA", "tenure")
TABLE = sql.Identifier(SCHEMA, "invoice_syncs")


@tenure.once("sync-invoices", every="1s", ttl="10s", dsn=DSN, schema=SCHEMA, pass_context=True)
def sync_invoices(ctx: tenure.OnceContext) -> None:
    # The business write and the fence commit together: a process that lost its lease
    # (paused past its TTL) cannot commit a stale sync.
    with psycopg.connect(DSN or "") as conn, conn.transaction():
        ctx.fence(conn)
        conn.execute(
            sql.SQL("INSERT INTO {} (slot, token, pid) VALUES (%s, %s, %s)").format(TABLE),
            (ctx.slot, ctx.token, os.getpid()),
        )


def setup() -> None:
    with tenure.connect(DSN, schema=SCHEMA, migrate=True):
        pass
    with psycopg.connect(DSN or "", autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (slot text NOT NULL, token bigint NOT NULL, "
                "pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(TABLE)
        )


def run(seconds: float) -> None:
    scheduler = BackgroundScheduler()
    scheduler.add_job(sync_invoices, "interval", seconds=1)
    scheduler.start()
    try:
        time.sleep(seconds)
    finally:
        scheduler.shutdown(wait=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["setup"]:
        setup()
    elif sys.argv[1:2] == ["run"]:
        run(float(sys.argv[2]) if len(sys.argv) > 2 else 3600)
    else:
        sys.exit("usage: python app.py setup | run [SECONDS]")
