"""APScheduler 3: three processes, each with a BackgroundScheduler firing the same interval
job every second, guarded by @tenure.once: each slot ran exactly once (examples/apscheduler)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ..support.examples import (
    EXAMPLES,
    assert_each_slot_once,
    example_env,
    python,
    recorded_slots,
    start,
)

pytest.importorskip("apscheduler")
pytestmark = pytest.mark.slow

APP = str(EXAMPLES / "apscheduler" / "app.py")


def test_three_processes_run_each_slot_once(dsn: str, schema: str, tmp_path: Path) -> None:
    env = example_env(dsn, schema)
    subprocess.run(python(APP, "setup"), env=env, check=True, timeout=60)
    procs = [start(python(APP, "run", "24"), env, tmp_path / f"p{i}.log") for i in range(3)]
    for i, proc in enumerate(procs):
        assert proc.wait(90) == 0, (tmp_path / f"p{i}.log").read_text()
    slots = recorded_slots(dsn, schema, "invoice_syncs")
    assert_each_slot_once(slots, at_least=20)
