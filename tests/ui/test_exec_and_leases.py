"""Keys that are not scheduled jobs on the dashboard: `tenure exec` runs (exec_runs) and bare
library leases (job_leases and the fence row), on the job page, the overview and the jobs
list; and the timeline's axis labels inside its frame."""

from __future__ import annotations

import datetime as dt
import re

import tenure
from tenure.ui.timeline import WIDTH, render
from tests.support.env import run_tenure, tenure_env
from tests.ui.test_page_safety import pages


def test_exec_runs_and_bare_leases_are_shown(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True) as client:
        env = tenure_env(dsn, schema)
        ok = run_tenure(["exec", "--key", "backup", "--", "true"], env)
        assert ok.returncode == 0, ok.stderr
        bad = run_tenure(["exec", "--key", "backup", "--", "sh", "-c", "exit 3"], env)
        assert bad.returncode == 3, bad.stderr
        # A bare library lease taken twice: token 2 took over from token 1.
        for _ in range(2):
            with client.lease("demo", ttl=30):
                pass

    (s1, job), (s2, overview), (s3, jobs), (s4, demo) = pages(
        dsn,
        schema,
        ("/job", "key=backup"),
        ("/", ""),
        ("/jobs", ""),
        ("/job", "key=demo"),
    )
    assert (s1, s2, s3, s4) == (200, 200, 200, 200)
    # The job page: both exec runs, in the history and on the timeline.
    assert "No run recorded" not in job
    assert 'data-token="1" data-outcome="succeeded"' in job
    assert 'data-token="2" data-outcome="failed"' in job
    assert "exit status 3" in job
    # The overview counts them.
    assert "<b>2</b> runs" in overview
    assert "<b>1</b> failed runs" in overview
    assert "job?key=backup" in overview  # the failure is an incident
    # The jobs list names the exec key and the bare lease.
    assert "job?key=backup" in jobs and "job?key=demo" in jobs
    # The bare lease's page draws its newest lease and says it took over from token 1.
    assert 'data-token="2" data-outcome="lease"' in demo
    assert "token 2 took over from token 1" in demo


def test_the_last_axis_label_stays_inside_the_frame() -> None:
    # The window an empty page fits (the newest minute and a margin), ending just after a
    # tick: that tick sits at the right edge.
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    for span, after in ((63.0, 0.1), (63.0, 5.0), (3600.0, 1.0), (9.0, 0.01)):
        now = t0 + dt.timedelta(seconds=after)
        tl = render([], since=now - dt.timedelta(seconds=span), now=now, job_key="k")
        ticks = re.findall(
            r'<text class="tick" x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)"[^>]*>([^<]+)<',
            tl.svg,
        )
        assert ticks, tl.svg
        for px, anchor, label in ticks:
            width = 7.5 * len(label)  # the tick font's advance, generously
            left = {"start": 0.0, "middle": width / 2, "end": width}[anchor]
            x = float(px)
            assert x - left >= 0 and x - left + width <= WIDTH, (span, px, anchor, label)
