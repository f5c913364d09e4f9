"""The history checker: the invariants of shared/docs/invariants.md, on what a run left.

Inputs: the workers' op logs (paired begin/end lines) and a snapshot of the run's tables
(:func:`tests.chaos.tables.snapshot`). Every check is sound under unknown outcomes: an
operation whose outcome is unknown may or may not have happened, so it never makes a
violation by itself, and it never helps hide one.

Checks (violation kind in brackets):

* Tokens (invariant 1): the committed takeovers of a key (``chaos_takeovers``, in commit
  order) carry tokens 1, 2, 3, ... with no repeat and no gap [``token-reissued``,
  ``token-order``, ``token-gap``]; the final ``job_leases`` token is the last of them
  [``token-final``]; a takeover a worker was told about is among them [``acquire-lost``];
  no two acknowledged acquires got the same token [``token-reissued``].
* One live holder (invariant 2), on the acknowledged grants as in
  ``tests/test_processes.py::_check_history``: the next token's takeover (database clock)
  is strictly after every expiry its predecessor was granted by acquire and renew, or after
  its release [``two-holders``]; renewals by the token's owner only [``renew-owner``].
* No stale commit (invariant 3): per key, in commit order, the ledger's and the result
  history's tokens never go down [``ledger-regressed``, ``result-regressed``]; the stored
  result comes from the highest token that wrote [``result-final``]; strict fencing: no
  ledger row of token T committed after a takeover with a higher token committed
  (commit timestamps; only when ``track_commit_timestamp`` is on) [``ledger-after-takeover``].
* Nothing lost, zero rows is failure (invariants 4, 6): every acknowledged write is in its
  table [``write-lost``]; no write reported as refused or failed is there
  [``failed-write-committed``]; every row in the tables was written by some operation
  [``unexplained-row``].
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOT_APPLIED = ("stale", "error", "busy", "none", "lost", "skipped")


@dataclass(frozen=True)
class Violation:
    kind: str
    key: str
    detail: str


@dataclass(frozen=True)
class Report:
    ops: dict[str, dict[str, int]]
    violations: list[Violation]
    checked: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.violations))


def read_ops(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Pair begin/end lines; a begin without an end (killed mid-operation) is ``unknown``."""
    begun: dict[tuple[int, int, int], dict[str, Any]] = {}
    ended: dict[tuple[int, int, int], dict[str, Any]] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except ValueError:  # a line torn by SIGKILL
                    continue
                ident = (line["w"], line["inc"], line["n"])
                (begun if line["ph"] == "b" else ended)[ident] = line
    ops: list[dict[str, Any]] = []
    for ident, start in begun.items():
        op = ended.get(ident)
        ops.append(op if op is not None else {**start, "outcome": "unknown", "killed": True})
    ops.sort(key=lambda o: (o["t"], o["w"], o["n"]))
    return ops


