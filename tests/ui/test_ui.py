"""The dashboard over plain HTTP against a real `tenure ui` process and a real PostgreSQL:
credentials, CSRF, read-only mode, secrets, and the server-side timeline drawing."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import re
import signal
import socket
import urllib.parse
from pathlib import Path

import psycopg
import pytest

from tenure.ui.data import Run
from tenure.ui.timeline import render
from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import prepare, wait_for, worker_processes
from tests.support.ui import TOKEN, asgi_get, http, paused, register_job, ui_server


def basic(token: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"ops:{token}".encode()).decode()}


def csrf_and_cookie(server_url: str, path: str, headers: dict[str, str]) -> tuple[str, str]:
    page = http(server_url + path, headers=headers)
    assert page.status == 200, page.body
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.body)
    assert token is not None, "no CSRF field on an actions-enabled page"
    cookie = page.headers["set-cookie"].split(";", 1)[0]
    return token.group(1), cookie


@pytest.fixture
def job(dsn: str, schema: str) -> str:
    register_job(dsn, schema)
    return "report"


def test_an_action_without_the_credential_is_refused(dsn: str, schema: str, job: str) -> None:
    with ui_server(dsn, schema, "--actions", TENURE_UI_TOKEN=TOKEN) as ui:
        csrf, cookie = csrf_and_cookie(ui.url, f"job?key={job}", basic(TOKEN))
        form = urllib.parse.urlencode({"csrf": csrf, "target": job, "next": "/"}).encode()
        for headers in ({}, basic("wrong"), {"Authorization": "Bearer wrong"}):
            refused = http(
                ui.url + "action/pause", data=form, headers={**headers, "Cookie": cookie}
            )
            assert refused.status == 401, refused
            assert "Basic" in refused.headers["www-authenticate"]
        # Pages too need the credential.
        assert http(ui.url + "jobs").status == 401
        assert not paused(dsn, schema, job)
        # The same POST with the credential is carried out (so the refusals above were the
        # credential's doing).
        # (Its `next` tries to leave the dashboard: the redirect stays on it.)
        form = urllib.parse.urlencode(
            {"csrf": csrf, "target": job, "next": "/\\evil.example/"}
        ).encode()
        done = http(ui.url + "action/pause", data=form, headers={**basic(TOKEN), "Cookie": cookie})
        assert done.status == 303, done
        assert done.headers["location"].startswith("/?notice=")
        assert "paused" in urllib.parse.unquote_plus(done.headers["location"])
        assert paused(dsn, schema, job)


def test_a_post_without_csrf_token_is_refused(dsn: str, schema: str, job: str) -> None:
    with ui_server(dsn, schema, "--actions", TENURE_UI_TOKEN=TOKEN) as ui:
        csrf, cookie = csrf_and_cookie(ui.url, f"job?key={job}", basic(TOKEN))
        auth = basic(TOKEN)
        attempts = {
            "no token": {"target": job},
            "token of another session": {"target": job, "csrf": "0" * 64},
        }
        for what, fields in attempts.items():
            body = urllib.parse.urlencode(fields).encode()
            refused = http(ui.url + "action/pause", data=body, headers={**auth, "Cookie": cookie})
            assert refused.status == 403, (what, refused)
            assert "CSRF" in refused.body
        # A valid token but no session cookie (a forged cross-site form cannot read it).
        body = urllib.parse.urlencode({"target": job, "csrf": csrf}).encode()
        assert http(ui.url + "action/pause", data=body, headers=auth).status == 403
        # Right token and cookie, but posted from another origin.
        foreign = http(
            ui.url + "action/pause",
            data=urllib.parse.urlencode({"target": job, "csrf": csrf}).encode(),
            headers={**auth, "Cookie": cookie, "Origin": "http://evil.example"},
        )
        assert foreign.status == 403
        assert not paused(dsn, schema, job)
        ok = http(
            ui.url + "action/pause",
            data=urllib.parse.urlencode({"target": job, "csrf": csrf}).encode(),
            headers={**auth, "Cookie": cookie},
        )
        assert ok.status == 303 and paused(dsn, schema, job)


def test_read_only_dashboard_changes_nothing_and_shows_no_password(
    dsn: str, schema: str, job: str
) -> None:
    # The local server trusts every connection, so a password in the DSN is accepted and
    # ignored: what matters is that it never reaches a page.
    secret_dsn = psycopg.conninfo.make_conninfo(dsn, password="hunter2-dsn-password")
    with ui_server(secret_dsn, schema) as ui:
        assert "hunter2" not in ui.log()
        pages = ("", "jobs", f"job?key={job}", "leases", "outbox", "jobs?state=idle&sort=last")
        for path in pages:
            page = http(ui.url + path)
            assert page.status == 200, (path, page.body)
            assert "hunter2" not in page.body
            assert 'method="post"' not in page.body  # no action form anywhere
        refused = http(ui.url + "action/pause", data=f"target={job}".encode())
        assert refused.status == 403 and "actions are off" in refused.body
        assert http(ui.url + "job?key=nope").status == 404
    assert not paused(dsn, schema, job)


def test_usage_errors_and_the_exposure_warning(dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    out = run_tenure(["ui", "--actions"], env, timeout=30)
    assert out.returncode == 2
    assert "--actions needs a credential" in out.stderr
    down = run_tenure(["ui", "--dsn", "postgresql://nobody@127.0.0.1:1/x"], env, timeout=30)
    assert down.returncode == 1
    assert down.stderr.startswith("tenure: error: ") and len(down.stderr.splitlines()) == 1
    with ui_server(dsn, schema, "--host", "0.0.0.0") as ui:
        assert "without a credential" in ui.log()
        assert "has no tenure tables yet; run `tenure migrate`" in ui.log()
        # This schema was never migrated: the page says what to do.
        page = http(ui.url.replace("0.0.0.0", "127.0.0.1"))
        assert page.status == 503 and "tenure migrate" in page.body


def _run(token: int, outcome: str, start: float, end: float | None, worker: str) -> Run:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    at = t0 + dt.timedelta(seconds=start)
    return Run(
        run_id=token,
        slot=t0,
        kind="manual",
        attempt=1,
        token=token,
        worker=worker,
        host="h",
        pid=1,
        started_at=at,
        finished_at=None if end is None else t0 + dt.timedelta(seconds=end),
        outcome=outcome,
        error=None,
        recorded_at=at,
    )


def test_timeline_marks_takeover_and_refused_write() -> None:
    runs = [_run(7, "stale_rejected", 0, 9, "w-a"), _run(8, "succeeded", 4, 6, "w-b")]
    t0 = runs[0].slot
    tl = render(runs, since=t0, now=t0 + dt.timedelta(seconds=10), job_key="k<&>")
    kinds = [(m.kind, m.text) for m in tl.markers]
    assert kinds == [
        ("takeover", "takeover: token 7 (w-a) → token 8 (w-b)"),
        ("refused", "write refused: token 7 is stale; token 8 had taken over"),
    ]
    assert 'data-token="7" data-outcome="stale_rejected"' in tl.svg
    assert 'data-token="8" data-outcome="succeeded"' in tl.svg
    assert "overtaken" in tl.svg  # token 7 drawn hatched after the takeover
    assert "k&lt;&amp;&gt;" in tl.svg and "k<&>" not in tl.svg
    # A plain sequence of clean runs has no marker.
    clean = [_run(1, "succeeded", 0, 1, "w"), _run(2, "succeeded", 2, 3, "w")]
    assert render(clean, since=t0, now=t0 + dt.timedelta(seconds=5), job_key="k").markers == ()


def test_mounted_in_another_asgi_app_links_stay_under_its_prefix(dsn: str, schema: str) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from tenure.ui import Dashboard

    register_job(dsn, schema, "a b/c")

    async def main() -> list[tuple[int, str]]:
        dashboard = Dashboard(dsn, schema=schema)
        outer = Starlette(routes=[Mount("/ops/tenure", app=dashboard.app)])
        try:
            return [
                await asgi_get(outer, "/ops/tenure/jobs"),
                await asgi_get(outer, "/ops/tenure/job", "key=a+b%2Fc"),
                await asgi_get(outer, "/ops/tenure/static/ui.js"),
            ]
        finally:
            await dashboard.close()

    (s1, jobs), (s2, job), (s3, script) = asyncio.run(main())
    assert (s1, s2, s3) == (200, 200, 200)
    assert 'href="/ops/tenure/job?key=a%20b/c"' in jobs
    assert 'src="/ops/tenure/static/ui.js"' in jobs and 'data-base="/ops/tenure"' in jobs
    assert "<h1>a b/c</h1>" in job
    assert "EventSource" in script


def test_a_worker_serves_the_dashboard_beside_its_jobs(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    env = tenure_env(dsn, schema)
    with worker_processes(1, "slow", env, tmp_path, args=["--ui-port", "0"]) as [worker]:
        line = wait_for(
            lambda: next((x for x in worker.log().splitlines() if "dashboard on " in x), None),
            timeout=10,
            what="the worker's dashboard",
        )
        url = line.split("dashboard on ", 1)[1].split()[0]
        page = http(url + "job?key=slow")
        assert page.status == 200 and "<h1>slow</h1>" in page.body
        assert "read-only" in page.body
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0


def test_a_worker_serves_metrics_health_and_the_dashboard_on_one_port(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """`tenure worker --metrics-port 0 --ui`: /metrics, /healthz, /readyz and the pages on
    the same port; the dashboard's credential (its env twin here) guards the pages only."""
    prepare(dsn, schema)
    env = tenure_env(dsn, schema, TENURE_WORKER_UI="1", TENURE_WORKER_UI_TOKEN=TOKEN)
    args = ["--metrics-port", "0"]
    with worker_processes(1, "slow", env, tmp_path, args=args) as [worker]:
        line = wait_for(
            lambda: next((x for x in worker.log().splitlines() if "metrics on " in x), None),
            timeout=15,
            what="the worker's metrics and dashboard",
        )
        url = line.split("metrics on ", 1)[1].split()[0].removesuffix("metrics")
        assert f"dashboard on {url} (read-only)" in worker.log()
        metrics = http(url + "metrics")
        health = http(url + "healthz")
        ready = http(url + "readyz")
        page = http(url + "job?key=slow", headers=basic(TOKEN))
        anonymous = http(url + "job?key=slow")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0
    assert metrics.status == 200 and "tenure_schema_version" in metrics.body
    assert (health.status, health.body) == (200, "ok\n")
    assert ready.status == 200 and ready.body.startswith("ready"), ready.body
    assert page.status == 200 and "<h1>slow</h1>" in page.body and "read-only" in page.body
    assert anonymous.status == 401


