"""Throughput and lateness charts, drawn on the server as SVG like the lease timeline: per
time slice of the shown window, how many runs started (as runs per minute) and how late the
scheduled ones started after their slots (median and 99th percentile). A job's page charts
its own runs, the overview every job's (issue 29). The numbers are ``job_runs``' (the
scheduler's history; `tenure exec` runs are not in it).

Colour is not the only carrier: the median is a solid line with round points, the 99th
percentile a dashed line with square points, and every slice has a tooltip in words.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .data import Rate, Throughput
from .timeline import escape

WIDTH = 1000
LEFT = 10
RIGHT = 10
PANEL = 90  # height of each chart's plot
TOP = 22  # room for a chart's heading line
AXIS = 22  # room for the time labels under a plot


@dataclass(frozen=True, slots=True)
class Charts:
    svg: str
    summary: str


def _utc(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def summary(chart: Throughput, what: str) -> str:
    """The whole window in words (the charts' description, and the line under them)."""
    total = chart.total
    rate = chart.per_minute(total.runs)
    text = (
        f"{total.runs} run(s) of {what} started between {_utc(chart.since)} and "
        f"{_utc(chart.until)} ({rate:.2f}/min)"
    )
    if total.p50 is None:
        return text + "; no scheduled run to measure lateness"
    return (
        f"{text}; lateness of scheduled runs p50 {_seconds(total.p50)}, p99 {_seconds(total.p99)}"
    )


def _tip(chart: Throughput, r: Rate) -> str:
    assert r.bin is not None
    end = min(chart.until, r.bin + chart.stride)
    rate = chart.per_minute(r.runs, chart.stride)
    late = (
        f"lateness p50 {_seconds(r.p50)}, p99 {_seconds(r.p99)}"
        if r.p50 is not None
        else "no scheduled run"
    )
    return f"{_utc(r.bin)} to {_utc(end)}: {r.runs} run(s), {rate:.2f}/min; {late}"


def render(chart: Throughput, *, what: str, ident: str = "tp") -> Charts:
    """Both charts in one SVG; ``what`` names the runs (a job key, or "every job"), ``ident``
    prefixes the element ids (unique on the page)."""
    span = max(1e-6, (chart.until - chart.since).total_seconds())
    inner = WIDTH - LEFT - RIGHT
    width = max(1.0, chart.stride.total_seconds() / span * inner)

    def x(t: dt.datetime) -> float:
        offset = (t - chart.since).total_seconds()
        return LEFT + max(0.0, min(1.0, offset / span)) * inner

    said = summary(chart, what)
    rates = [chart.per_minute(r.runs, chart.stride) for r in chart.slices]
    top_rate = max(rates, default=0.0)
    lates = [v for r in chart.slices for v in (r.p50, r.p99) if v is not None]
    top_late = max([0.0, *lates])
    height = 2 * (TOP + PANEL + AXIS)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-labelledby="{ident}-title {ident}-desc">'
        f'<title id="{ident}-title">Runs per minute and lateness of {escape(what)}</title>'
        f'<desc id="{ident}-desc">{escape(said)}</desc>'
    ]

    def frame(y0: int, heading: str) -> None:
        base = y0 + TOP + PANEL
        parts.append(f'<text class="heading" x="{LEFT}" y="{y0 + 15}">{escape(heading)}</text>')
        parts.append(
            f'<line class="grid" x1="{LEFT}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}"/>'
            f'<line class="grid" x1="{LEFT}" y1="{y0 + TOP}" x2="{WIDTH - RIGHT}" '
            f'y2="{y0 + TOP}"/>'
        )
        parts.append(
            f'<text class="tick" x="{LEFT}" y="{base + 15}">{escape(_utc(chart.since))}</text>'
            f'<text class="tick" x="{WIDTH - RIGHT}" y="{base + 15}" text-anchor="end">'
            f"{escape(_utc(chart.until))}</text>"
        )

    # Throughput: a bar per slice, its height the slice's runs per minute.
    frame(
        0, f"Runs per minute (slices of {chart.stride.total_seconds():g}s; top: {top_rate:.2f}/min)"
    )
    base = TOP + PANEL
    for r, rate in zip(chart.slices, rates, strict=True):
        assert r.bin is not None
        h = 0.0 if top_rate <= 0 else rate / top_rate * PANEL
        parts.append(
            f'<rect class="tp-bar" x="{x(r.bin):.1f}" y="{base - h:.1f}" '
            f'width="{max(1.0, width - 1):.1f}" height="{h:.1f}" data-runs="{r.runs}">'
            f"<title>{escape(_tip(chart, r))}</title></rect>"
        )

    # Lateness: the median and the 99th percentile per slice, as two lines of points.
    y0 = TOP + PANEL + AXIS
    frame(
        y0,
        "Lateness of scheduled runs after their slots: p50 (solid, round) and p99 (dashed, "
        f"square); top: {top_late:.3f}s",
    )
    base = y0 + TOP + PANEL
    for name in ("p50", "p99"):
        points = []
        for r in chart.slices:
            value = r.p50 if name == "p50" else r.p99
            if value is None or r.bin is None:
                continue
            cx = x(r.bin) + width / 2
            cy = base - (0.0 if top_late <= 0 else max(0.0, value) / top_late * PANEL)
            points.append((cx, cy, r))
        if len(points) > 1:
            line = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy, _ in points)
            parts.append(f'<polyline class="lat-{name}" points="{line}"/>')
        for cx, cy, r in points:
            tip = escape(_tip(chart, r))
            if name == "p50":
                parts.append(
                    f'<circle class="lat-{name}" cx="{cx:.1f}" cy="{cy:.1f}" r="3">'
                    f"<title>{tip}</title></circle>"
                )
            else:
                parts.append(
                    f'<rect class="lat-{name}" x="{cx - 3:.1f}" y="{cy - 3:.1f}" width="6" '
                    f'height="6"><title>{tip}</title></rect>'
                )
    parts.append("</svg>")
    return Charts("".join(parts), said)
