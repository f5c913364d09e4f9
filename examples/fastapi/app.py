"""A FastAPI app whose scheduled job runs once per slot however many workers serve it.

TENURE_DSN=postgresql://... python app.py setup         # once: tables
TENURE_DSN=postgresql://... uvicorn app:app --workers 2
"""

from __future__ import annotations

import os
import sys

import psycopg
from fastapi import FastAPI
from psycopg import sql

import tenure
from tenure.contrib.asgi import lifespan

DSN = os.environ.get("TENURE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEMA = os.environ.get("TENURE_SCHEMA", "tenure")
TABLE = sql.Identifier(SCHEMA, "heartbeats")

scheduler = tenure.Scheduler(DSN, schema=SCHEMA, shutdown_grace="5s")


@scheduler.job("heartbeat", every="1s", ttl="10s")
async def heartbeat(ctx: tenure.JobContext) -> None:
    async with await psycopg.AsyncConnection.connect(DSN) as conn, conn.transaction():
        await ctx.fence_async(conn)  # a worker that lost the job cannot commit
        await conn.execute(
            sql.SQL("INSERT INTO {} (slot, token, pid) VALUES (%s, %s, %s)").format(TABLE),
            (ctx.slot, ctx.token, os.getpid()),
        )


# One line: the scheduler starts and stops with the app, in each worker process.
app = FastAPI(lifespan=lifespan(scheduler))


@app.get("/heartbeats")
async def heartbeats() -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(DSN) as conn:
        cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(TABLE))
        row = await cur.fetchone()
    return {"heartbeats": row[0] if row else 0, "pid": os.getpid()}


def setup() -> None:
    with tenure.connect(DSN, schema=SCHEMA, migrate=True):
        pass
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (slot timestamptz NOT NULL, token bigint NOT NULL,"
                " pid integer NOT NULL)"
            ).format(TABLE)
        )


if __name__ == "__main__" and sys.argv[1:] == ["setup"]:
    setup()
