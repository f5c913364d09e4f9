"""The lease timeline of one job, drawn on the server as SVG: one bar per run along time,
labelled with its token and worker, coloured by outcome and also marked by a glyph and a
pattern (colour is never the only carrier); takeovers, lost leases and refused (stale-token)
writes marked where they happened; each run's slot drawn so that lateness shows.

A run that was overtaken (its lease expired and a successor took the slot with a higher
token) is drawn solid up to the takeover and hatched after it: from then on it ran without
its lease, and whatever it tried to write with its token was refused.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape as _html_escape
from typing import Any

from ..errors import printable
from .data import Bucket, Run

WIDTH = 1000
LEFT = 10
RIGHT = 10
LANE = 34
TOP = 26
AXIS = 40
MAX_LANES = 6
STRIP = 34  # height of a dense window's density strip
TICK_ADVANCE = 7.5  # px per character of an axis label (11px text), generously
LATE = 0.5  # seconds after its slot from which a run's start is drawn as late

GLYPH = {
    "succeeded": "✓",
    "failed": "✗",
    "lease_lost": "⚠",
    "stale_rejected": "⊘",
    "running": "▶",
    "cancelled": "○",
    "abandoned": "◇",
    "misfire_skipped": "◇",
    "lease": "■",
}
LABEL = {
    "succeeded": "succeeded",
    "failed": "failed",
    "lease_lost": "lease lost",
    "stale_rejected": "write refused (stale token)",
    "running": "running",
    "cancelled": "cancelled (handed over at shutdown, or by an operator)",
    "abandoned": "abandoned",
    "misfire_skipped": "skipped (misfire)",
    "lease": "lease (no run history: a library lease)",
}


def escape(text: str) -> str:
    """``text`` for the SVG: control and bidirectional characters escaped as everywhere else
    (:func:`~tenure.errors.printable`), then HTML-escaped."""
    return _html_escape(printable(text))


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str  # takeover | refused | lost
    at: dt.datetime
    text: str


@dataclass(frozen=True, slots=True)
class Timeline:
    svg: str
    markers: tuple[Marker, ...]
    runs: int


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _utc(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _tick_step(span: float) -> float:
    for step in (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400):
        if span / step <= 8:
            return float(step)
    return 28 * 86400.0


def _tick_label(t: dt.datetime, step: float) -> str:
    t = t.astimezone(dt.UTC)
    if step >= 86400:
        return t.strftime("%b %d")
    if step >= 60:
        return t.strftime("%H:%M")
    return t.strftime("%H:%M:%S")


def markers_of(runs: Sequence[Run]) -> list[Marker]:
    """Takeovers (a run started with a higher token while a lower one had not ended cleanly),
    refused writes and lost leases, in time order."""
    out: list[Marker] = []
    started = [r for r in runs if r.started_at is not None]
    tokens = sorted({r.token for r in started})  # for "the next token", by bisection
    # Per slot, the newest earlier run that did not end cleanly: a later run of the same
    # slot with a higher token took it over. One pass (a timeline can hold 1,500 runs).
    # A `tenure exec` run's slot is its own start (exec_runs has no slot of the schedule's):
    # its runs are one group, so the next exec run after one that lost its lease or never
    # ended (its process died) is the takeover, as for a coded run's retry.
    unclean: dict[dt.datetime | None, Run] = {}
    # A bare lease's runs (its lease events, or its lease row): each takes over from the one
    # before it; the first from the token below its own, when it is not the first token.
    lease_before: int | None = None
    for run in started:
        assert run.started_at is not None
        if run.kind == "lease":
            before_token = lease_before if lease_before is not None else run.token - 1
            if 0 < before_token < run.token:
                out.append(
                    Marker(
                        "takeover",
                        run.started_at,
                        f"token {run.token} took over from token {before_token}",
                    )
                )
            lease_before = max(run.token, lease_before or 0)
        group = None if run.kind == "exec" else run.slot
        before = unclean.get(group)
        if run.kind != "lease" and before is not None and before.token < run.token:
            out.append(
                Marker(
                    "takeover",
                    run.started_at,
                    f"takeover: token {before.token} ({before.worker}) → token {run.token} "
                    f"({run.worker})",
                )
            )
        if run.kind != "lease" and run.outcome in (
            "lease_lost",
            "stale_rejected",
            "running",
            "cancelled",
        ):
            unclean[group] = run
        else:
            unclean.pop(group, None)
        end = run.finished_at
        if end is None:
            continue
        if run.outcome == "stale_rejected":
            at = bisect.bisect_right(tokens, run.token)
            accepted = f"; token {tokens[at]} had taken over" if at < len(tokens) else ""
            out.append(
                Marker("refused", end, f"write refused: token {run.token} is stale{accepted}")
            )
        elif run.outcome == "lease_lost":
            out.append(Marker("lost", end, f"lease lost: token {run.token} ({run.worker})"))
    out.sort(key=lambda m: m.at)
    return out


def _start(run: Run) -> dt.datetime:
    return run.started_at or run.slot


def _successor_start(
    run: Run, by_start: Sequence[Run], starts: Sequence[dt.datetime]
) -> dt.datetime | None:
    """When the first run with a higher token started, at or after ``run`` (``by_start``:
    the started runs in start order, ``starts`` their starts). Usually the next run: a scan
    from ``run``'s start, not over every run (a dense window draws hundreds of refused ones)."""
    if run.started_at is None or run.outcome not in ("lease_lost", "stale_rejected"):
        return None
    for other in by_start[bisect.bisect_left(starts, run.started_at) :]:
        if other.token > run.token:
            return other.started_at
    return None