def _ts(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


def check(ops: list[dict[str, Any]], snap: dict[str, list[dict[str, Any]]]) -> Report:
    violations: list[Violation] = []
    notes: list[str] = []
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for op in ops:
        counts[op["op"]][op["outcome"]] += 1

    violations += _check_takeovers(ops, snap)
    violations += _check_holders(ops)
    violations += _check_table(ops, snap["ledger"], "ledger")
    violations += _check_table(ops, snap["results_history"], "result")
    violations += _check_final_result(ops, snap)
    strict, note = _check_strict(snap)
    violations += strict
    if note:
        notes.append(note)
    checked = {
        "takeovers": len(snap["takeovers"]),
        "ledger_rows": len(snap["ledger"]),
        "result_versions": len(snap["results_history"]),
        "keys": len(snap["leases"]),
    }
    return Report(
        ops={op: dict(c) for op, c in sorted(counts.items())},
        violations=violations,
        checked=checked,
        notes=notes,
    )


def _check_takeovers(
    ops: list[dict[str, Any]], snap: dict[str, list[dict[str, Any]]]
) -> list[Violation]:
    out: list[Violation] = []
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in snap["takeovers"]:
        by_key[row["job_key"]].append(row)
    final = {row["job_key"]: row["token"] for row in snap["leases"]}
    for key, rows in by_key.items():
        tokens = [r["token"] for r in rows]
        for token, n in Counter(tokens).items():
            if n > 1:
                out.append(Violation("token-reissued", key, f"token {token} committed {n} times"))
        for a, b in itertools.pairwise(rows):
            if b["token"] <= a["token"]:
                out.append(
                    Violation(
                        "token-order",
                        key,
                        f"takeover with token {b['token']} committed after token {a['token']}",
                    )
                )
        missing = sorted(set(range(1, max(tokens) + 1)) - set(tokens))
        if missing:
            out.append(Violation("token-gap", key, f"tokens never committed: {missing[:10]}"))
        if final.get(key) != tokens[-1]:
            out.append(
                Violation(
                    "token-final",
                    key,
                    f"job_leases has {final.get(key)}, last takeover {tokens[-1]}",
                )
            )
    seen: dict[tuple[str, int], str] = {}
    committed = {(r["job_key"], r["token"], r["owner"]) for r in snap["takeovers"]}
    for op in ops:
        if op["op"] != "acquire" or op["outcome"] != "ok":
            continue
        ident = (op["key"], op["token"])
        if ident in seen and seen[ident] != op["owner"]:
            out.append(
                Violation("token-reissued", op["key"], f"token {op['token']} acknowledged twice")
            )
        seen[ident] = op["owner"]
        if (op["key"], op["token"], op["owner"]) not in committed:
            out.append(
                Violation(
                    "acquire-lost",
                    op["key"],
                    f"acknowledged takeover token {op['token']} ({op['owner']}) is not committed",
                )
            )
    return out


def _check_holders(ops: list[dict[str, Any]]) -> list[Violation]:
    out: list[Violation] = []
    grants: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for op in ops:
        if op["op"] == "acquire" and op["outcome"] == "ok":
            grants[op["key"]].setdefault(
                op["token"],
                {"at": _ts(op["at"]), "until": _ts(op["until"]), "owner": op["owner"]},
            )
    for op in ops:
        if op["outcome"] != "ok" or op["op"] not in ("renew", "release"):
            continue
        entry = grants[op["key"]].get(op["token"])
        if entry is None:
            out.append(Violation("renew-owner", op["key"], f"{op['op']} of unknown token {op}"))
            continue
        if entry["owner"] != op["owner"]:
            out.append(
                Violation(
                    "renew-owner", op["key"], f"token {op['token']} {op['op']} by another owner"
                )
            )
        if op["op"] == "renew":
            entry["until"] = max(entry["until"], _ts(op["until"]))
    for op in ops:  # a release ends the lease then (after all of its renewals)
        if op["op"] == "release" and op["outcome"] == "ok":
            entry = grants[op["key"]].get(op["token"])
            if entry is not None:
                entry["until"] = min(entry["until"], _ts(op["at"]))
    for key, by_token in grants.items():
        for prev, nxt in itertools.pairwise(sorted(by_token)):
            a, b = by_token[prev], by_token[nxt]
            if not b["at"] > a["at"]:
                out.append(Violation("token-order", key, f"token {nxt} taken before token {prev}"))
            if not b["at"] > a["until"]:
                out.append(
                    Violation(
                        "two-holders",
                        key,
                        f"token {nxt} taken at {b['at']} while token {prev} was granted "
                        f"until {a['until']}",
                    )
                )
    return out


def _check_table(
    ops: list[dict[str, Any]], rows: list[dict[str, Any]], kind: str
) -> list[Violation]:
    """Commit-ordered rows of one table (ledger, or result history) against the ops."""
    out: list[Violation] = []
    highest: dict[str, dict[str, Any]] = {}
    for row in rows:  # id order is commit order per key (see tables.py)
        top = highest.get(row["job_key"])
        if top is not None and row["token"] < top["token"]:
            out.append(
                Violation(
                    f"{kind}-regressed",
                    row["job_key"],
                    f"{kind} write {row['wid']} with token {row['token']} committed after "
                    f"{top['wid']} with token {top['token']}",
                )
            )
        if top is None or row["token"] >= top["token"]:
            highest[row["job_key"]] = row
    present = {row["wid"] for row in rows}
    # Every write's id, also of writes killed before their end line (see worker.py).
    prefix = "r" if kind == "result" else "l"
    written = {f"{prefix}{o['w']}.{o['inc']}.{o['n']}" for o in ops if o["op"] == kind}
    for op in ops:
        if op["op"] != kind or "wid" not in op:
            continue
        if op["outcome"] == "ok" and op["wid"] not in present:
            out.append(
                Violation("write-lost", op["key"], f"acknowledged {kind} write {op['wid']} missing")
            )
        if op["outcome"] in NOT_APPLIED and op["wid"] in present:
            out.append(
                Violation(
                    "failed-write-committed",
                    op["key"],
                    f"{kind} write {op['wid']} reported {op['outcome']} but committed",
                )
            )
    for row in rows:
        if row["wid"] not in written:
            out.append(
                Violation("unexplained-row", row["job_key"], f"{kind} row {row['wid']} not logged")
            )
    return out


def _check_final_result(
    ops: list[dict[str, Any]], snap: dict[str, list[dict[str, Any]]]
) -> list[Violation]:
    out: list[Violation] = []
    best: dict[str, int] = {}
    for op in ops:
        if op["op"] == "result" and op["outcome"] == "ok":
            best[op["key"]] = max(best.get(op["key"], 0), op["token"])
    for row in snap["results"]:
        top = best.get(row["job_key"])
        if top is not None and row["token"] < top:
            out.append(
                Violation(
                    "result-final",
                    row["job_key"],
                    f"stored result has token {row['token']}, an acknowledged write had {top}",
                )
            )
    return out


def _check_strict(snap: dict[str, list[dict[str, Any]]]) -> tuple[list[Violation], str | None]:
    rows = snap["ledger"]
    if not rows or rows[0].get("committed_at") is None:
        return [], "strict-fencing check skipped: track_commit_timestamp is off"
    takeovers: dict[str, list[tuple[dt.datetime, int]]] = defaultdict(list)
    for t in snap["takeovers"]:
        committed = _ts(t["committed_at"])
        assert committed is not None
        takeovers[t["job_key"]].append((committed, t["token"]))
    out: list[Violation] = []
    for row in rows:
        committed = _ts(row["committed_at"])
        assert committed is not None
        later = [
            tok for at, tok in takeovers[row["job_key"]] if tok > row["token"] and at < committed
        ]
        if later:
            out.append(
                Violation(
                    "ledger-after-takeover",
                    row["job_key"],
                    f"ledger write {row['wid']} with token {row['token']} committed at "
                    f"{committed} after the takeover of token {min(later)}",
                )
            )
    return out, None