def test_worker_dashboard_usage_errors(dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    for args, says in (
        (["--ui"], "give --metrics-port"),
        (["--ui", "--metrics-port", "0", "--ui-port", "0"], "give one of them"),
        (["--ui", "--metrics-port", "0", "--ui-actions"], "--ui-actions needs a credential"),
        (["--ui-actions", "--ui-token", TOKEN], "--ui-actions needs the dashboard"),
    ):
        out = run_tenure(["worker", "tests.support.scheduler_apps:slow", *args], env)
        assert out.returncode == 2, (args, out.stderr)
        assert says in out.stderr, (args, out.stderr)
    # A metrics port in use: a runtime error that names the flag to change.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        out = run_tenure(
            ["worker", "tests.support.scheduler_apps:slow", "--ui", "--metrics-port", port], env
        )
    assert out.returncode == 1, out.stderr
    assert "choose another --metrics-port" in out.stderr, out.stderr


def test_a_dense_window_counts_every_run_and_draws_the_notable_ones(dsn: str, schema: str) -> None:
    """More runs than the timeline draws one by one: a density strip counts them all (by
    outcome, with the worst lateness per slice), and bars remain for the takeover and the
    refused write (never lost in the crowd)."""
    from tenure.ui import Dashboard
    from tenure.ui.data import TIMELINE_LIMIT

    register_job(dsn, schema, "busy")
    plain = TIMELINE_LIMIT + 100
    columns = (
        "INSERT INTO {}.job_runs (job_key, slot, kind, attempt, token, worker_id, host, pid, "
        "started_at, finished_at, outcome, error, recorded_at) "
    )
    table = psycopg.sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL(
                columns
                + """SELECT 'busy', t, 'scheduled', 1, n, 'w1', 'h', 1, t, t + interval '1 s',
                            'succeeded', NULL, t
                     FROM generate_series(1, %(plain)s) AS n,
                          LATERAL (SELECT now() - (%(plain)s - n + 10) * interval '5 s') AS s(t)"""
            ).format(table),
            {"plain": plain},
        )
        conn.execute(
            psycopg.sql.SQL(
                columns
                + """VALUES ('busy', now() - interval '40 s', 'scheduled', 1, 100000, 'w-a', 'h',
                             2, now() - interval '40 s', now() - interval '20 s',
                             'stale_rejected', 'stale fencing token', now() - interval '40 s'),
                            ('busy', now() - interval '40 s', 'scheduled', 2, 100001, 'w-b', 'h',
                             3, now() - interval '30 s', now() - interval '25 s', 'succeeded',
                             NULL, now() - interval '30 s'),
                            -- A plain success, 42 s late: no bar of its own, but its lateness
                            -- must show.
                            ('busy', now() - interval '20 minutes 42 s', 'scheduled', 1, 99999,
                             'w1', 'h', 1, now() - interval '20 minutes',
                             now() - interval '19 minutes', 'succeeded', NULL,
                             now() - interval '20 minutes')"""
            ).format(table)
        )

    async def main() -> tuple[int, str]:
        dashboard = Dashboard(dsn, schema=schema)
        try:
            return await asgi_get(dashboard.app, "/job", "key=busy&window=1h")
        finally:
            await dashboard.close()

    status, page = asyncio.run(main())
    assert status == 200
    assert 'class="density"' in page
    counted = re.search(r"(\d+) runs of busy between", page)
    assert counted is not None and int(counted.group(1)) == plain + 3
    slices = re.findall(
        r"(\d+) run\(s\): (\d+) succeeded or running, (\d+) failed, (\d+) lost a lease", page
    )
    assert [sum(int(s[i]) for s in slices) for i in range(4)] == [plain + 3, plain + 2, 0, 1]
    # Two late slices: the plain success, and the takeover's successor (10 s after its slot).
    assert page.count('class="slice late"') == 2
    assert "latest start 42.000s after its slot" in page
    bars = re.findall(r'data-token="(\d+)" data-outcome="(\w+)"', page)
    assert sorted(bars) == [("100000", "stale_rejected"), ("100001", "succeeded")]
    assert "takeover: token 100000 (w-a) → token 100001 (w-b)" in page
    assert "write refused: token 100000 is stale; token 100001 had taken over" in page


