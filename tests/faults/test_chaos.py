"""The fault-injection run (tests/chaos/) in its short CI form, and its checker.

CI: a ~25 s fenced run (all faults, own throwaway server) must find zero violations; a ~10 s
run with ``--no-fence`` must find violations (the checker can fail). The long run is
``python -m tests.chaos --seconds 600 --workers 8 --keys 4`` (docs/topologies/chaos.md).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import checker
from tests.support.servers import pg_bindir

ROOT = Path(__file__).resolve().parents[2]

needs_server = pytest.mark.skipif(
    pg_bindir() is None,
    reason="no PostgreSQL server binaries: the chaos run restarts a server it starts itself",
)


def _chaos(tmp_path: Path, *args: str, timeout: float = 100) -> tuple[int, dict[str, Any], str]:
    summary = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.chaos",
            "--out",
            str(tmp_path / "logs"),
            "--json",
            str(summary),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert summary.exists(), proc.stdout + proc.stderr
    return proc.returncode, json.loads(summary.read_text()), proc.stdout


@needs_server
def test_fenced_run_under_faults_has_no_violations(tmp_path: Path) -> None:
    code, summary, text = _chaos(
        tmp_path, "--seconds", "25", "--workers", "5", "--keys", "3", "--ttl", "1"
    )
    print(text)  # the figures, for the log (pytest -s / on failure)
    assert summary["violations"] == {}, text
    assert code == 0
    assert summary["crashes"] == [], text
    # The run must have been hard enough to mean something: every fault was injected, and
    # paused holders did write after their local deadline (which only the fence stopped).
    for fault in ("pause", "kill", "terminate", "restart"):
        assert summary["faults"].get(fault, 0) >= 1, (fault, summary["faults"])
    assert sum(summary["late_writes"].values()) >= 1, text
    ops = summary["ops"]
    assert ops["acquire"].get("ok", 0) >= 20 and ops["ledger"].get("ok", 0) >= 20, ops
    assert summary["checked"]["takeovers"] >= ops["acquire"]["ok"]


@needs_server
def test_unfenced_run_is_caught_by_the_checker(tmp_path: Path) -> None:
    """Without tenure.fence and with a last-writer-wins result upsert, paused holders commit
    stale writes: the same checker must report them."""
    code, summary, text = _chaos(
        tmp_path,
        "--seconds",
        "10",
        "--workers",
        "5",
        "--keys",
        "3",
        "--no-fence",
        "--expect-violations",
    )
    print(text)
    assert code == 0, text
    stale_kinds = {"ledger-regressed", "result-regressed", "ledger-after-takeover"}
    assert stale_kinds & set(summary["violations"]), text


# -- the checker on hand-made histories (it must be able to fail) -------------------------------

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _t(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat()


def _op(n: int, op: str, outcome: str = "ok", w: int = 0, **fields: Any) -> dict[str, Any]:
    return {"w": w, "inc": 0, "n": n, "op": op, "outcome": outcome, "t": n, **fields}


def _history() -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """A clean history: token 1 (worker 0) writes and releases; token 2 (worker 1) writes."""
    ops = [
        _op(1, "acquire", key="k", token=1, owner="a", at=_t(0), until=_t(1)),
        _op(2, "ledger", key="k", token=1, owner="a", wid="l0.0.2"),
        _op(3, "result", key="k", token=1, owner="a", wid="r0.0.3"),
        _op(4, "renew", key="k", token=1, owner="a", until=_t(2)),
        _op(5, "release", key="k", token=1, owner="a", at=_t(1.5)),
        _op(1, "acquire", w=1, key="k", token=2, owner="b", at=_t(1.6), until=_t(3)),
        _op(2, "ledger", w=1, key="k", token=2, owner="b", wid="l1.0.2"),
        _op(3, "result", w=1, key="k", token=2, owner="b", wid="r1.0.3"),
    ]
    snap: dict[str, list[dict[str, Any]]] = {
        "takeovers": [
            {"id": 1, "job_key": "k", "token": 1, "owner": "a", "committed_at": _t(0)},
            {"id": 2, "job_key": "k", "token": 2, "owner": "b", "committed_at": _t(1.6)},
        ],
        "ledger": [
            {"id": 1, "job_key": "k", "token": 1, "wid": "l0.0.2", "committed_at": _t(0.5)},
            {"id": 2, "job_key": "k", "token": 2, "wid": "l1.0.2", "committed_at": _t(2)},
        ],
        "results_history": [
            {"id": 1, "job_key": "k", "token": 1, "wid": "r0.0.3", "committed_at": _t(0.6)},
            {"id": 2, "job_key": "k", "token": 2, "wid": "r1.0.3", "committed_at": _t(2.1)},
        ],
        "results": [{"job_key": "k", "token": 2, "wid": "r1.0.3"}],
        "leases": [{"job_key": "k", "token": 2}],
    }
    return ops, snap


def _kinds(ops: list[dict[str, Any]], snap: dict[str, list[dict[str, Any]]]) -> set[str]:
    return {v.kind for v in checker.check(ops, snap).violations}


def test_checker_accepts_a_clean_history() -> None:
    assert _kinds(*_history()) == set()


def test_checker_detects_two_live_holders() -> None:
    ops, snap = _history()
    ops[4] = {**ops[4], "outcome": "none"}  # no release: token 1 was live until t=2
    assert "two-holders" in _kinds(ops, snap)


def test_checker_detects_reissued_and_skipped_tokens() -> None:
    ops, snap = _history()
    snap["takeovers"][1] = {**snap["takeovers"][1], "token": 1}
    assert {"token-reissued", "token-order", "token-final"} <= _kinds(ops, snap)
    ops, snap = _history()
    snap["takeovers"][1] = {**snap["takeovers"][1], "token": 3}
    snap["leases"] = [{"job_key": "k", "token": 3}]
    assert "token-gap" in _kinds(ops, snap)


def test_checker_detects_a_lost_acknowledged_takeover() -> None:
    ops, snap = _history()
    del snap["takeovers"][1]
    snap["leases"] = [{"job_key": "k", "token": 1}]
    assert "acquire-lost" in _kinds(ops, snap)


def test_checker_detects_stale_commits() -> None:
    ops, snap = _history()
    snap["ledger"].reverse()  # token 1's row committed after token 2's
    snap["results_history"].reverse()
    snap["results"] = [{"job_key": "k", "token": 1, "wid": "r0.0.3"}]
    kinds = _kinds(ops, snap)
    assert {"ledger-regressed", "result-regressed", "result-final"} <= kinds
    ops, snap = _history()
    # Strict fencing: token 1's ledger row committed after token 2's takeover committed,
    # even though no token-2 row came before it.
    snap["ledger"] = [{**snap["ledger"][0], "committed_at": _t(1.7)}]
    snap["ledger"][0]["wid"] = "l0.0.2"
    ops = [o for o in ops if o.get("wid") != "l1.0.2"]
    assert _kinds(ops, snap) == {"ledger-after-takeover"}


def test_checker_detects_lost_and_phantom_writes() -> None:
    ops, snap = _history()
    del snap["ledger"][1]  # acknowledged, then missing
    assert "write-lost" in _kinds(ops, snap)
    ops, snap = _history()
    ops[2] = {**ops[2], "outcome": "stale"}  # refused, yet committed
    assert "failed-write-committed" in _kinds(ops, snap)
    ops, snap = _history()
    ops[2] = {**ops[2], "outcome": "unknown"}  # unknown may be either: no violation
    assert _kinds(ops, snap) == set()


def test_checker_pairs_log_lines_and_treats_killed_operations_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl"
    lines = [
        {"w": 0, "inc": 0, "n": 1, "op": "ledger", "ph": "b", "key": "k", "token": 1, "t": 1},
        {"w": 0, "inc": 0, "n": 1, "op": "ledger", "ph": "e", "outcome": "ok", "t": 2},
        {"w": 0, "inc": 0, "n": 2, "op": "ledger", "ph": "b", "key": "k", "token": 1, "t": 3},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"w": 0, "inc')
    ops = checker.read_ops([path])
    assert [(o["n"], o["outcome"]) for o in ops] == [(1, "ok"), (2, "unknown")]
    assert ops[1]["killed"] is True
