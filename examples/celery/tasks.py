"""Celery beat sends a periodic task; @tenure.once makes its effect happen once per slot, even
with two beat processes (a deploy overlap, a second replica) sending it twice.

    TENURE_DSN=postgresql://... python tasks.py setup                 # once: tables
    celery -A tasks worker --loglevel info
    celery -A tasks beat --schedule /tmp/beat-a       # and a second one: still once per slot
"""

from __future__ import annotations

import os
import sys

import psycopg
from celery import Celery
from psycopg import sql

import tenure

DSN = os.environ.get("TENURE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEMA = os.environ.get("TENURE_SCHEMA", "tenure")
TABLE = sql.Identifier(SCHEMA, "celery_syncs")

app = Celery("tasks", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue=os.environ.get("CELERY_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    beat_schedule={"sync-invoices": {"task": "tasks.sync_invoices", "schedule": 1.0}},
    worker_hijack_root_logger=False,
)


@app.task
@tenure.once(
    "celery.sync-invoices", every="1s", ttl="10s", dsn=DSN, schema=SCHEMA, pass_context=True
)
def sync_invoices(ctx: tenure.OnceContext) -> int:
    # Runs in whichever worker process got the message; the others' copies return None.
    with psycopg.connect(DSN) as conn, conn.transaction():
        ctx.fence(conn)
        conn.execute(
            sql.SQL("INSERT INTO {} (slot, token, pid) VALUES (%s, %s, %s)").format(TABLE),
            (ctx.slot, ctx.token, os.getpid()),
        )
    return ctx.token


def setup() -> None:
    with tenure.connect(DSN, schema=SCHEMA, migrate=True):
        pass
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (slot text NOT NULL, token bigint NOT NULL, "
                "pid integer NOT NULL)"
            ).format(TABLE)
        )


if __name__ == "__main__" and sys.argv[1:] == ["setup"]:
    setup()
