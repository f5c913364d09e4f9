"""The checker: the invariants of docs/invariants.md, on the history a run left.

Inputs: the workers' operations (:func:`tenure.verify.history.read_ops`) and a snapshot of
the run's tables (:func:`tenure.verify.tables.snapshot`). Every check is sound under unknown
outcomes: an operation that may or may not have happened never makes a violation by itself,
and never hides one.

Checks, by invariant (violation kinds in brackets):

1. Tokens only go up. The committed takeovers of a key (``verify_lease_history``, commit
   order) carry strictly increasing tokens, each the previous + 1 (or a new timeline's
   floor) [``token-reissued``, ``token-order``, ``token-gap``]; ``job_leases`` holds the
   last [``token-final``]; every takeover a worker was told about was committed
   [``acquire-lost``]; no token was acknowledged to two owners [``token-reissued``].
2. One live holder. By the database clock, each takeover happened strictly after the
   previous holder's committed expiry (the row version it replaced) [``two-holders``]; a
   renewal only by the holder [``renew-owner``] and never after the lease had expired
   [``renew-revived``]; and on the acknowledged library grants, each token was taken after
   every expiry its predecessor was told (acquire, renew) or its release [``two-holders``].
3. No stale commit. Per key, in commit order, the ledger's and the result history's tokens
   never go down [``ledger-regressed``, ``result-regressed``]; the stored result comes from
   the highest token that wrote [``result-final``]; strict fencing: no ledger transaction of
   token T committed after a takeover with a higher token had committed
   [``ledger-after-takeover``, read by a deferred trigger just before each commit].
4. Zero rows is failure: every write reported as success is in its table [``write-lost``].
5. Nothing half-done: no write reported as refused or failed is there
   [``failed-write-committed``]; every row was written by some logged operation
   [``unexplained-row``].
"""

from __future__ import annotations

import datetime as dt
import itertools
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .history import NOT_APPLIED, WRITES, Op, parse_ts, write_id

Snapshot = dict[str, list[dict[str, Any]]]

INVARIANTS = {
    1: "tokens only go up",
    2: "one live holder",
    3: "no stale commit",
    4: "zero rows is failure",
    5: "nothing half-done",
}
KIND_INVARIANT = {
    "token-reissued": 1,
    "token-order": 1,
    "token-gap": 1,
    "token-final": 1,
    "acquire-lost": 1,
    "two-holders": 2,
    "renew-owner": 2,
    "renew-revived": 2,
    "ledger-regressed": 3,
    "result-regressed": 3,
    "result-final": 3,
    "ledger-after-takeover": 3,
    "write-lost": 4,
    "failed-write-committed": 5,
    "unexplained-row": 5,
}
#: A renewal records renewed_at a moment after its expiry check, inside the same statement
#: and holding the row lock (no takeover can slip in): microseconds, or a few milliseconds
#: if the backend is descheduled right there. A renewal whose expiry check ran before it
#: waited for a lock (the bug invariant 2 names) is late by the whole wait. Later than this
#: after the expiry it replaced, a renewal is a revival.
REVIVAL_TOLERANCE = dt.timedelta(milliseconds=5)
#: Tokens of a new timeline start at (timeline - 1) * 2**40 + 1 (see queries.sql acquire).
TIMELINE_STEP = 1 << 40
GRANTS = ("acquire", "claim")


@dataclass(frozen=True)
class Violation:
    kind: str
    key: str
    detail: str
    tokens: tuple[int, ...] = ()
    wids: tuple[str, ...] = ()

    @property
    def invariant(self) -> int:
        return KIND_INVARIANT[self.kind]

    def describe(self) -> str:
        n = self.invariant
        return f"invariant {n} ({INVARIANTS[n]}) [{self.kind}] {self.key}: {self.detail}"


@dataclass(frozen=True)
class Margins:
    """Measured timing margins, in seconds (None when the run had no such event)."""

    #: Previous holder's expiry to the successor's takeover, database clock.
    takeover_after_expiry: tuple[float, float, float] | None
    #: A holder's local deadline to its lease's expiry on the database clock (at acquire).
    deadline_before_expiry: tuple[float, float, float] | None


