"""The checker of `tenure verify` on hand-made histories: each check must be able to fail,
and a clean history (also with unknown outcomes) must pass."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from tenure.verify import check
from tenure.verify.checker import Snapshot, shortest_excerpt
from tenure.verify.history import read_ops

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _t(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat()


def _op(n: int, op: str, outcome: str = "ok", w: int = 0, **fields: Any) -> dict[str, Any]:
    return {"w": w, "inc": 0, "n": n, "op": op, "outcome": outcome, "t0": n, "t": n, **fields}


def _lease(
    i: int, change: str, token: int, owner: str, until: float, at: float, **old: Any
) -> dict[str, Any]:
    return {
        "id": i,
        "job_key": "k",
        "change": change,
        "token": token,
        "owner": owner,
        "lease_until": _t(until),
        "acquired_at": _t(at),
        "renewed_at": _t(old.pop("renewed", at)),
        "old_token": old.get("old_token"),
        "old_owner": old.get("old_owner"),
        "old_until": _t(old["old_until"]) if "old_until" in old else None,
        "at": _t(at),
    }


def _history() -> tuple[list[dict[str, Any]], Snapshot]:
    """A clean history: token 1 (worker 0, owner a) writes, renews and releases; token 2
    (worker 1, owner b) takes over after the release and writes."""
    ops = [
        _op(1, "acquire", key="k", token=1, owner="a", at=_t(0), until=_t(1), deadline_in=0.9),
        _op(2, "ledger", key="k", token=1, owner="a"),
        _op(3, "result", key="k", token=1, owner="a"),
        _op(4, "renew", key="k", token=1, owner="a", until=_t(2)),
        _op(5, "release", key="k", token=1, owner="a", at=_t(1.5)),
        _op(1, "acquire", w=1, key="k", token=2, owner="b", at=_t(1.6), until=_t(3)),
        _op(2, "ledger", w=1, key="k", token=2, owner="b"),
        _op(3, "result", w=1, key="k", token=2, owner="b"),
    ]
    snap: Snapshot = {
        "lease_history": [
            _lease(1, "takeover", 1, "a", until=1, at=0),
            _lease(2, "renew", 1, "a", until=2, at=0, renewed=1, old_owner="a", old_until=1),
            _lease(3, "release", 1, "a", until=1.5, at=0, renewed=1, old_owner="a", old_until=2),
            _lease(4, "takeover", 2, "b", until=3, at=1.6, old_token=1, old_until=1.5),
        ],
        "ledger": [
            {"id": 1, "job_key": "k", "token": 1, "wid": "l0.0.2", "token_at_commit": 1},
            {"id": 2, "job_key": "k", "token": 2, "wid": "l1.0.2", "token_at_commit": 2},
        ],
        "results_history": [
            {"id": 1, "job_key": "k", "token": 1, "wid": "r0.0.3"},
            {"id": 2, "job_key": "k", "token": 2, "wid": "r1.0.3"},
        ],
        "results": [{"job_key": "k", "token": 2, "wid": "r1.0.3"}],
        "leases": [{"job_key": "k", "token": 2, "lease_until": _t(3)}],
    }
    return ops, snap


def _kinds(ops: list[dict[str, Any]], snap: Snapshot) -> set[str]:
    return {v.kind for v in check(ops, snap).violations}


def test_a_clean_history_passes_and_is_measured() -> None:
    ops, snap = _history()
    result = check(ops, snap)
    assert result.violations == ()
    assert result.checked["takeovers"] == 2 and result.checked["renewals"] == 1
    assert result.margins.deadline_before_expiry == pytest.approx((0.1, 0.1, 0.1))
    assert result.margins.takeover_after_expiry is None  # token 1 was released, not expired


def test_two_live_holders_by_what_holders_were_told() -> None:
    ops, snap = _history()
    ops[4] = {**ops[4], "outcome": "none"}  # no release: token 1 was granted until t=2
    assert _kinds(ops, snap) == {"two-holders"}


def test_two_live_holders_by_the_database_record() -> None:
    ops, snap = _history()
    snap["lease_history"][3] = {**snap["lease_history"][3], "old_until": _t(1.7)}
    assert "two-holders" in _kinds(ops, snap)


def test_a_renewal_that_revived_an_expired_lease() -> None:
    ops, snap = _history()
    # Renewed at t=1.2 although the lease it replaced had expired at t=1.
    snap["lease_history"][1] = {**snap["lease_history"][1], "renewed_at": _t(1.2)}
    assert _kinds(ops, snap) == {"renew-revived"}
    ops, snap = _history()
    snap["lease_history"][1] = {**snap["lease_history"][1], "old_owner": "z"}
    assert "renew-owner" in _kinds(ops, snap)


def test_reissued_out_of_order_and_skipped_tokens() -> None:
    ops, snap = _history()
    snap["lease_history"][3] = {**snap["lease_history"][3], "token": 1}
    assert {"token-reissued", "token-order", "token-final"} <= _kinds(ops, snap)
    ops, snap = _history()
    snap["lease_history"][3] = {**snap["lease_history"][3], "token": 3}
    snap["leases"] = [{"job_key": "k", "token": 3, "lease_until": _t(3)}]
    assert "token-gap" in _kinds(ops, snap)
    ops, snap = _history()  # a new timeline's floor is no gap
    floor = (1 << 40) + 1
    snap["lease_history"][3] = {**snap["lease_history"][3], "token": floor}
    snap["leases"] = [{"job_key": "k", "token": floor, "lease_until": _t(3)}]
    assert "token-gap" not in _kinds(ops, snap)


def test_an_acknowledged_takeover_that_never_committed() -> None:
    ops, snap = _history()
    del snap["lease_history"][3]
    snap["leases"] = [{"job_key": "k", "token": 1, "lease_until": _t(1.5)}]
    assert "acquire-lost" in _kinds(ops, snap)


def test_stale_commits() -> None:
    ops, snap = _history()
    snap["ledger"].reverse()  # token 1's row committed after token 2's
    snap["results_history"].reverse()
    snap["results"] = [{"job_key": "k", "token": 1, "wid": "r0.0.3"}]
    assert {"ledger-regressed", "result-regressed", "result-final"} <= _kinds(ops, snap)
    ops, snap = _history()
    # Strict fencing: token 1's transaction committed after token 2's takeover had, even
    # though no token-2 row came before it.
    snap["ledger"] = [{**snap["ledger"][0], "token_at_commit": 2}]
    ops = [o for o in ops if not (o["op"] == "ledger" and o["w"] == 1)]
    assert _kinds(ops, snap) == {"ledger-after-takeover"}


def test_lost_and_phantom_writes_and_unknown_outcomes() -> None:
    ops, snap = _history()
    del snap["ledger"][1]  # acknowledged, then missing: a zero-row write counted as success
    assert _kinds(ops, snap) == {"write-lost"}
    ops, snap = _history()
    ops[1] = {**ops[1], "outcome": "stale"}  # refused, yet committed
    assert _kinds(ops, snap) == {"failed-write-committed"}
    ops, snap = _history()
    ops[1] = {**ops[1], "outcome": "unknown"}  # unknown may be either: no violation
    result = check(ops, snap)
    assert result.violations == () and result.unknown_resolved == {"committed": 1}
    ops, snap = _history()
    del ops[1]  # a row no operation wrote
    assert "unexplained-row" in _kinds(ops, snap)


def test_the_excerpt_tells_the_story_of_a_stale_commit() -> None:
    ops, snap = _history()
    snap["ledger"].reverse()
    faults = [{"fault": "pause", "worker": 0, "seconds": 2.5, "t": 1.5}]
    result = check(ops, snap)
    found = shortest_excerpt(result.violations, ops, faults, snap)
    assert found is not None
    violation, lines = found
    assert violation.kind == "ledger-regressed"
    text = "\n".join(lines)
    assert "acquired k token 1" in text and "acquired k token 2" in text
    assert "paused w0" in text and "l0.0.2 with token 1" in text
    assert "renewed" not in text  # only what the story needs


def test_log_lines_are_paired_and_killed_operations_are_unknown(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl"
    lines = [
        {"w": 0, "inc": 0, "n": 1, "op": "ledger", "ph": "b", "key": "k", "token": 1, "t": 1},
        {"w": 0, "inc": 0, "n": 1, "op": "ledger", "ph": "e", "outcome": "ok", "t": 2},
        {"w": 0, "inc": 0, "n": 2, "op": "ledger", "ph": "b", "key": "k", "token": 1, "t": 3},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"w": 0, "inc')
    ops = read_ops([path, tmp_path / "never-written.jsonl"])
    assert [(o["n"], o["outcome"]) for o in ops] == [(1, "ok"), (2, "unknown")]
    assert ops[1]["killed"] is True
