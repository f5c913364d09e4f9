"""Client clock skew (the fault table's "client clock skew" row): an executor whose wall
clock is minutes off behaves exactly like one whose clock is right, because every time that
decides anything is the database's ``clock_timestamp()``.

The skewed processes run under libfaketime (``faketime -f +10m ...``), which shifts every
clock the process reads (wall and monotonic) by a constant: the rate stays right, so the
local deadline (monotonic, relative) is unaffected, and anything that compared the wall
clock with the database's would be ten minutes wrong.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

import tenure
from tests.faults.test_processes import _check_history, _line
from tests.faults.test_processes import _start as start_holder
from tests.support.env import tenure_env

FAKETIME = shutil.which("faketime")
SKEWS = {"-7m": -420.0, "+10m": 600.0}

pytestmark = pytest.mark.skipif(
    FAKETIME is None,
    reason="libfaketime is not installed (Debian package `faketime`; scripts/test installs "
    "it when it runs as root)",
)


def _prefix(offset: str | None) -> list[str]:
    assert FAKETIME is not None
    return [FAKETIME, "-f", offset] if offset else []


def _start(
    offset: str | None, dsn: str, schema: str, role: str, *args: str
) -> subprocess.Popen[str]:
    return start_holder(role, dsn, schema, *args, prefix=tuple(_prefix(offset)))


@pytest.mark.parametrize("offset", list(SKEWS))
def test_faketime_really_skews_the_child(client: tenure.Client, offset: str) -> None:
    """Guard: without this, the tests below could pass with a libfaketime that does nothing."""
    out = subprocess.run(
        [*_prefix(offset), sys.executable, "-c", "import time; print(time.time())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    skew = float(out) - client.now().timestamp()
    assert abs(skew - SKEWS[offset]) < 30, skew


@pytest.mark.parametrize("offset", [None, *SKEWS])
def test_skewed_holder_paused_past_its_ttl_cannot_commit(
    client: tenure.Client, dsn: str, schema: str, offset: str | None
) -> None:
    """tests/test_processes.py's SIGSTOP scenario with the holder's clock minutes off: the
    same outcome as unskewed (offset None), and its expiry is TTL after the database's now."""
    ttl = 1.0
    with _start(offset, dsn, schema, "pause", "job", str(ttl)) as holder:
        try:
            first = _line(holder)
            info = client.inspect("job")
            assert info is not None and info.token == first["token"]
            assert dt.timedelta(0) < info.expires_at - info.observed_at <= dt.timedelta(seconds=ttl)
            os.kill(holder.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while (successor := client.acquire("job", ttl=30)) is None:
                assert time.monotonic() < deadline, "the paused holder's lease never expired"
                time.sleep(0.05)
            assert successor.token == first["token"] + 1
            client.results.put("job", {"by": "successor"}, token=successor.token)
            os.kill(holder.pid, signal.SIGCONT)
            assert holder.stdin is not None
            holder.stdin.write("go\n")
            holder.stdin.flush()
            outcome = _line(holder)
            assert holder.wait(30) == 0
        finally:
            if holder.poll() is None:
                os.kill(holder.pid, signal.SIGCONT)
                holder.kill()
    assert outcome == {
        "event": "done",
        "result": "stale",
        "fence": "stale",
        "lost": True,
        "current": successor.token,
    }
    stored = client.results.get("job")
    assert stored is not None and stored.payload == {"by": "successor"}


def test_skewed_and_unskewed_contenders_never_overlap(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """Three contenders on one key with 150 ms TTLs, two of them minutes off in opposite
    directions: by the database clock, never two live holders, tokens in order."""
    procs = [_start(offset, dsn, schema, "contend", "hot", "4") for offset in (None, *SKEWS)]
    grants: list[dict[str, Any]] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0
            grants.extend(json.loads(line) for line in out.splitlines())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    acquires = [g for g in grants if g["kind"] == "acquire"]
    assert len(acquires) >= 6, acquires
    _check_history(grants)
    info = client.inspect("hot")
    assert info is not None and info.token == max(g["token"] for g in acquires)


@pytest.mark.parametrize("offset", list(SKEWS))
def test_skewed_exec_waits_for_the_live_lease_then_takes_over(
    client: tenure.Client, dsn: str, schema: str, offset: str
) -> None:
    """`tenure exec` under a skewed clock neither takes a live lease early (+10m would think
    it expired long ago) nor waits for too long (-7m would think it is valid for minutes):
    it gets token+1 strictly after the holder's database expiry."""
    ttl = 2.0
    holder = client.acquire("job", ttl=ttl)
    assert holder is not None
    started = time.monotonic()
    proc = subprocess.run(
        [
            *_prefix(offset),
            sys.executable,
            "-m",
            "tenure",
            "exec",
            "--key",
            "job",
            "--ttl",
            "5s",
            "--wait",
            "20s",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['TENURE_FENCING_TOKEN'])",
        ],
        env=tenure_env(dsn, schema),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    waited = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == str(holder.token + 1)
    info = client.inspect("job")
    assert info is not None and info.token == holder.token + 1
    assert info.acquired_at > holder.expires_at
    assert waited < ttl + 15, "waited far longer than the holder's lease"