@dataclass(frozen=True)
class CheckResult:
    violations: tuple[Violation, ...]
    ops: dict[str, dict[str, int]]
    checked: dict[str, int]
    unknown_resolved: dict[str, int]
    margins: Margins
    notes: tuple[str, ...] = field(default_factory=tuple)

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.violations))


def check(ops: list[Op], snap: Snapshot) -> CheckResult:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for op in ops:
        counts[op["op"]][op["outcome"]] += 1
    violations: list[Violation] = []
    violations += _check_takeovers(ops, snap)
    violations += _check_lease_history(snap)
    violations += _check_grants(ops)
    violations += _check_table(ops, snap["ledger"], "ledger")
    violations += _check_table(ops, snap["results_history"], "result")
    violations += _check_final_result(ops, snap)
    violations += _check_strict(snap)
    takeovers = [r for r in snap["lease_history"] if r["change"] == "takeover"]
    return CheckResult(
        violations=tuple(violations),
        ops={op: dict(c) for op, c in sorted(counts.items())},
        checked={
            "takeovers": len(takeovers),
            "renewals": sum(1 for r in snap["lease_history"] if r["change"] == "renew"),
            "ledger_rows": len(snap["ledger"]),
            "result_versions": len(snap["results_history"]),
            "keys": len(snap["leases"]),
        },
        unknown_resolved=_resolve_unknown(ops, snap),
        margins=_margins(ops, snap),
    )


def _takeovers_by_key(snap: Snapshot) -> dict[str, list[dict[str, Any]]]:
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in snap["lease_history"]:
        if row["change"] == "takeover":
            by_key[row["job_key"]].append(row)
    return by_key


def _check_takeovers(ops: list[Op], snap: Snapshot) -> list[Violation]:
    out: list[Violation] = []
    final = {row["job_key"]: row["token"] for row in snap["leases"]}
    by_key = _takeovers_by_key(snap)
    for key, rows in by_key.items():
        tokens = [r["token"] for r in rows]
        for token, n in Counter(tokens).items():
            if n > 1:
                out.append(
                    Violation("token-reissued", key, f"token {token} committed {n} times", (token,))
                )
        for a, b in itertools.pairwise(rows):
            if b["token"] <= a["token"]:
                out.append(
                    Violation(
                        "token-order",
                        key,
                        f"takeover with token {b['token']} committed after token {a['token']}",
                        (a["token"], b["token"]),
                    )
                )
            elif b["token"] != a["token"] + 1 and (b["token"] - 1) % TIMELINE_STEP != 0:
                out.append(
                    Violation(
                        "token-gap",
                        key,
                        f"token {b['token']} followed {a['token']}: tokens between were "
                        "issued without a committed takeover",
                        (a["token"], b["token"]),
                    )
                )
        if final.get(key) != tokens[-1]:
            out.append(
                Violation(
                    "token-final",
                    key,
                    f"job_leases has token {final.get(key)}, the last takeover {tokens[-1]}",
                    (tokens[-1],),
                )
            )
    committed = {(r["job_key"], r["token"], r["owner"]) for rows in by_key.values() for r in rows}
    seen: dict[tuple[str, int], str] = {}
    for op in ops:
        if op["op"] not in GRANTS or op["outcome"] != "ok":
            continue
        ident = (op["key"], op["token"])
        if ident in seen and seen[ident] != op["owner"]:
            out.append(
                Violation(
                    "token-reissued",
                    op["key"],
                    f"token {op['token']} acknowledged to two owners",
                    (op["token"],),
                )
            )
        seen[ident] = op["owner"]
        if (op["key"], op["token"], op["owner"]) not in committed:
            out.append(
                Violation(
                    "acquire-lost",
                    op["key"],
                    f"acknowledged takeover with token {op['token']} was never committed",
                    (op["token"],),
                )
            )
    return out


