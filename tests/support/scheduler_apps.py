"""Scheduler apps that the scheduler tests run in real worker processes:

    python -m tenure worker tests.support.scheduler_apps:many

Configured by environment variables (the tests set them): TENURE_DSN / TENURE_SCHEMA as for
every tenure command, SCHED_JOBS (how many jobs ``many`` has), SCHED_SLOW (seconds the
``slow`` job works), SCHED_TTL (lease TTL of ``slow`` and ``long``).

Every run writes a row to ``<schema>.evidence`` inside a transaction fenced with its token
(``ctx.fence``), so the tests check what actually ran independently of the scheduler's own
history, and a run whose token was superseded cannot add a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import tenure

SCHEMA = os.environ.get("TENURE_SCHEMA", "tenure")
DSN = os.environ.get("TENURE_DSN", "")
NEVER = "0 0 1 1 *"  # once a year: runs only when triggered during a test

EVIDENCE = """
CREATE TABLE IF NOT EXISTS {schema}.evidence (
    job_key text NOT NULL,
    slot timestamptz NOT NULL,
    token bigint NOT NULL,
    kind text NOT NULL,
    pid integer NOT NULL,
    phase text NOT NULL,
    wall timestamptz NOT NULL,  -- this process's own clock (skewed under libfaketime)
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_lock = threading.Lock()
_pool: ConnectionPool[psycopg.Connection[Any]] | None = None
_apool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None


def _insert() -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {}.evidence (job_key, slot, token, kind, pid, phase, wall) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s)"
    ).format(sql.Identifier(SCHEMA))


def _row(ctx: tenure.JobContext, phase: str) -> tuple[Any, ...]:
    wall = dt.datetime.now(dt.UTC)
    return (ctx.job_key, ctx.slot, ctx.token, ctx.kind, os.getpid(), phase, wall)


