"""What a run found, as text (the terminal), JSON (a pipeline) or one self-contained HTML
page (the history as a timeline per key)."""

from __future__ import annotations

import datetime as dt
import html
import json
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from .checker import INVARIANTS, CheckResult, Margins, Snapshot, Violation
from .config import SCHEDULER_EVERY, VerifyConfig
from .history import WRITES, Op, parse_ts, write_id


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms" if abs(seconds) < 10 else f"{seconds:.2f}s"


def _spread(values: tuple[float, float, float] | None) -> str:
    if values is None:
        return "no such event"
    return " / ".join(_ms(v) for v in values)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of one run. ``passed``: no violation was found (``partial``: the run was
    interrupted before its duration; the verdict covers what ran)."""

    where: str
    through: str | None
    schema: str
    schema_kept: bool
    seed: int
    duration: float
    elapsed: float
    partial: bool
    workload: dict[str, Any]
    ops: dict[str, dict[str, int]]
    operations: int
    takeovers: int
    renewals: int
    stale_refused: dict[str, int]
    late_writes: int
    unknown_resolved: dict[str, int]
    faults: dict[str, int]
    backends_terminated: int
    faults_failed: dict[str, int]
    faults_skipped: dict[str, str]
    margins: Margins
    violations: tuple[Violation, ...]
    excerpt_of: Violation | None
    excerpt: tuple[str, ...]
    crashes: tuple[str, ...]
    worker_exits: dict[str, int]
    notes: tuple[str, ...]
    logs: str | None
    timeline: dict[str, Any]

    @classmethod
    def build(
        cls,
        *,
        cfg: VerifyConfig,
        where: str,
        through: str | None,
        schema: str,
        seed: int,
        elapsed: float,
        interrupted: bool,
        check: CheckResult,
        ops: list[Op],
        faults_log: list[dict[str, Any]],
        faults: dict[str, int],
        faults_failed: dict[str, int],
        faults_skipped: dict[str, str],
        shortest: tuple[Violation, list[str]] | None,
        snapshot: Snapshot,
        crashes: list[str],
        worker_exits: dict[str, int],
        notes: list[str],
        logs: str | None,
    ) -> VerifyResult:
        schedulers = cfg.workers // SCHEDULER_EVERY
        stale = Counter(o["op"] for o in ops if o["op"] in WRITES and o["outcome"] == "stale")
        return cls(
            where=where,
            through=through,
            schema=schema,
            schema_kept=cfg.keep,
            seed=seed,
            duration=cfg.duration,
            elapsed=elapsed,
            partial=interrupted,
            workload={
                "workers": cfg.workers,
                "lease_workers": cfg.workers - schedulers,
                "scheduler_workers": schedulers,
                "keys": cfg.keys,
                "ttl": cfg.ttl,
                "faults": list(cfg.faults),
                "fenced": cfg.fenced,
            },
            ops=check.ops,
            operations=sum(sum(c.values()) for c in check.ops.values()),
            takeovers=check.checked["takeovers"],
            renewals=check.checked["renewals"],
            stale_refused=dict(stale),
            late_writes=sum(1 for o in ops if o["op"] in WRITES and o.get("late")),
            unknown_resolved=check.unknown_resolved,
            faults=faults,
            backends_terminated=sum(int(f.get("backends", 0)) for f in faults_log),
            faults_failed=faults_failed,
            faults_skipped=faults_skipped,
            margins=check.margins,
            violations=check.violations,
            excerpt_of=shortest[0] if shortest else None,
            excerpt=tuple(shortest[1]) if shortest else (),
            crashes=tuple(crashes),
            worker_exits=worker_exits,
            notes=tuple(notes),
            logs=logs,
            timeline=_timeline(ops, faults_log, snapshot, check.violations),
        )

    @property
    def passed(self) -> bool:
        return not self.violations

    def verdict(self) -> str:
        """The one line a pipeline greps: ``verdict: PASS`` or ``verdict: FAIL ...``."""
        partial = (
            f" (partial: interrupted after {self.elapsed:.1f}s of {self.duration:g}s)"
            if self.partial
            else ""
        )
        if self.passed:
            return f"verdict: PASS{partial}"
        first = self.excerpt_of or self.violations[0]
        n = first.invariant
        return (
            f"verdict: FAIL{partial}: invariant {n} ({INVARIANTS[n]}) violated "
            f"[{first.kind}] {first.key}: {first.detail}"
        )

    # -- text -----------------------------------------------------------------------------

    def text(self) -> str:
        w = self.workload
        via = f", workers through {self.through}" if self.through else ""
        kept = "kept (--keep)" if self.schema_kept else "dropped"
        faults = ",".join(w["faults"]) or "none"
        lines = [
            f"tenure verify on {self.where}{via}; schema {self.schema} ({kept})",
            f"workload: {w['lease_workers']} library-lease workers + {w['scheduler_workers']} "
            f"scheduler workers on {w['keys']} keys each, ttl {w['ttl']:g}s, "
            f"{self.elapsed:.1f}s, faults {faults}, "
            f"{'fenced' if w['fenced'] else 'UNSAFE: NO FENCE'}; seed {self.seed}",
            f"operations: {self.operations}",
        ]
        for op, outcomes in self.ops.items():
            lines.append(f"  {op:8} {_counts(outcomes)}")
        refused = sum(self.stale_refused.values())
        lines.append(
            f"takeovers: {self.takeovers} (database record), renewals: {self.renewals}; "
            f"stale writes refused: {refused} ({_counts(self.stale_refused)}); "
            f"writes after the writer's local deadline: {self.late_writes}"
        )
        unknown = sum(self.unknown_resolved.values())
        lines.append(
            f"unknown outcomes resolved: {unknown}"
            + (f" ({_counts(self.unknown_resolved)})" if unknown else "")
        )
        terminated = (
            f" ({self.backends_terminated} backends terminated)"
            if "terminate" in self.faults
            else ""
        )
        lines.append(f"faults injected: {_counts(self.faults)}{terminated}")
        for name, why in sorted(self.faults_skipped.items()):
            lines.append(f"fault skipped: {name}: {why}")
        if self.faults_failed:
            lines.append(f"faults that failed to inject: {_counts(self.faults_failed)}")
        lines.append("timing margins (min / median / max):")
        lines.append(
            "  lease expiry -> successor's takeover (database clock): "
            + _spread(self.margins.takeover_after_expiry)
        )
        lines.append(
            "  holder's local deadline -> its lease's expiry (it stops this early): "
            + _spread(self.margins.deadline_before_expiry)
        )
        if self.crashes:
            lines.append(f"worker crashes: {len(self.crashes)}: {self.crashes[0]}")
        lines += [f"note: {n}" for n in self.notes]
        if self.logs:
            lines.append(f"logs: {self.logs}")
        if self.violations:
            by_kind = Counter(v.kind for v in self.violations)
            lines.append(f"violations: {len(self.violations)} ({_counts(dict(by_kind))})")
            if self.excerpt:
                lines.append("shortest history excerpt showing it (runner clock; db: database):")
                lines += [f"  {line}" for line in self.excerpt]
        lines.append(self.verdict())
        return "\n".join(lines)

    # -- JSON -----------------------------------------------------------------------------

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["timeline"]
        data["verdict"] = "PASS" if self.passed else "FAIL"
        data["verdict_line"] = self.verdict()
        data["violations"] = [
            {**asdict(v), "invariant": v.invariant, "invariant_name": INVARIANTS[v.invariant]}
            for v in self.violations
        ]
        data["violations_by_kind"] = dict(Counter(v.kind for v in self.violations))
        data["excerpt_of"] = asdict(self.excerpt_of) if self.excerpt_of else None
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_json(), indent=2, default=str)

    # -- HTML -----------------------------------------------------------------------------

    def to_html(self) -> str:
        return _html(self)


def _timeline(
    ops: list[Op],
    faults_log: list[dict[str, Any]],
    snap: Snapshot,
    violations: tuple[Violation, ...],
) -> dict[str, Any]:
    """Lease periods, writes and faults on the database clock (for the HTML page)."""
    worker_of: dict[tuple[str, int], int] = {
        (o["key"], o["token"]): o["w"]
        for o in ops
        if o["op"] in ("acquire", "claim") and o["outcome"] == "ok"
    }
    periods: dict[tuple[str, int], dict[str, Any]] = {}
    for row in snap["lease_history"]:
        ident = (row["job_key"], row["token"])
        if row["change"] == "takeover":
            periods[ident] = {
                "key": row["job_key"],
                "token": row["token"],
                "worker": worker_of.get(ident),
                "start": row["acquired_at"],
                "end": row["lease_until"],
            }
        elif ident in periods:
            periods[ident]["end"] = row["lease_until"]
    # Local (runner) times of refused writes, moved to the database clock by the median
    # offset seen on acknowledged acquires.
    offsets = sorted(
        (parse_ts(o["at"]) or dt.datetime.min).timestamp() - o["t"]
        for o in ops
        if o["op"] == "acquire" and o["outcome"] == "ok"
    )
    offset = offsets[len(offsets) // 2] if offsets else 0.0
    bad = {wid for v in violations for wid in v.wids}
    writes: list[dict[str, Any]] = []
    for row in snap["ledger"]:
        writes.append(
            {
                "key": row["job_key"],
                "token": row["token"],
                "at": row["at"],
                "wid": row["wid"],
                "outcome": "violation" if row["wid"] in bad else "ok",
                "what": "ledger",
            }
        )
    for o in ops:
        if o["op"] in WRITES and o["outcome"] == "stale":
            at = dt.datetime.fromtimestamp(o["t"] + offset, dt.UTC).isoformat()
            writes.append(
                {
                    "key": o["key"],
                    "token": o["token"],
                    "at": at,
                    "wid": write_id(o),
                    "outcome": "refused",
                    "what": o["op"],
                }
            )
    faults = [
        {
            "fault": f["fault"],
            "at": dt.datetime.fromtimestamp(f["t"] + offset, dt.UTC).isoformat(),
            "worker": f.get("worker"),
            "seconds": f.get("seconds"),
        }
        for f in faults_log
    ]
    return {"periods": list(periods.values()), "writes": writes, "faults": faults}


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.4em} .pass{color:#17752f} .fail{color:#b3261e}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}
svg text{font:11px monospace} .legend span{margin-right:1.5em}
table{border-collapse:collapse} td{padding:2px 10px;border-bottom:1px solid #eee}
"""
_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac"]