def _check_lease_history(snap: Snapshot) -> list[Violation]:
    """One live holder on the database's own record of every lease change."""
    out: list[Violation] = []
    for row in snap["lease_history"]:
        old_until = parse_ts(row["old_until"])
        if old_until is None:
            continue
        key = row["job_key"]
        if row["change"] == "takeover":
            taken = parse_ts(row["acquired_at"])
            assert taken is not None
            if taken <= old_until:
                out.append(
                    Violation(
                        "two-holders",
                        key,
                        f"token {row['token']} was taken over at {taken.isoformat()} while "
                        f"token {row['old_token']} was live until {old_until.isoformat()} "
                        "(database clock)",
                        (row["old_token"], row["token"]),
                    )
                )
        elif row["change"] == "renew":
            renewed = parse_ts(row["renewed_at"])
            if row["owner"] != row["old_owner"]:
                out.append(
                    Violation(
                        "renew-owner",
                        key,
                        f"token {row['token']} renewed by another owner",
                        (row["token"],),
                    )
                )
            if renewed is not None and renewed > old_until + REVIVAL_TOLERANCE:
                out.append(
                    Violation(
                        "renew-revived",
                        key,
                        f"token {row['token']} renewed at {renewed.isoformat()} after it had "
                        f"expired at {old_until.isoformat()} (database clock)",
                        (row["token"],),
                    )
                )
    return out


def _check_grants(ops: list[Op]) -> list[Violation]:
    """One live holder on what library holders were told (acquire, renew, release).

    Scheduler claims are left to the database's record: the scheduler renews and releases
    its leases itself, so a job's log does not know when its lease ended."""
    out: list[Violation] = []
    grants: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for op in ops:
        if op["op"] == "acquire" and op["outcome"] == "ok":
            grants[op["key"]].setdefault(
                op["token"],
                {"at": parse_ts(op["at"]), "until": parse_ts(op["until"]), "owner": op["owner"]},
            )
    for op in ops:
        if op["outcome"] != "ok" or op["op"] not in ("renew", "release"):
            continue
        entry = grants[op["key"]].get(op["token"])
        if entry is None:
            continue  # its acquire's outcome was unknown (killed before the end line)
        if entry["owner"] != op["owner"]:
            out.append(
                Violation(
                    "renew-owner",
                    op["key"],
                    f"token {op['token']} {op['op']} by another owner",
                    (op["token"],),
                )
            )
        if op["op"] == "renew":
            entry["until"] = max(entry["until"], parse_ts(op["until"]))
    for op in ops:  # a release ends the lease then (after all of its renewals)
        if op["op"] == "release" and op["outcome"] == "ok":
            entry = grants[op["key"]].get(op["token"])
            if entry is not None:
                entry["until"] = min(entry["until"], parse_ts(op["at"]))
    for key, by_token in grants.items():
        for prev, nxt in itertools.pairwise(sorted(by_token)):
            a, b = by_token[prev], by_token[nxt]
            if not b["at"] > a["until"]:
                out.append(
                    Violation(
                        "two-holders",
                        key,
                        f"token {nxt} was taken at {b['at'].isoformat()} while token {prev} "
                        f"had been granted until {a['until'].isoformat()}",
                        (prev, nxt),
                    )
                )
    return out