def test_a_quarantined_job_is_its_own_state_and_needs_attention(dsn: str, schema: str) -> None:
    from tenure.ui import Dashboard

    register_job(dsn, schema, "poison")
    register_job(dsn, schema, "fine")
    with psycopg.connect(dsn, autocommit=True) as conn:
        # What the scheduler's claim records when the streak of dead workers is reached.
        conn.execute(
            psycopg.sql.SQL(
                "UPDATE {}.scheduled_jobs SET paused = true, paused_at = now(), "
                "quarantined_at = now(), crash_streak = 3, "
                "quarantine_reason = '3 runs in a row ended with their worker gone' "
                "WHERE job_key = 'poison'"
            ).format(psycopg.sql.Identifier(schema))
        )

    async def main() -> list[tuple[int, str]]:
        dashboard = Dashboard(dsn, schema=schema)
        try:
            return [
                await asgi_get(dashboard.app, "/"),
                await asgi_get(dashboard.app, "/jobs", "state=quarantined"),
                await asgi_get(dashboard.app, "/jobs", "state=paused"),
                await asgi_get(dashboard.app, "/job", "key=poison"),
            ]
        finally:
            await dashboard.close()

    (s1, overview), (s2, quarantined), (s3, paused_page), (s4, job) = asyncio.run(main())
    assert (s1, s2, s3, s4) == (200, 200, 200, 200)
    assert "1 job(s) quarantined" in overview
    assert "job?key=poison" in quarantined and "job?key=fine" not in quarantined
    assert "job?key=poison" not in paused_page
    assert "3 runs in a row ended with their worker gone" in job
