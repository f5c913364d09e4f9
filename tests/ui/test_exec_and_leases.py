"""Keys that are not scheduled jobs on the dashboard: `tenure exec` runs (exec_runs) and bare
library leases (job_leases and the fence row), on the job page, the overview and the jobs
list; and the timeline's axis labels inside its frame."""

from __future__ import annotations

import datetime as dt
import re

import psycopg

import tenure
from tenure.ui.data import Run
from tenure.ui.timeline import GLYPH, LABEL, WIDTH, render
from tests.support.env import run_tenure, tenure_env
from tests.support.ui import register_job
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


def test_a_bare_lease_shows_its_takeovers_and_refused_writes(dsn: str, schema: str) -> None:
    """Two executions take one bare key over from each other (tokens 1, 2, 3); between the
    takeovers the first one's stale write is refused, by results.put and by the fence. The
    job page draws each token (migration 18's lease events), both takeovers and the refusals,
    marked as the scheduler's stale_rejected runs are."""
    ident = psycopg.sql.Identifier(schema)

    def expire() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL(
                    "UPDATE {}.job_leases SET lease_until = clock_timestamp() - interval '1ms' "
                    "WHERE job_key = 'nightly'"
                ).format(ident)
            )

    with tenure.connect(dsn, schema=schema, migrate=True) as client:
        a = client.acquire("nightly", ttl=30)
        assert a is not None and a.token == 1
        expire()
        b = client.acquire("nightly", ttl=30)
        assert b is not None and b.token == 2
        client.results.put("nightly", {"by": "b"}, token=b.token)
        try:
            client.results.put("nightly", {"by": "a"}, token=a.token)
        except tenure.StaleTokenError:
            pass
        else:
            raise AssertionError("the stale write was accepted")
        expire()
        again = client.acquire("nightly", ttl=30)
        assert again is not None and again.token == 3

    [(status, page)] = pages(dsn, schema, ("/job", "key=nightly"))
    assert status == 200
    for token in (1, 2, 3):
        assert f'data-token="{token}"' in page, token
    assert "token 2 took over from token 1" in page
    assert "token 3 took over from token 2" in page
    assert 'data-outcome="stale_rejected"' in page
    assert "write refused: token 1 is stale; token 2 had taken over" in page
    assert "2 takeover(s); 1 refused write(s)" in page


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


def test_the_overview_tiles_are_disjoint(dsn: str, schema: str) -> None:
    """Each job is counted on one state tile, by the jobs list's precedence (quarantined,
    paused, running, failing, idle): the tiles add up to the total and each tile's number
    is what its link lists."""
    for key in ("poison", "held", "busy", "broken", "calm"):
        register_job(dsn, schema, key)
    ident = psycopg.sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL(
                "UPDATE {}.scheduled_jobs SET paused = true, paused_at = now(), "
                "quarantined_at = now(), quarantine_reason = 'crashed' WHERE job_key = 'poison'"
            ).format(ident)
        )
        conn.execute(
            psycopg.sql.SQL(
                "UPDATE {}.scheduled_jobs SET paused = true, paused_at = now() "
                "WHERE job_key = 'held'"
            ).format(ident)
        )
        conn.execute(
            psycopg.sql.SQL(
                "UPDATE {}.scheduled_jobs SET running_slot = next_slot, running_token = 2 "
                "WHERE job_key = 'busy'"
            ).format(ident)
        )
        # 'busy' (running) and 'broken' (idle) both failed their last run.
        for key in ("busy", "broken"):
            conn.execute(
                psycopg.sql.SQL(
                    "INSERT INTO {}.job_runs (job_key, slot, kind, attempt, token, worker_id, "
                    "host, pid, started_at, finished_at, outcome, error) VALUES "
                    "(%s, now(), 'manual', 1, 1, 'w', 'h', 1, now(), now(), 'failed', 'boom')"
                ).format(ident),
                (key,),
            )
    states = ("running", "idle", "paused", "quarantined", "failing")
    results = pages(dsn, schema, ("/", ""), *[("/jobs", f"state={state}") for state in states])
    assert all(status == 200 for status, _ in results)
    overview = results[0][1]
    tiles = {state: int(n) for n, state in re.findall(r'state=\w+"><b>(\d+)</b> (\w+)', overview)}
    assert tiles == {"running": 1, "idle": 1, "paused": 1, "quarantined": 1, "failing": 1}
    assert sum(tiles.values()) == 5 and "Scheduled jobs (5)" in overview
    for state, (_status, listed) in zip(states, results[1:], strict=True):
        assert listed.count('<a href="/job?key=') == tiles[state], state