def render(
    runs: Sequence[Run],
    *,
    since: dt.datetime,
    now: dt.datetime,
    job_key: str,
    density: Sequence[Bucket] = (),
) -> Timeline:
    """The SVG. With ``density`` (a dense window), a strip at the top counts every run per
    time slice, and ``runs`` are only the notable ones."""
    span = max(1.0, (now - since).total_seconds())
    inner = WIDTH - LEFT - RIGHT

    def x(t: dt.datetime) -> float:
        offset = (t - since).total_seconds()
        return LEFT + max(0.0, min(1.0, offset / span)) * inner

    # Lanes: overlapping runs (a stalled holder and its successor) go on separate lanes.
    lanes: list[dt.datetime] = []
    placed: list[tuple[Run, int, dt.datetime, dt.datetime]] = []
    for run in sorted(runs, key=lambda r: (r.started_at or r.slot, r.run_id)):
        start = run.started_at or run.slot
        end = run.finished_at or (now if run.outcome == "running" else start)
        lane = next((i for i, free in enumerate(lanes) if free <= start), None)
        if lane is None:
            if len(lanes) < MAX_LANES:
                lanes.append(end)
                lane = len(lanes) - 1
            else:
                lane = min(range(len(lanes)), key=lambda i: lanes[i])
        lanes[lane] = max(lanes[lane], end)
        placed.append((run, lane, start, end))
    lane_count = max(1, len(lanes))
    strip = STRIP if density else 0
    height = TOP + strip + lane_count * LANE + AXIS
    markers = markers_of(runs)

    parts: list[str] = []
    takeovers = sum(1 for m in markers if m.kind == "takeover")
    refused = sum(1 for m in markers if m.kind == "refused")
    tokens = sorted({r.token for r in runs if r.started_at is not None})
    counted = sum(b.runs for b in density)
    summary = (
        (
            f"{counted} runs of {job_key} between {_utc(since)} and {_utc(now)}, "
            f"{len(runs)} of them notable"
            if density
            else f"{len(runs)} run(s) of {job_key} between {_utc(since)} and {_utc(now)}"
        )
        + (f"; tokens {tokens[0]} to {tokens[-1]}" if tokens else "")
        + f"; {takeovers} takeover(s); {refused} refused write(s)"
    )
    parts.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 {WIDTH} '
        f'{height}" role="img" aria-labelledby="tl-title tl-desc" '
        f'data-since="{_iso(since)}" data-now="{_iso(now)}">'
        f'<title id="tl-title">Lease timeline of {escape(job_key)}</title>'
        f'<desc id="tl-desc">{escape(summary)}</desc>'
        "<defs>"
        '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" class="hatch-bg"/>'
        '<line x1="0" y1="0" x2="0" y2="6" class="hatch-line"/></pattern>'
        "</defs>"
    )
    # Axis ticks (UTC labels; the page script relabels them in the browser's time zone).
    step = _tick_step(span)
    first = since.timestamp() - since.timestamp() % step + step
    t = first
    while t < now.timestamp():
        at = dt.datetime.fromtimestamp(t, dt.UTC)
        px = x(at)
        label = _tick_label(at, step)
        # Centred on its line, unless that would cut it at the frame's edge (the page script
        # relabels it in the browser's zone: same length, HH:MM:SS or "Mon DD").
        half = TICK_ADVANCE * len(label) / 2
        anchor = "end" if px + half > WIDTH else ("start" if px - half < 0 else "middle")
        parts.append(
            f'<line class="grid" x1="{px:.1f}" y1="{TOP - 6}" x2="{px:.1f}" '
            f'y2="{height - AXIS + 4}"/>'
            f'<text class="tick" x="{px:.1f}" y="{height - 8}" text-anchor="{anchor}" '
            f'data-t="{_iso(at)}" data-step="{int(step)}">{label}</text>'
        )
        t += step
    parts.extend(_strip(density, x, TOP))
    by_start = sorted((r for r in runs if r.started_at is not None), key=_start)
    starts = [_start(r) for r in by_start]
    lane_free: dict[int, float] = {}  # where each lane's next outside label may start
    # Runs of a lane drawn without a label since its last labelled one: a busy cluster,
    # labelled as a whole with its range of tokens once the cluster ends.
    pending: dict[int, list[Run]] = {}
    cluster_x: dict[int, float] = {}  # where the lane's pending cluster starts

    def flush(lane: int, limit: float, y: float) -> None:
        cluster = pending.pop(lane, [])
        if not cluster:
            return
        lo, hi = min(r.token for r in cluster), max(r.token for r in cluster)
        text = f"#{lo}" if lo == hi else f"#{lo}–#{hi}"
        start = max(cluster_x[lane], lane_free.get(lane, 0.0))
        width = TICK_ADVANCE * len(text)
        if start + width > limit - 2:
            return  # no room: each bar's tooltip still names its token
        tip = escape(f"{len(cluster)} run(s), tokens {lo} to {hi}")
        parts.append(
            f'<g class="cluster"><title>{tip}</title><text class="label cluster" '
            f'x="{start:.1f}" y="{y + 16}">{text}</text></g>'
        )
        lane_free[lane] = start + width + 4

    next_x: dict[int, float] = {}  # where the next bar of the same lane starts
    following: dict[int, float] = {}
    for run, lane, start, _end in reversed(placed):
        if lane in following:
            next_x[id(run)] = following[lane]
        following[lane] = x(start)
    for run, lane, start, end in placed:
        y = TOP + strip + lane * LANE
        x0, x1 = x(start), x(end)
        w = max(3.0, x1 - x0)
        glyph = GLYPH.get(run.outcome, "?")
        what = LABEL.get(run.outcome, run.outcome)
        late = run.lateness
        tip = [
            f"token {run.token} · {what}",
            f"worker {run.worker} (host {run.host}, pid {run.pid})",
            f"slot {_utc(run.slot)} · {run.kind} attempt {run.attempt}",
        ]
        if run.started_at is not None:
            tip.append(f"started {_utc(run.started_at)}")
        if run.finished_at is not None:
            tip.append(f"ended {_utc(run.finished_at)}")
        if late is not None:
            tip.append(f"late by {late:.3f}s")
        if run.error:
            tip.append(run.error[:300])
        title = escape("\n".join(tip))
        cls = f"run o-{run.outcome}"
        attrs = (
            f'data-token="{run.token}" data-outcome="{escape(run.outcome)}" '
            f'data-worker="{escape(run.worker)}" tabindex="0"'
        )
        if run.started_at is None:
            # A slot skipped without running: a diamond at the slot.
            cx, cy = x(run.slot), y + 12
            parts.append(
                f'<g class="{cls}" {attrs}><title>{title}</title>'
                f'<path d="M{cx:.1f} {cy - 6} l6 6 l-6 6 l-6 -6 z"/></g>'
            )
            continue
        if w >= 70 or (
            x0 + w + 2 >= lane_free.get(lane, 0.0)
            and next_x.get(id(run), WIDTH) - (x0 + w) >= 8 * (len(str(run.token)) + 2)
        ):
            flush(lane, x0, y)  # this run gets a label: the cluster before it ends here
        handover = _successor_start(run, by_start, starts)
        parts.append(f'<g class="{cls}" {attrs}><title>{title}</title>')
        if handover is not None and start <= handover < end:
            xh = x(handover)
            parts.append(
                f'<rect class="bar" x="{x0:.1f}" y="{y}" width="{max(1.0, xh - x0):.1f}" '
                f'height="24" rx="3"/>'
                f'<rect class="bar overtaken" x="{xh:.1f}" y="{y}" '
                f'width="{max(2.0, x1 - xh):.1f}" height="24" rx="3" fill="url(#hatch)"/>'
            )
        else:
            parts.append(
                f'<rect class="bar" x="{x0:.1f}" y="{y}" width="{w:.1f}" height="24" rx="3"/>'
            )
        if late is not None and late > LATE:
            # The slot it was due at, joined to its start: lateness made visible.
            xs = x(run.slot)
            parts.append(
                f'<line class="late" x1="{xs:.1f}" y1="{y + 12}" x2="{x0:.1f}" y2="{y + 12}"/>'
                f'<circle class="slot" cx="{xs:.1f}" cy="{y + 12}" r="2.5"/>'
            )
        label = f"{glyph} #{run.token} {run.worker}"
        if w >= 70:
            parts.append(
                f'<text class="label" x="{x0 + 4:.1f}" y="{y + 16}">{escape(label[: int(w / 7)])}'
                "</text>"
            )
        elif x0 + w + 2 >= lane_free.get(lane, 0.0) and next_x.get(id(run), WIDTH) - (
            x0 + w
        ) >= 8 * (len(str(run.token)) + 2):
            # Beside a narrow bar, unless it would run into the previous such label (the
            # bar's own tooltip still says everything).
            outside = f"{glyph}{run.token}"
            parts.append(
                f'<text class="label outside" x="{x0 + w + 2:.1f}" y="{y + 16}">{outside}</text>'
            )
            lane_free[lane] = x0 + w + 10 + 8 * len(outside)
        else:
            if lane not in pending:
                cluster_x[lane] = x0
            pending.setdefault(lane, []).append(run)
        parts.append("</g>")
    for lane in list(pending):
        flush(lane, WIDTH, TOP + strip + lane * LANE)
    label_free: dict[str, float] = {}
    next_marker: dict[int, float] = {}  # where the next marker of the same kind is
    after: dict[str, float] = {}
    for m in reversed(markers):
        if m.kind in after:
            next_marker[id(m)] = after[m.kind]
        after[m.kind] = x(m.at)
    for m in markers:
        px = x(m.at)
        text = escape(m.text)
        # Crowded markers keep their glyph and tooltip; only every ~90 px gets its word.
        word = px >= label_free.get(m.kind, 0.0) and next_marker.get(id(m), WIDTH) - px >= 70
        if word:
            label_free[m.kind] = px + 90
        if m.kind == "takeover":
            parts.append(
                f'<g class="marker takeover" tabindex="0"><title>{text}</title>'
                f'<line x1="{px:.1f}" y1="{TOP - 10}" x2="{px:.1f}" y2="{height - AXIS + 14}"/>'
                # Below the lanes, so it never covers a refused-write label at the top.
                + (
                    f'<text x="{px + 3:.1f}" y="{height - AXIS + 12}">takeover</text>'
                    if word
                    else ""
                )
                + "</g>"
            )
        elif m.kind == "refused":
            parts.append(
                f'<g class="marker refused" tabindex="0"><title>{text}</title>'
                f'<path d="M{px - 6:.1f} {TOP - 18} l12 12 m0 -12 l-12 12"/>'
                + (f'<text x="{px + 8:.1f}" y="{TOP - 9}">refused</text>' if word else "")
                + "</g>"
            )
        else:
            parts.append(
                f'<g class="marker lost" tabindex="0"><title>{text}</title>'
                f'<path d="M{px:.1f} {TOP - 18} l6 10 l-12 0 z"/></g>'
            )
    parts.append("</svg>")
    return Timeline("".join(parts), tuple(markers), len(runs))