def _check_table(ops: list[Op], rows: list[dict[str, Any]], kind: str) -> list[Violation]:
    """Commit-ordered rows of one table (ledger, or result history) against the ops."""
    out: list[Violation] = []
    highest: dict[str, dict[str, Any]] = {}
    for row in rows:  # id order is commit order per key (see verify.sql)
        top = highest.get(row["job_key"])
        if top is not None and row["token"] < top["token"]:
            out.append(
                Violation(
                    f"{kind}-regressed",
                    row["job_key"],
                    f"{kind} write {row['wid']} with token {row['token']} committed after "
                    f"{top['wid']} with token {top['token']}",
                    (row["token"], top["token"]),
                    (row["wid"], top["wid"]),
                )
            )
        if top is None or row["token"] >= top["token"]:
            highest[row["job_key"]] = row
    present = {row["wid"] for row in rows}
    # Every write's id, also of writes killed before their end line.
    written = {write_id(o) for o in ops if o["op"] == kind}
    for op in ops:
        if op["op"] != kind:
            continue
        wid = write_id(op)
        if op["outcome"] == "ok" and wid not in present:
            out.append(
                Violation(
                    "write-lost",
                    op["key"],
                    f"{kind} write {wid} was reported written but is missing",
                    (op["token"],),
                    (wid,),
                )
            )
        if op["outcome"] in NOT_APPLIED and wid in present:
            out.append(
                Violation(
                    "failed-write-committed",
                    op["key"],
                    f"{kind} write {wid} was reported {op['outcome']} but committed",
                    (op["token"],),
                    (wid,),
                )
            )
    for row in rows:
        if row["wid"] not in written:
            out.append(
                Violation(
                    "unexplained-row",
                    row["job_key"],
                    f"{kind} row {row['wid']} was written by no logged operation",
                    (row["token"],),
                    (row["wid"],),
                )
            )
    return out


def _check_final_result(ops: list[Op], snap: Snapshot) -> list[Violation]:
    out: list[Violation] = []
    best: dict[str, tuple[int, str]] = {}
    for op in ops:
        if op["op"] == "result" and op["outcome"] == "ok":
            best[op["key"]] = max(best.get(op["key"], (0, "")), (op["token"], write_id(op)))
    for row in snap["results"]:
        top = best.get(row["job_key"])
        if top is not None and row["token"] < top[0]:
            out.append(
                Violation(
                    "result-final",
                    row["job_key"],
                    f"the stored result has token {row['token']}; a write with token {top[0]} "
                    "was accepted",
                    (row["token"], top[0]),
                    (row["wid"], top[1]),
                )
            )
    return out


def _check_strict(snap: Snapshot) -> list[Violation]:
    out: list[Violation] = []
    for row in snap["ledger"]:
        at_commit = row["token_at_commit"]
        if at_commit is not None and at_commit > row["token"]:
            out.append(
                Violation(
                    "ledger-after-takeover",
                    row["job_key"],
                    f"ledger write {row['wid']} with token {row['token']} committed after the "
                    f"takeover with token {at_commit} had committed",
                    (row["token"], at_commit),
                    (row["wid"],),
                )
            )
    return out


def _resolve_unknown(ops: list[Op], snap: Snapshot) -> dict[str, int]:
    """Writes whose outcome the worker never learned, settled by the tables."""
    present = {r["wid"] for r in snap["ledger"]} | {r["wid"] for r in snap["results_history"]}
    out: Counter[str] = Counter()
    for op in ops:
        if op["op"] in WRITES and op["outcome"] == "unknown":
            out["committed" if write_id(op) in present else "not committed"] += 1
    return dict(out)


def _spread(values: list[float]) -> tuple[float, float, float] | None:
    if not values:
        return None
    return (min(values), statistics.median(values), max(values))


def _margins(ops: list[Op], snap: Snapshot) -> Margins:
    gaps: list[float] = []
    released: set[tuple[str, int]] = {
        (r["job_key"], r["token"]) for r in snap["lease_history"] if r["change"] == "release"
    }
    for row in snap["lease_history"]:
        if row["change"] != "takeover" or row["old_until"] is None:
            continue
        if (row["job_key"], row["old_token"]) in released:
            continue  # ended by its holder, not by expiry
        taken, expired = parse_ts(row["acquired_at"]), parse_ts(row["old_until"])
        assert taken is not None and expired is not None
        gaps.append((taken - expired).total_seconds())
    # The database granted until - at; the holder's local deadline was deadline_in away when
    # the answer arrived: the difference is how much earlier the holder gives up.
    local: list[float] = []
    for op in ops:
        if op["op"] == "acquire" and op["outcome"] == "ok" and "deadline_in" in op:
            at, until = parse_ts(op["at"]), parse_ts(op["until"])
            assert at is not None and until is not None
            local.append((until - at).total_seconds() - op["deadline_in"])
    return Margins(takeover_after_expiry=_spread(gaps), deadline_before_expiry=_spread(local))