def _labelled(svg: str) -> set[int]:
    """The tokens the timeline's visible labels name: "#7", "✓7" beside a bar, "#3–#9"."""
    out: set[int] = set()
    for text in re.findall(r'<text class="label[^"]*"[^>]*>([^<]*)</text>', svg):
        for a, b in re.findall(r"#?(\d+)(?:–#(\d+))?", text.split(" w")[0]):
            out.update(range(int(a), int(b or a) + 1))
    return out


def test_a_busy_cluster_keeps_its_token_labels() -> None:
    # 40 short runs 0.3 s apart in a minute: bars too narrow for a label each, and too
    # close for one beside each; then two lone runs with room for their own labels.
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    runs = [
        Run(
            run_id=token,
            slot=t0,
            kind="manual",
            attempt=1,
            token=token,
            worker="w",
            host="h",
            pid=1,
            started_at=t0 + dt.timedelta(seconds=at),
            finished_at=t0 + dt.timedelta(seconds=at + 0.1),
            outcome="succeeded",
            error=None,
            recorded_at=t0 + dt.timedelta(seconds=at),
        )
        for token, at in [(n, 5 + 0.3 * n) for n in range(1, 41)] + [(41, 40.0), (42, 50.0)]
    ]
    tl = render(runs, since=t0, now=t0 + dt.timedelta(seconds=60), job_key="k")
    assert _labelled(tl.svg) == set(range(1, 43)), tl.svg


def test_the_legend_names_every_mark_the_timeline_draws(dsn: str, schema: str) -> None:
    register_job(dsn, schema)
    [(status, page)] = pages(dsn, schema, ("/job", "key=report"))
    assert status == 200
    legend = re.search(r'<p class="legend">(.*?)</p>', page, re.S)
    assert legend is not None, page
    for outcome, glyph in GLYPH.items():
        assert f"{glyph} {LABEL[outcome]}" in legend.group(1), outcome


def test_an_exec_takeover_is_marked_on_the_timeline(dsn: str, schema: str) -> None:
    """`tenure exec` runs: each has its own slot (its start), so a takeover is a run with a
    higher token that started while a lower one had not ended cleanly (its lease lost, or
    still 'running': its process died), as for coded runs."""
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    insert = psycopg.sql.SQL(
        "INSERT INTO {}.exec_runs (job_key, token, host, pid, started_at, finished_at, outcome, "
        "exit_code, error, recorded_at) VALUES ('nightly', %s, 'h', %s, "
        "now() - %s * interval '1 s', now() - %s * interval '1 s', %s, NULL, NULL, "
        "now() - %s * interval '1 s')"
    ).format(psycopg.sql.Identifier(schema))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for token, start, end, outcome in (
            (1, 60, 55, "succeeded"),  # a clean run: the next one is no takeover
            (2, 50, 30, "lease_lost"),  # frozen past its lease ...
            (3, 40, 35, "succeeded"),  # ... taken over by token 3
            (4, 20, None, "running"),  # its process died ...
            (5, 10, 5, "succeeded"),  # ... token 5 took the expired lease
        ):
            conn.execute(insert, (token, 10 + token, start, end, outcome, start))
        conn.execute(  # the key's lease row, as `tenure exec` leaves it (token 5, released)
            psycopg.sql.SQL(
                "INSERT INTO {}.job_leases (job_key, lease_owner, lease_until, fencing_token, "
                "lease_ttl, acquired_at, renewed_at) VALUES ('nightly', gen_random_uuid(), "
                "now() - interval '5 s', 5, interval '10 s', now() - interval '10 s', "
                "now() - interval '10 s')"
            ).format(psycopg.sql.Identifier(schema))
        )
    [(status, page)] = pages(dsn, schema, ("/job", "key=nightly&window=5m"))
    assert status == 200, page
    takeovers = re.findall(r"takeover: token (\d+) \([^)]*\) → token (\d+)", page)
    assert sorted(set(takeovers)) == [("2", "3"), ("4", "5")], page