def _html(result: VerifyResult) -> str:
    e = html.escape
    cls = "pass" if result.passed else "fail"
    svg = _svg(result.timeline)
    excerpt = ""
    if result.excerpt:
        excerpt = "<h2>Shortest history excerpt showing the violation</h2><pre>{}</pre>".format(
            e("\n".join(result.excerpt))
        )
    rows = "".join(
        f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>"
        for k, v in (
            (
                "deployment",
                result.where + (f" (workers via {result.through})" if result.through else ""),
            ),
            ("operations", result.operations),
            ("takeovers", result.takeovers),
            ("stale writes refused", sum(result.stale_refused.values())),
            ("unknown outcomes resolved", _counts(result.unknown_resolved)),
            ("faults injected", _counts(result.faults)),
            (
                "faults skipped",
                "; ".join(f"{k}: {v}" for k, v in result.faults_skipped.items()) or "none",
            ),
            ("expiry -> takeover (db clock)", _spread(result.margins.takeover_after_expiry)),
            ("local deadline -> expiry", _spread(result.margins.deadline_before_expiry)),
        )
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tenure verify: {e(result.verdict())}</title>
<style>{_CSS}</style></head><body>
<h1 class="{cls}">{e(result.verdict())}</h1>
<table>{rows}</table>
<h2>Timeline (database clock)</h2>
<p class="legend"><span>bars: lease periods, labelled with their token, colour per worker
</span><span style="color:#17752f">&#9679; committed ledger row</span>
<span style="color:#b3261e">&#10005; stale write refused</span>
<span style="color:#b3261e">&#9650; violation</span><span>top lane: &#8214; pause (grey: how
long), &#10006; kill, &#8623; terminate</span></p>
{svg}
{excerpt}
<h2>Full report</h2><pre>{e(result.text())}</pre>
</body></html>
"""


def _svg(timeline: dict[str, Any]) -> str:
    periods = timeline["periods"]
    if not periods:
        return "<p>no lease was taken</p>"
    times = [parse_ts(p["start"]) for p in periods] + [parse_ts(p["end"]) for p in periods]
    t0 = min(t for t in times if t is not None).timestamp()
    t1 = max(t for t in times if t is not None).timestamp()
    span = max(t1 - t0, 1e-3)
    keys = sorted({p["key"] for p in periods})
    lane, left, width = 28, 70, max(900, int(span * 60))
    height = lane * (len(keys) + 1) + 30

    def x(value: str | None) -> float:
        ts = parse_ts(value)
        return left + ((ts.timestamp() if ts else t0) - t0) / span * width

    def y(key: str) -> int:
        return lane * (keys.index(key) + 1) + 10

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}">'
    ]
    parts.append(f'<text x="4" y="{lane // 2 + 8}">faults</text>')
    for key in keys:
        parts.append(f'<text x="4" y="{y(key) + 14}">{html.escape(key)}</text>')
    for p in periods:
        x0, x1 = x(p["start"]), x(p["end"])
        color = _COLORS[(p["worker"] or 0) % len(_COLORS)] if p["worker"] is not None else "#999"
        parts.append(
            f'<rect x="{x0:.1f}" y="{y(p["key"])}" width="{max(x1 - x0, 1):.1f}" height="18" '
            f'fill="{color}" opacity="0.55"><title>{html.escape(p["key"])} token '
            f"{p['token']} (w{p['worker']}): {p['start']} .. {p['end']}</title></rect>"
        )
        parts.append(f'<text x="{x0 + 2:.1f}" y="{y(p["key"]) + 13}">{p["token"]}</text>')
    for w in timeline["writes"]:
        if w["key"] not in keys:
            continue
        cx, cy = x(w["at"]), y(w["key"]) + 9
        label = html.escape(f"{w['what']} {w['wid']} token {w['token']}: {w['outcome']}")
        if w["outcome"] == "ok":
            parts.append(
                f'<circle cx="{cx:.1f}" cy="{cy}" r="2.5" fill="#17752f">'
                f"<title>{label}</title></circle>"
            )
        elif w["outcome"] == "refused":
            parts.append(
                f'<text x="{cx - 3:.1f}" y="{cy + 4}" fill="#b3261e">&#10005;'
                f"<title>{label}</title></text>"
            )
        else:
            parts.append(
                f'<text x="{cx - 4:.1f}" y="{cy + 5}" fill="#b3261e" '
                f'font-size="14">&#9650;<title>{label}</title></text>'
            )
    glyph = {"pause": "&#8214;", "kill": "&#10006;", "terminate": "&#8623;", "restart": "R"}
    for f in timeline["faults"]:
        label = html.escape(f"{f['fault']} w{f['worker']} {f['seconds'] or ''}")
        if f["fault"] == "pause" and f["seconds"]:
            length = float(f["seconds"]) / span * width
            parts.append(
                f'<rect x="{x(f["at"]):.1f}" y="{lane // 2 + 10}" width="{length:.1f}" '
                f'height="3" fill="#999"><title>{label}</title></rect>'
            )
        parts.append(
            f'<text x="{x(f["at"]):.1f}" y="{lane // 2 + 8}">'
            f"{glyph.get(f['fault'], '?')}<title>{label}</title></text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
