"""The throughput and lateness charts (issue 29): per job on its page and for every job on the
overview, server-rendered SVG from job_runs: runs per minute per slice of the shown window,
and the median and 99th percentile of the scheduled runs' lateness; every text escaped."""

from __future__ import annotations

import re
import urllib.parse

import psycopg
from psycopg import sql

from tests.support.ui import register_job
from tests.ui.test_page_safety import pages

ODD = 'odd<b>&"key\u202e'

INSERT = """
INSERT INTO {schema}.job_runs (job_key, slot, kind, attempt, token, worker_id, host, pid,
                               started_at, finished_at, outcome, error, recorded_at)
SELECT %(key)s, t - %(late)s * interval '1 ms' * (CASE WHEN %(grow)s THEN n ELSE 1 END),
       %(kind)s, 1, %(first)s + n, 'w', 'h', 1,
       CASE WHEN %(outcome)s = 'misfire_skipped' THEN NULL ELSE t END, t, %(outcome)s, NULL, t
FROM generate_series(1, %(count)s) AS n,
     LATERAL (SELECT now() - n * interval '2 s') AS s(t)
"""


def add_runs(
    conn: psycopg.Connection[object],
    schema: str,
    key: str,
    count: int,
    *,
    late_ms: int,
    grow: bool = False,
    kind: str = "scheduled",
    outcome: str = "succeeded",
    first: int = 0,
) -> None:
    conn.execute(
        sql.SQL(INSERT).format(schema=sql.Identifier(schema)),
        {
            "key": key,
            "count": count,
            "late": late_ms,
            "grow": grow,
            "kind": kind,
            "outcome": outcome,
            "first": first,
        },
    )


def test_the_job_page_and_the_overview_chart_throughput_and_lateness(dsn: str, schema: str) -> None:
    for key in ("report", "other", ODD):
        register_job(dsn, schema, key)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # report: 100 scheduled runs late by 10 ms, 20 ms, ... 1000 ms; 3 manual runs (no
        # lateness); 5 skipped slots (no start: not runs). other: 20 runs 5 s late.
        add_runs(conn, schema, "report", 100, late_ms=10, grow=True)
        add_runs(conn, schema, "report", 3, late_ms=0, kind="manual", first=1000)
        add_runs(conn, schema, "report", 5, late_ms=0, outcome="misfire_skipped", first=2000)
        add_runs(conn, schema, "other", 20, late_ms=5000)
        add_runs(conn, schema, ODD, 2, late_ms=0, kind="manual")
        # Outside every window shown: a week ago.
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.job_runs (job_key, slot, kind, attempt, token, worker_id, host, "
                "pid, started_at, finished_at, outcome, recorded_at) VALUES ('report', "
                "now() - interval '7 days', 'scheduled', 1, 5000, 'w', 'h', 1, "
                "now() - interval '7 days', now() - interval '7 days', 'succeeded', "
                "now() - interval '7 days')"
            ).format(sql.Identifier(schema))
        )
    odd = urllib.parse.urlencode({"key": ODD, "window": "15m"})
    [(s1, job), (s2, overview), (s3, odd_page)] = pages(
        dsn, schema, ("/job", "key=report&window=15m"), ("/", ""), ("/job", odd)
    )
    assert (s1, s2, s3) == (200, 200, 200)

    def chart_of(page: str) -> str:
        found = re.search(r'<svg xmlns="http://www.w3.org/2000/svg" class="chart".*?</svg>', page)
        assert found is not None, page
        return found.group(0)

    # The job's page: its own runs of the 15 minutes shown, per slice and in total.
    chart = chart_of(job)
    assert re.search(
        r"103 run\(s\) of report started between .* \(6\.87/min\); lateness of scheduled "
        r"runs p50 0\.505s, p99 0\.990s",
        chart,
    ), chart
    assert sum(int(n) for n in re.findall(r'class="tp-bar"[^>]*data-runs="(\d+)"', chart)) == 103
    assert chart.count('<circle class="lat-p50"') == chart.count('<rect class="lat-p99"') > 1
    summary = re.search(r'<p class="chart-summary">([^<]*)</p>', job)
    assert summary is not None and "103 run(s) of report" in summary.group(1), job

    # The overview: every job's runs of its 15 minutes.
    chart = chart_of(overview)
    assert re.search(
        r"125 run\(s\) of every job started between .* \(8\.33/min\); lateness of scheduled "
        r"runs p50 0\.605s, p99 5\.000s",
        chart,
    ), chart
    assert sum(int(n) for n in re.findall(r'class="tp-bar"[^>]*data-runs="(\d+)"', chart)) == 125

    # Text in the SVG is escaped (markup, quotes, bidi controls), as on the rest of the page.
    chart = chart_of(odd_page)
    assert "odd&lt;b&gt;&amp;&quot;key\\u202e" in chart, chart
    assert "<b>" not in chart and "\u202e" not in chart
    assert "2 run(s) of" in chart and "no scheduled run to measure lateness" in chart
