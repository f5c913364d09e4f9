"""tenure.contrib.asgi: a Scheduler in an ASGI lifespan. In process: startup errors surface,
shutdown hands over. With real processes: uvicorn with two workers runs each slot once."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import tenure
from tenure.contrib.asgi import lifespan, running

from ..support.examples import (
    EXAMPLES,
    assert_each_slot_once,
    example_env,
    python,
    recorded_slots,
    start,
    stop,
)
from ..support.servers import free_port

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def test_running_starts_the_worker_and_stops_it_with_the_block(dsn: str, schema: str) -> None:
    ran: list[int] = []
    scheduler = tenure.Scheduler(dsn, schema=schema, migrate=True, shutdown_grace="5s")

    @scheduler.job("tick", every="1s", ttl="5s")
    async def tick(ctx: tenure.JobContext) -> None:
        ran.append(ctx.token)

    async def scenario() -> None:
        assert not scheduler.ready
        async with lifespan(scheduler)(object()):
            assert scheduler.ready
            for _ in range(60):
                if ran:
                    break
                await asyncio.sleep(0.1)
        assert not scheduler.ready  # stopped when the block ended

    asyncio.run(scenario())
    assert ran


def test_shutdown_hands_a_running_job_over(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tenure.scheduler")
    started = asyncio.Event()
    scheduler = tenure.Scheduler(dsn, schema=schema, migrate=True, shutdown_grace="0.3s")

    @scheduler.job("long", every="1s", ttl="5s")
    async def long(ctx: tenure.JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    async def scenario() -> None:
        async with running(scheduler):
            await asyncio.wait_for(started.wait(), 30)

    asyncio.run(scenario())
    assert "1 handed over" in caplog.text


def test_startup_fails_when_the_schema_is_not_migrated(dsn: str, schema: str) -> None:
    scheduler = tenure.Scheduler(dsn, schema=schema)

    @scheduler.job("tick", every="1s")
    def tick(ctx: tenure.JobContext) -> None:
        pass

    async def scenario() -> None:
        async with running(scheduler):
            raise AssertionError("the block must not run without the scheduler")

    with pytest.raises(tenure.SchemaNotReady, match="tenure migrate") as refused:
        asyncio.run(scenario())
    # The way to do it where the worker is an app's lifespan, not a command.
    assert "Scheduler(migrate=True)" in str(refused.value)


@pytest.mark.slow
def test_uvicorn_with_two_workers_runs_each_slot_once(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    app_dir = EXAMPLES / "fastapi"
    env = example_env(dsn, schema)
    subprocess.run(python("app.py", "setup"), env=env, cwd=app_dir, check=True, timeout=60)
    port = free_port()
    log = tmp_path / "uvicorn.log"
    server = start(
        python("-m", "uvicorn", "app:app", "--workers", "2", "--port", str(port)),
        env,
        log,
        cwd=app_dir,
    )
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("Application startup complete") < 2:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(6)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/heartbeats", timeout=10) as r:
            assert json.load(r)["heartbeats"] >= 4
    finally:
        code = stop(server)
    text = log.read_text()
    assert code == 0, text
    assert len(re.findall(r"Application shutdown complete", text)) == 2, text
    assert_each_slot_once(recorded_slots(dsn, schema, "heartbeats"), at_least=5)
    workers = {int(p) for p in re.findall(r"Started server process \[(\d+)\]", text)}
    assert len(workers) == 2, text
