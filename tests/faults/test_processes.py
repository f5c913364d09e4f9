"""Real processes and real signals: pauses, kills and many contenders (invariants 1, 2, 3, 7)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tenure
from tests.support.env import tenure_env

HOLDER = Path(__file__).parents[1] / "support" / "proc_holder.py"


def _start(
    role: str, dsn: str, schema: str, *args: str, prefix: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """Start tests/support/proc_holder.py in ROLE; ``prefix`` wraps it (e.g. faketime)."""
    return subprocess.Popen(
        [*prefix, sys.executable, str(HOLDER), role, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=tenure_env(dsn, schema),
    )


def _line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"process {proc.pid} exited early with {proc.wait()}"
    data: dict[str, Any] = json.loads(line)
    return data


def _wait_expired(client: tenure.Client, key: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = client.inspect(key)
        if info is not None and not info.held:
            return
        time.sleep(0.05)
    raise AssertionError(f"lease {key} did not expire")


def test_sigstop_holder_past_ttl_cannot_commit(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    """Paused past its TTL (SIGSTOP), the holder's writes after SIGCONT affect zero rows."""
    with _start("pause", dsn, schema, "job", "1") as holder:
        try:
            _sigstop_scenario(client, holder)
        finally:
            if holder.poll() is None:
                os.kill(holder.pid, signal.SIGCONT)
                holder.kill()
    stored = client.results.get("job")
    assert stored is not None and stored.payload == {"by": "successor"}
    with client.connection() as conn:
        ledger = conn.execute(
            tenure.db.queries.compose("SELECT count(*) FROM {schema}.ledger", schema)
        ).fetchone()
    assert ledger == (0,), "the stale holder's fenced business write must not be there"


def _sigstop_scenario(client: tenure.Client, holder: subprocess.Popen[str]) -> None:
    first = _line(holder)
    assert first["event"] == "acquired"
    os.kill(holder.pid, signal.SIGSTOP)
    _wait_expired(client, "job")
    successor = client.acquire("job", ttl=30)
    assert successor is not None and successor.token == first["token"] + 1
    client.results.put("job", {"by": "successor"}, token=successor.token)
    os.kill(holder.pid, signal.SIGCONT)
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    outcome = _line(holder)
    assert outcome == {
        "event": "done",
        "result": "stale",
        "fence": "stale",
        "lost": True,
        "current": successor.token,
    }
    assert holder.wait(10) == 0


def test_sigkill_holder_restart_is_a_new_owner(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    # TTL 3 s: the restarted process must start while the old lease is still live, which a
    # loaded 2-core machine does not always manage within 1 s.
    with _start("hold", dsn, schema, "job", "3") as holder:
        first = _line(holder)
        os.kill(holder.pid, signal.SIGKILL)
    # The restarted executor is a new owner: it cannot renew the old lease, even knowing
    # the token, and it gets token+1 only after the old lease expired.
    with _start("renew-as-new-owner", dsn, schema, "job", str(first["token"])) as again:
        outcome = _line(again)
        assert again.wait(30) == 0
    assert outcome["renew"] == "refused"
    assert outcome["owner"] != first["owner"]
    assert outcome["acquired_token"] == first["token"] + 1
    assert outcome["waited_for_expiry"] is True


def _check_history(grants: list[dict[str, Any]]) -> None:
    """Tokens unique and increasing in takeover order; between two tokens, the successor's
    takeover is strictly after every expiry the predecessor was granted (DB clock)."""
    grants = [
        {k: dt.datetime.fromisoformat(v) if k in ("at", "until") else v for k, v in g.items()}
        for g in grants
    ]
    by_token: dict[int, dict[str, Any]] = {}
    for g in grants:
        if g["kind"] == "acquire":
            assert g["token"] not in by_token, f"token {g['token']} issued twice"
            by_token[g["token"]] = {"at": g["at"], "until": g["until"], "owner": g["owner"]}
    for g in grants:
        if g["kind"] == "renew":
            entry = by_token[g["token"]]
            assert entry["owner"] == g["owner"]
            entry["until"] = max(entry["until"], g["until"])
    for g in grants:
        if g["kind"] == "release":  # released early: the lease ended then
            entry = by_token[g["token"]]
            assert entry["owner"] == g["owner"]
            entry["until"] = min(entry["until"], g["at"])
    tokens = sorted(by_token)
    assert tokens == list(range(tokens[0], tokens[0] + len(tokens))), "a token was skipped"
    for prev, nxt in itertools.pairwise(tokens):
        a, b = by_token[prev], by_token[nxt]
        assert b["at"] > a["at"], f"token {nxt} taken before token {prev}"
        assert b["at"] > a["until"], (
            f"two live holders: token {nxt} taken at {b['at']} while token {prev} "
            f"was granted until {a['until']}"
        )


@pytest.mark.slow
def test_twenty_processes_contending_for_one_key(
    client: tenure.Client, dsn: str, schema: str
) -> None:
    procs = [_start("contend", dsn, schema, "hot", "8") for _ in range(20)]
    grants: list[dict[str, Any]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        grants.extend(json.loads(line) for line in out.splitlines())
    acquires = [g for g in grants if g["kind"] == "acquire"]
    renews = [g for g in grants if g["kind"] == "renew"]
    busy = sum(g["busy"] for g in grants if g["kind"] == "summary")
    assert len(acquires) >= 20 and renews and busy > 0, (len(acquires), len(renews), busy)
    _check_history(grants)
    info = client.inspect("hot")
    assert info is not None and info.token == max(g["token"] for g in acquires)


def test_checker_detects_overlap() -> None:
    """The history checker above must be able to fail."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).isoformat()
    t1 = dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=dt.UTC).isoformat()
    t2 = dt.datetime(2026, 1, 1, 0, 0, 2, tzinfo=dt.UTC).isoformat()
    overlapping = [
        {"kind": "acquire", "token": 1, "at": t0, "until": t2, "owner": "a"},
        {"kind": "acquire", "token": 2, "at": t1, "until": t2, "owner": "b"},
    ]
    with pytest.raises(AssertionError, match="two live holders"):
        _check_history(overlapping)
    with pytest.raises(AssertionError, match="issued twice"):
        _check_history([overlapping[0], {**overlapping[1], "token": 1}])
