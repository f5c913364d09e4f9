"""The HA tests' own checks (tests/ha/workload.py) on a made-up history, so that a check
that could never fail would show here: every kind of violation is planted once, next to
the cases that are not violations (an at-least-once retry after an unanswered COMMIT).
Needs only the shared server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tenure import outbox

from .apps import TOPIC
from .faults import TIMELINE_SHIFT, is_loss
from .workload import Workload

J = "ha-0"


def _slot(n: int) -> str:
    return f"2026-01-01T00:00:{n:02d}+00:00"


def _lines(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"t": 1000.0 + i, **row}) + "\n")


def _run(slot: int, token: int, *phases: str, pid: int = 1, left: float = 3.0) -> list[Any]:
    base = {"job": J, "slot": _slot(slot), "token": token, "pid": pid}
    return [{**base, "ph": ph, "left": left} for ph in phases]


def test_every_check_finds_what_it_names(dsn: str, schema: str, tmp_path: Path) -> None:
    load = Workload(dsn, schema, tmp_path)
    load.prepare()
    committed = [(1, 5), (3, 4), (4, 6), (4, 7), (5, 8), (5, 9), (7, 11)]
    with psycopg.connect(dsn) as conn, conn.transaction():
        for slot, token in committed:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.ha_evidence (job_key, slot, token, pid) VALUES (%s, %s, %s, 1)"
                ).format(sql.Identifier(schema)),
                (J, _slot(slot), token),
            )
            if (slot, token) != (7, 11):  # planted: a committed run without its message
                key = f"{J}@{_slot(slot)}@{token}"
                outbox.enqueue(conn, TOPIC, key, {}, schema=schema)
    runs = [
        *_run(1, 5, "begin", "commit", "ok"),
        *_run(2, 5, "begin", pid=2),  # token 5 told to a second execution
        *_run(3, 4, "begin", "commit", "ok"),  # committed after token 5: stale
        *_run(4, 6, "begin", "commit", "ok"),  # slot 4 committed twice, both answered
        *_run(4, 7, "begin", "commit", "ok"),
        *_run(5, 8, "begin", "commit", "failed"),  # COMMIT unanswered: retried, allowed
        *_run(5, 9, "begin", "commit", "ok"),
        *_run(6, 10, "begin", "commit", "ok", left=-1.0),  # late start; ack lost
        *_run(7, 11, "begin", "commit", "ok"),
    ]
    _lines(tmp_path / "sched-1.jsonl", runs)
    delivered = [f"{J}@{_slot(s)}@{t}" for s, t in committed if (s, t) != (3, 4)]
    delivered.append(f"{J}@{_slot(9)}@99")  # a delivery whose run never committed
    _lines(tmp_path / "relay-1.jsonl", [{"key": k, "id": 0, "attempt": 1} for k in delivered])

    report = load.check()
    found = "\n".join(report.violations)
    for expected in (
        f"token-reissued: {J} token 5",
        f"stale-write: {J} token 4 committed after 5",
        f"slot-twice: {J} slot {_slot(4)} has 2 committed runs",
        f"slot-twice: {J} slot {_slot(4)} acknowledged 2 times",
        f"late-start: {J} slot {_slot(6)} token 10",
        f"outbox-lost: {J}@{_slot(3)}@4 committed, never delivered",
        f"outbox-phantom: {J}@{_slot(9)}@99 delivered",
        f"outbox-mismatch: {J}@{_slot(7)}@11",
    ):
        assert expected in found, (expected, found)
    assert f"slot {_slot(5)}" not in found, found  # the retry is at least once, not a fault
    assert report.retried == [f"{J} slot {_slot(5)}: tokens [8, 9]"]
    assert report.lost_acks == [f"ack-lost: run {J}@{_slot(6)}@10 was acknowledged, then lost"]


def test_a_slot_committed_twice_is_a_loss_only_across_a_promotion() -> None:
    # Asynchronous replication lost the first run's finish: the new primary runs the slot
    # again on its own timeline. Two runs on one timeline are tenure's fault, never a loss.
    step = 1 << TIMELINE_SHIFT
    twice = "slot-twice: ha-0 slot 2026-12-04T19:17:34+00:00 has 2 committed runs"
    across = f"{twice} (tokens [3, {step + 1}])"
    within = f"{twice} (tokens [3, 4])"
    assert is_loss(across)
    assert not is_loss(within)
    assert not is_loss("token-reissued: ha-0 token 3 told to [1, 2]")


def test_a_late_end_retried_by_another_worker_is_at_least_once_by_the_same_one_a_fault(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    # Slot 20: acknowledged by pid 1, its end recorded as a lost lease (it arrived after
    # another claim took the job), run again by pid 2: at least once (docs/safety.md).
    # Slot 21: the same, but run again by pid 1 itself, which knows its run ended: a fault.
    load = Workload(dsn, schema, tmp_path)
    load.prepare()
    ident = sql.Identifier(schema)
    with psycopg.connect(dsn) as conn, conn.transaction():
        for slot, token, pid in ((20, 30, 1), (20, 31, 2), (21, 32, 1), (21, 33, 1)):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.ha_evidence (job_key, slot, token, pid) VALUES (%s, %s, %s, %s)"
                ).format(ident),
                (J, _slot(slot), token, pid),
            )
            key = f"{J}@{_slot(slot)}@{token}"
            outbox.enqueue(conn, TOPIC, key, {}, schema=schema)
        for slot, token in ((20, 30), (21, 32)):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.job_runs (job_key, slot, kind, token, worker_id, host, pid, "
                    "started_at, finished_at, outcome) VALUES (%s, %s, 'scheduled', %s, 'w', "
                    "'h', 1, now(), now(), 'lease_lost')"
                ).format(ident),
                (J, _slot(slot), token),
            )
    runs = [
        *_run(20, 30, "begin", "commit", "ok"),
        *_run(20, 31, "begin", "commit", "ok", pid=2),
        *_run(21, 32, "begin", "commit", "ok"),
        *_run(21, 33, "begin", "commit", "ok"),
    ]
    _lines(tmp_path / "sched-1.jsonl", runs)
    delivered = [f"{J}@{_slot(s)}@{t}" for s, t in ((20, 30), (20, 31), (21, 32), (21, 33))]
    _lines(tmp_path / "relay-1.jsonl", [{"key": k, "id": 0, "attempt": 1} for k in delivered])
    report = load.check()
    found = "\n".join(report.violations)
    assert f"slot {_slot(20)}" not in found, found
    assert report.retried == [
        f"{J} slot {_slot(20)}: tokens [30, 31] (the earlier end arrived late)"
    ]
    assert f"slot-twice: {J} slot {_slot(21)} has 2 committed runs" in found, found
    assert f"slot-twice: {J} slot {_slot(21)} acknowledged 2 times" in found, found