# -- the shortest history that shows a violation ----------------------------------------------


def excerpt(
    violation: Violation, ops: list[Op], faults: list[dict[str, Any]], snap: Snapshot
) -> list[str]:
    """The fewest events that tell the violation's story: the grants of the tokens involved,
    the writes involved, the faults that hit their holders in between, and the database's
    record of those takeovers. Operation and fault times are the runner's clock; ``db``
    times are the database clock."""
    tokens = set(violation.tokens)
    key = violation.key
    holders: dict[int, int] = {}  # token -> worker
    events: list[tuple[float, str]] = []
    for op in ops:
        if op.get("key") != key or op.get("token") not in tokens:
            continue
        mine = op["op"] in GRANTS and op["outcome"] == "ok"
        if violation.wids:
            mine = mine or (op["op"] in WRITES and write_id(op) in violation.wids)
        elif violation.invariant == 2:
            mine = mine or (op["op"] in ("renew", "release") and op["outcome"] == "ok")
        if not mine:
            continue
        if op["op"] in GRANTS:
            holders[op["token"]] = op["w"]
        events.append((op["t0"], _describe_op(op)))
    if events:
        start, end = min(t for t, _ in events), max(t for t, _ in events)
        for fault in faults:
            if (
                fault.get("worker") in holders.values()
                and start <= fault["t"] <= end
                and fault["fault"] in ("pause", "kill")
            ):
                events.append((fault["t"], _describe_fault(fault)))
    for row in snap["lease_history"]:
        if row["job_key"] == key and row["change"] == "takeover" and row["token"] in tokens:
            taken = parse_ts(row["acquired_at"])
            assert taken is not None
            events.append(
                (
                    taken.timestamp(),
                    f"db: takeover of {key} committed with token {row['token']} at "
                    f"{_clock(taken)}, replacing token {row['old_token']} live until "
                    f"{_clock(parse_ts(row['old_until']))}",
                )
            )
    events.sort(key=lambda e: e[0])
    return [f"{_clock(dt.datetime.fromtimestamp(t, dt.UTC))}  {text}" for t, text in events]


def shortest_excerpt(
    violations: tuple[Violation, ...],
    ops: list[Op],
    faults: list[dict[str, Any]],
    snap: Snapshot,
) -> tuple[Violation, list[str]] | None:
    best: tuple[Violation, list[str]] | None = None
    for violation in violations[:50]:
        lines = excerpt(violation, ops, faults, snap)
        if lines and (best is None or len(lines) < len(best[1])):
            best = (violation, lines)
    if best is None and violations:
        return violations[0], []
    return best


def _clock(value: dt.datetime | None) -> str:
    return value.strftime("%H:%M:%S.%f")[:-3] if value is not None else "-"


def _describe_op(op: Op) -> str:
    who = f"w{op['w']}.{op['inc']}"
    kind, outcome = op["op"], op["outcome"]
    if kind in GRANTS:
        how = "acquired" if kind == "acquire" else "claimed (scheduler)"
        return (
            f"{who} {how} {op['key']} token {op['token']}, live until "
            f"{_clock(parse_ts(op.get('until')))} db"
        )
    if kind in WRITES:
        late = " after its local deadline" if op.get("late") else ""
        where = "ledger row" if kind == "ledger" else "result"
        return f"{who} wrote {where} {write_id(op)} with token {op['token']}{late}: {outcome}"
    if kind == "renew":
        return f"{who} renewed token {op['token']} until {_clock(parse_ts(op.get('until')))} db"
    return f"{who} released token {op['token']} at {_clock(parse_ts(op.get('at')))} db"


def _describe_fault(fault: dict[str, Any]) -> str:
    if fault["fault"] == "pause":
        return f"nemesis paused w{fault['worker']} (SIGSTOP) for {fault['seconds']}s"
    return f"nemesis killed w{fault['worker']} (SIGKILL)"
