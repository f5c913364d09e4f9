"""Celery beat: two beat processes send the same periodic task every second to a prefork
worker on the Redis broker; @tenure.once lets each slot's effect happen once
(examples/celery)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ..support.examples import (
    EXAMPLES,
    assert_each_slot_once,
    example_env,
    python,
    recorded_slots,
    start,
    stop,
)

pytest.importorskip("celery")
pytestmark = pytest.mark.slow

APP_DIR = EXAMPLES / "celery"
REDIS = ("127.0.0.1", 6379)
TASK = r"Task tasks.sync_invoices\[[0-9a-f-]+\]"


def redis_answers() -> bool:
    try:
        with socket.create_connection(REDIS, timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_two_beats_and_a_worker_run_each_slot_once(dsn: str, schema: str, tmp_path: Path) -> None:
    if not redis_answers():
        pytest.skip("Redis is not answering on 127.0.0.1:6379 (scripts/test starts it)")
    # A queue of our own: other users of this Redis never see our messages, nor we theirs.
    env = example_env(dsn, schema, CELERY_QUEUE=f"tenure-test-{uuid.uuid4().hex[:12]}")
    subprocess.run(python("tasks.py", "setup"), env=env, cwd=APP_DIR, check=True, timeout=60)
    celery = python("-m", "celery", "-A", "tasks")
    worker_log = tmp_path / "worker.log"
    worker = start(
        [
            *celery,
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            "2",
            "--loglevel",
            "info",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env,
        worker_log,
        cwd=APP_DIR,
    )
    beats = []
    try:
        deadline = time.monotonic() + 60
        while "ready." not in worker_log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, worker_log.read_text()
            time.sleep(0.2)
        beats = [
            start(
                [*celery, "beat", "--schedule", str(tmp_path / f"beat{i}"), "--loglevel", "info"],
                env,
                tmp_path / f"beat{i}.log",
                cwd=APP_DIR,
            )
            for i in range(2)
        ]
        time.sleep(12)
    finally:
        for beat in beats:
            stop(beat)
        time.sleep(1)  # let the worker finish what the beats sent last
        stop(worker)
    log = worker_log.read_text()
    slots = recorded_slots(dsn, schema, "celery_syncs")
    # Both beats really sent: far more tasks were received than ran, the rest returned None.
    received = len(re.findall(TASK + " received", log))
    skipped = len(re.findall(TASK + r" succeeded in [0-9.e-]+s: None", log))
    assert received >= len(slots) + 5, log
    assert skipped >= 5, log
    # Beat's interval drifts, so a slot with no send at all would be beat's doing; with two
    # beats every slot gets a send or two. But a call that finds the previous slot's run still
    # holding the job's lease returns without running (@tenure.once does not wait), so on a
    # loaded machine a slot whose sends both came then stays unrun: seen once in a full CI run
    # (2026-12-01), one slot of 12. Each slot at most once is the guarantee under test.
    assert_each_slot_once(slots, at_least=8, missing_at_most=1)