def record(ctx: tenure.JobContext, phase: str = "ran") -> None:
    """Write an evidence row in a transaction fenced with this run's token (sync jobs)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ConnectionPool(DSN, min_size=1, max_size=2, open=True)
    with _pool.connection() as conn, conn.transaction():
        ctx.fence(conn)
        conn.execute(_insert(), _row(ctx, phase))


async def record_async(ctx: tenure.JobContext, phase: str = "ran") -> None:
    global _apool
    if _apool is None:
        _apool = AsyncConnectionPool(DSN, min_size=1, max_size=2, open=False)
        await _apool.open()
    async with _apool.connection() as conn, conn.transaction():
        await ctx.fence_async(conn)
        await conn.execute(_insert(), _row(ctx, phase))


# -- many: N jobs every second, half sync, half async ------------------------------------

many = tenure.Scheduler(concurrency=8)


def _tick(ctx: tenure.JobContext) -> None:
    record(ctx)


async def _atick(ctx: tenure.JobContext) -> None:
    await asyncio.sleep(0)
    await record_async(ctx)


for _i in range(int(os.environ.get("SCHED_JOBS", "20"))):
    many.add_job(f"tick-{_i:02d}", _atick if _i % 2 else _tick, every="1s", ttl="5s", misfire="all")
many.add_job("manual", _tick, cron=NEVER, ttl="5s")


# -- KEPT: ten jobs whose next slot comes within a tenth of their TTL, so a worker keeps their
# leases from one run to the next (sched_finish); KEPT_EVERY / KEPT_TTL (1s / 30s). -----------

KEPT = tenure.Scheduler()
for _i in range(10):
    KEPT.add_job(
        f"kept-{_i}",
        _tick,
        every=os.environ.get("KEPT_EVERY", "1s"),
        ttl=os.environ.get("KEPT_TTL", "30s"),
    )


# -- slow: one job that works SCHED_SLOW seconds, then stores its result (fenced) ---------

slow = tenure.Scheduler()
_TTL = os.environ.get("SCHED_TTL", "1.5s")


@slow.job("slow", cron=NEVER, ttl=_TTL)
def slow_job(ctx: tenure.JobContext) -> None:
    record(ctx, "started")
    # time.sleep, not ctx.wait: the run must carry on after a pause and try its write, which
    # the fence then rejects.
    time.sleep(float(os.environ.get("SCHED_SLOW", "3")))
    try:
        ctx.results.put({"pid": os.getpid(), "token": ctx.token})
    except tenure.StaleTokenError as exc:
        print(f"result write rejected: token {exc.token}", file=sys.stderr, flush=True)
        raise
    print(f"result write accepted: token {ctx.token}", file=sys.stderr, flush=True)
    record(ctx, "finished")


# -- long: runs until cancelled (sync and async), for graceful shutdown ---------------------

long = tenure.Scheduler()


@long.job("long-sync", cron=NEVER, ttl="30s")
def long_sync(ctx: tenure.JobContext) -> None:
    record(ctx, "started")
    work = float(os.environ.get("SCHED_SLOW", "60"))
    if ctx.wait(work):
        ctx.check()  # raises LeaseLost: the worker is shutting down
    record(ctx, "finished")


@long.job("long-async", cron=NEVER, ttl="30s")
async def long_async(ctx: tenure.JobContext) -> None:
    await record_async(ctx, "started")
    await asyncio.sleep(float(os.environ.get("SCHED_SLOW", "60")))
    await record_async(ctx, "finished")


# -- hostile: job bodies that raise what a job must never let out (triggered by the tests) -----

hostile = tenure.Scheduler()


@hostile.job("exit-sync", cron=NEVER, ttl="5s")
def exit_sync(ctx: tenure.JobContext) -> None:
    sys.exit(3)


@hostile.job("exit-async", cron=NEVER, ttl="5s")
async def exit_async(ctx: tenure.JobContext) -> None:
    await asyncio.sleep(0)
    sys.exit(4)


@hostile.job("interrupt-sync", cron=NEVER, ttl="5s")
def interrupt_sync(ctx: tenure.JobContext) -> None:
    raise KeyboardInterrupt


@hostile.job("interrupt-async", cron=NEVER, ttl="5s")
async def interrupt_async(ctx: tenure.JobContext) -> None:
    raise KeyboardInterrupt


@hostile.job("cancel-itself", cron=NEVER, ttl="5s")
async def cancel_itself(ctx: tenure.JobContext) -> None:
    raise asyncio.CancelledError("the body raised this itself")


@hostile.job("innocent", every="1s", ttl="5s", misfire="all")
def innocent(ctx: tenure.JobContext) -> None:
    record(ctx)


# -- poison: a job that kills its worker process, next to an innocent one ---------------------

poison = tenure.Scheduler()
POISON_EXIT = 7


@poison.job("poison", every="1s", ttl="2s")
def poison_job(ctx: tenure.JobContext) -> None:
    os._exit(POISON_EXIT)  # what a segfault or the OOM killer does: no finally, no record


@poison.job("innocent", every="1s", ttl="3s", misfire="all")
def poison_neighbour(ctx: tenure.JobContext) -> None:
    record(ctx)


# -- owner_a / owner_b: two apps that define the same job key (SHARED_EVERY: owner_a's) ------

owner_a = tenure.Scheduler()
owner_b = tenure.Scheduler()


@owner_a.job("shared", every=os.environ.get("SHARED_EVERY", "10s"), ttl="5s")
def shared_a(ctx: tenure.JobContext) -> None:
    record(ctx, "owner_a")


@owner_b.job("shared", cron=NEVER, ttl="5s")
def shared_b(ctx: tenure.JobContext) -> None:
    record(ctx, "owner_b")


# -- isolated: bodies in a child process (isolation="process") ---------------------------------

isolated = tenure.Scheduler()


@isolated.job("segfault", cron=NEVER, ttl="5s", isolation="process")
def segfault(ctx: tenure.JobContext) -> None:
    import ctypes

    ctypes.string_at(0)  # SIGSEGV: what a crashing C extension does


@isolated.job("exit-hard", cron=NEVER, ttl="5s", isolation="process")
def exit_hard(ctx: tenure.JobContext) -> None:
    os._exit(5)


@isolated.job("raises", cron=NEVER, ttl="5s", isolation="process")
def raises(ctx: tenure.JobContext) -> None:
    raise ValueError("boom")


@isolated.job("writes", cron=NEVER, ttl="5s", isolation="process")
def writes(ctx: tenure.JobContext) -> None:
    record(ctx)
    ctx.results.put({"pid": os.getpid(), "token": ctx.token})


@isolated.job("writes-async", cron=NEVER, ttl="5s", isolation="process")
async def writes_async(ctx: tenure.JobContext) -> None:
    await record_async(ctx)


# Bodies that return leaving something running in their process. The run must still be
# recorded when the body returns, and the process must not outlive it.
_left: list[Any] = []  # what they leave, referenced


@isolated.job("leaves-a-pool", cron=NEVER, ttl="5s", isolation="process")
async def leaves_a_pool(ctx: tenure.JobContext) -> None:
    """Returns while a pool of its own is still making a connection, as writes-async does
    when the pool it never closes is growing: psycopg_pool 3.3 catches the CancelledError
    that the end of asyncio.run sends into that connect ("error connecting in 'pool-N': ",
    an empty message) and its task waits on for more work."""
    await record_async(ctx)
    connecting = asyncio.Event()

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        connecting.set()
        await asyncio.sleep(3600)

    pool = AsyncConnectionPool(DSN, min_size=1, configure=configure, open=False)
    await pool.open()
    _left.append(pool)
    await connecting.wait()


async def _stubborn() -> None:
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


async def leaves_a_task(ctx: tenure.JobContext) -> None:
    """Returns leaving a task that ignores being cancelled (run by the child alone)."""
    _left.append(asyncio.create_task(_stubborn()))
    await asyncio.sleep(0)


@isolated.job("leaves-a-thread", cron=NEVER, ttl="5s", isolation="process")
def leaves_a_thread(ctx: tenure.JobContext) -> None:
    """Returns leaving a thread that never ends (not a daemon: the interpreter waits for it
    on its way out)."""
    record(ctx)
    threading.Thread(target=threading.Event().wait, name="left-running").start()


@isolated.job("waits", cron=NEVER, ttl="5s", isolation="process")
def waits(ctx: tenure.JobContext) -> None:
    record(ctx, "started")
    ctx.wait(60)
    ctx.check()  # raises: the worker stopped this run
    record(ctx, "finished")


@isolated.job("neighbour", every="1s", ttl="5s", misfire="all")
def isolated_neighbour(ctx: tenure.JobContext) -> None:
    record(ctx)


collector_probe = tenure.Scheduler()


@collector_probe.job("gc-probe", every="1s", ttl="5s")
def gc_probe(ctx: tenure.JobContext) -> None:
    record(ctx, f"threshold={gc.get_threshold()[0]} frozen={gc.get_freeze_count() > 0}")


# -- gated: two jobs whose bodies wait for a file, on a worker with one body slot -------------


def _gated(ctx: tenure.JobContext) -> None:
    record(ctx, "started")
    gate = os.environ["SCHED_GATE"]
    if os.environ.get("SCHED_GATE_BLIND") == "1":
        # A body that never looks at its context after its fenced write: it sleeps until the
        # gate opens and returns, whatever became of its lease meanwhile.
        while not os.path.exists(gate):
            time.sleep(0.05)
        return
    while not os.path.exists(gate):
        if ctx.wait(0.05):
            ctx.check()  # raises: the lease is lost or the worker stops
    record(ctx, "finished")


def gated_app(dsn: str | None = None, schema: str = "tenure") -> tenure.Scheduler:
    """``gate-a`` and ``gate-b`` (triggered by the tests) on a worker with one body slot;
    the tests register the same definitions before they start the worker."""
    app = tenure.Scheduler(dsn, schema=schema, concurrency=1, name="gated")
    for key in ("gate-a", "gate-b"):
        app.add_job(key, _gated, cron=NEVER, ttl=_TTL)
    return app


gated = gated_app()


# -- stubborn: bodies that do not stop when their worker shuts down (triggered by the tests) ---

stubborn = tenure.Scheduler(name="stubborn", shutdown_grace="1s")


@stubborn.job("stubborn-sync", cron=NEVER, ttl="30s", quarantine_after=2)
def stubborn_sync(ctx: tenure.JobContext) -> None:
    record(ctx, "started")
    time.sleep(10**6)  # never looks at ctx: nothing can stop it


@stubborn.job("stubborn-async", cron=NEVER, ttl="30s", quarantine_after=2)
async def stubborn_async(ctx: tenure.JobContext) -> None:
    await record_async(ctx, "started")
    while True:
        with contextlib.suppress(asyncio.CancelledError):  # a body that refuses cancellation
            await asyncio.sleep(1000)


# -- tasks: runtime schedules (issue 27): tasks in code, schedules in the database ------------
# Each run writes an evidence row whose phase is its ctx.args as JSON (sorted keys), so the
# tests see which definition each run used.

tasks = tenure.Scheduler(name="tasks-app", concurrency=8)


def _args_phase(ctx: tenure.JobContext) -> str:
    import json

    return json.dumps(ctx.args, sort_keys=True)


@tasks.task("echo")
def echo_task(ctx: tenure.JobContext) -> None:
    record(ctx, _args_phase(ctx))


@tasks.task("echo-async")
async def echo_task_async(ctx: tenure.JobContext) -> None:
    await record_async(ctx, _args_phase(ctx))


@tasks.task("slow-task")
def slow_task(ctx: tenure.JobContext) -> None:
    """As ``slow`` above, for a runtime schedule: works SCHED_SLOW seconds, then stores its
    result (strict fence) and records 'finished'."""
    record(ctx, "started")
    time.sleep(float(os.environ.get("SCHED_SLOW", "3")))
    try:
        ctx.results.put({"pid": os.getpid(), "token": ctx.token})
    except tenure.StaleTokenError as exc:
        print(f"result write rejected: token {exc.token}", file=sys.stderr, flush=True)
        raise
    print(f"result write accepted: token {ctx.token}", file=sys.stderr, flush=True)
    record(ctx, "finished")


# -- deploy_v1 / deploy_v2: one app ("deploy") before and after a job was removed from it -----
# RETIRE_PRESENCE_TTL/EVERY shorten the presence row's lifetime (scheduler/presence.py) so a
# killed worker's job keys stop counting within seconds instead of 30 s.

if os.environ.get("RETIRE_PRESENCE_TTL"):
    from tenure.scheduler import presence as _presence

    _presence.PRESENCE_TTL = float(os.environ["RETIRE_PRESENCE_TTL"])
    _presence.PRESENCE_EVERY = float(os.environ.get("RETIRE_PRESENCE_EVERY", "0.5"))

deploy_v1 = tenure.Scheduler(name="deploy")
deploy_v2 = tenure.Scheduler(name="deploy")


@deploy_v1.job("keep", cron=NEVER, ttl="5s")
@deploy_v2.job("keep", cron=NEVER, ttl="5s")
def keep(ctx: tenure.JobContext) -> None:
    record(ctx)


@deploy_v1.job("gone", cron=NEVER, ttl="2s")
def gone(ctx: tenure.JobContext) -> None:
    """Runs until its worker is killed (the test SIGKILLs it mid-run)."""
    record(ctx, "started")
    while not ctx.cancelled:
        time.sleep(0.05)


# -- blocker: an async job that blocks its worker's event loop (issue 29) --------------------

blocker = tenure.Scheduler()
BLOCK_TTL = 2.0


@blocker.job("blocks-loop", every="1s", ttl=f"{BLOCK_TTL:g}s")
async def blocks_loop(ctx: tenure.JobContext) -> None:
    # Sync code inside async def: the worker's loop (lease renewals included) stops for twice
    # the TTL, so the lease expires under a live worker.
    time.sleep(2 * BLOCK_TTL)


# -- crowded: slow bodies beside a quick one, at the default concurrency (issue 28) ----------
# SCHED_SLEEPERS (8: as many as the default 8 body slots) jobs whose sync bodies sleep
# SCHED_SLOW seconds, one quick ``probe`` that records when its body began (none with
# SCHED_PROBE=0; SCHED_QUICK more like it), and two slow ``newcomer`` jobs that run only
# when triggered. SCHED_OWN_FUNCTIONS=1: each sleeper and quick job has a function of its own.

crowded = tenure.Scheduler(name="crowded")


def _sleeper(ctx: tenure.JobContext) -> None:
    time.sleep(float(os.environ.get("SCHED_SLOW", "4")))


def _own(fn: Callable[[tenure.JobContext], None]) -> Callable[[tenure.JobContext], None]:
    """``fn``, or with SCHED_OWN_FUNCTIONS=1 a function of its own that calls it: a worker
    then learns nothing of a job from the other jobs of its function (bodies.py)."""
    if os.environ.get("SCHED_OWN_FUNCTIONS") != "1":
        return fn

    def own(ctx: tenure.JobContext) -> None:
        fn(ctx)

    return own


for _i in range(int(os.environ.get("SCHED_SLEEPERS", "8"))):
    crowded.add_job(f"sleeper-{_i}", _own(_sleeper), every="1s", ttl="10s")


def _probe(ctx: tenure.JobContext) -> None:
    record(ctx)


if os.environ.get("SCHED_PROBE", "1") != "0":
    crowded.add_job("probe", _probe, every="1s", ttl="5s")

# SCHED_QUICK (0) more quick jobs like the probe, ``quick-<i>``.
for _i in range(int(os.environ.get("SCHED_QUICK", "0"))):
    crowded.add_job(f"quick-{_i}", _own(_probe), every="1s", ttl="5s")


# Two slow jobs the worker has not run yet when a test triggers them: they sleep
# SCHED_NEW_SLOW seconds and record when their bodies began.
def _newcomer(ctx: tenure.JobContext) -> None:
    record(ctx, "started")
    time.sleep(float(os.environ.get("SCHED_NEW_SLOW", "6")))


for _i in range(2):
    crowded.add_job(f"newcomer-{_i}", _newcomer, cron=NEVER, ttl="10s")


# -- cancellable: a run that works until told to stop (the dashboard's Cancel, issue 29) -------

cancellable = tenure.Scheduler()


def note(ctx: tenure.JobContext, phase: str) -> None:
    """An evidence row written without the fence: what the body did after it was told to stop."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ConnectionPool(DSN, min_size=1, max_size=2, open=True)
    with _pool.connection() as conn:
        conn.execute(_insert(), _row(ctx, phase))


@cancellable.job("cancel-me", cron=NEVER, ttl="3s")
def cancel_me(ctx: tenure.JobContext) -> None:
    record(ctx, "started")
    while not ctx.wait(0.1):
        ctx.check()
    note(ctx, "stopped")
    ctx.check()  # raises LeaseLost: the run ends as a run that lost its lease does