def _strip(density: Sequence[Bucket], x: Any, top: int) -> list[str]:
    """A dense window's counts: one column per time slice, its height the number of runs
    (relative to the busiest slice), stacked by outcome class, the counts on hover."""
    if not density:
        return []
    most = max(b.runs for b in density) or 1
    out = ['<g class="density">']
    for b in density:
        x0 = x(b.start)
        w = max(1.0, x(b.end) - x0 - 0.5)
        total = max(3.0, (STRIP - 6) * b.runs / most)
        late = b.late is not None and b.late > LATE
        tip = escape(
            f"{_utc(b.start)} to {_utc(b.end)}: {b.runs} run(s): {b.ok} succeeded or running, "
            f"{b.failed} failed, {b.fenced} lost a lease or had a write refused, "
            f"{b.other} cancelled or skipped"
            + (f"; latest start {b.late:.3f}s after its slot" if b.late is not None else "")
        )
        out.append(
            f'<g class="slice late"><title>{tip}</title>' if late else f"<g><title>{tip}</title>"
        )
        if late:
            # Lateness stays visible when runs are only counted: a mark under the slice.
            out.append(
                f'<line class="late" x1="{x0:.1f}" y1="{top + STRIP - 2}" '
                f'x2="{x0 + w:.1f}" y2="{top + STRIP - 2}"/>'
            )
        y = top + STRIP - 6.0
        for cls, n in (
            ("d-ok", b.ok),
            ("d-failed", b.failed),
            ("d-fenced", b.fenced),
            ("d-other", b.other),
        ):
            if n <= 0:
                continue
            h = max(1.0, total * n / b.runs)
            y -= h
            out.append(
                f'<rect class="{cls}" x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}"/>'
            )
        out.append("</g>")
    out.append("</g>")
    return out
