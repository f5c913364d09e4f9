"""A finished run leaves nothing for the cyclic garbage collector: its objects are freed by
reference counting as soon as the run ends. A reference cycle per run (a JobContext and its
result store pointing at each other, with the lease, its events and locks hanging off them)
made the collector a tenth of a busy worker's CPU (bench/README.md)."""

from __future__ import annotations

import collections
import gc
import threading

import tenure
from tenure.db.channels import channel
from tenure.scheduler import jobs as ops
from tests.support.scheduler_apps import NEVER
from tests.support.scheduler_support import InProcessWorker, prepare, wait_for


def test_finished_runs_leave_no_reference_cycles(dsn: str, schema: str) -> None:
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    ran: list[int] = []
    done = threading.Event()

    @app.job("sync-job", cron=NEVER, ttl="30s")
    def sync_job(ctx: tenure.JobContext) -> None:
        ctx.results.put({"token": ctx.token})
        ran.append(ctx.token)
        done.set()

    @app.job("async-job", cron=NEVER, ttl="30s")
    async def async_job(ctx: tenure.JobContext) -> None:
        await ctx.results.put_async({"token": ctx.token})
        ran.append(ctx.token)
        done.set()

    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for key in ("sync-job", "async-job") * 3:
                done.clear()
                ops.trigger(client, key, channel=channel("jobs", schema))
                assert done.wait(10)
                wait_for(
                    lambda key=key: (
                        not [
                            r for r in ops.list_jobs(client) if r.job_key == key and r.running_slot
                        ]
                    ),
                    timeout=10,
                    what="the run to be recorded",
                )
            gc.collect()
            garbage = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert len(ran) == 6
    leaked = {name: n for name, n in garbage.items() if name in {"JobContext", "AsyncLease", "Run"}}
    assert not leaked, garbage.most_common(10)
