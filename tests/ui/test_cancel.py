"""Cancelling a running run from the dashboard (issue 29): a real worker process runs a job
that loops on ctx.wait(); the Cancel button's POST (credential, CSRF and origin checked as
every action) ends the run's lease in the database, the worker stops the body, the history
says an operator cancelled it, the old token's fenced writes are refused, and the job's next
run (any worker's, a higher token) is a new run, not a retry of the cancelled slot."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import psycopg
import pytest

import tenure
from tenure.scheduler import jobs as ops
from tests.support.env import tenure_env
from tests.support.scheduler_support import WorkerProcess, prepare, query, wait_for
from tests.support.ui import TOKEN, http, ui_server
from tests.ui.test_ui import basic, csrf_and_cookie

KEY = "cancel-me"


def evidence(dsn: str, schema: str, phase: str) -> list[tuple[int, str]]:
    rows = query(
        dsn,
        schema,
        "SELECT token, kind FROM {schema}.evidence WHERE job_key = %s AND phase = %s "
        "ORDER BY token",
        (KEY, phase),
    )
    return [(token, kind) for token, kind in rows]


def test_cancelling_a_running_run_ends_its_lease_stops_it_and_records_it(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    prepare(dsn, schema)
    worker = WorkerProcess("cancellable", tenure_env(dsn, schema), tmp_path / "worker.log")
    try:
        worker.wait_started()
        with tenure.connect(dsn, schema=schema) as client:
            channel = tenure.db.channels.channel("jobs", schema)
            ops.trigger(client, KEY, channel=channel)
            [(token, kind)] = wait_for(
                lambda: evidence(dsn, schema, "started"), timeout=30, what="the run to start"
            )
            assert kind == "manual"
            with ui_server(dsn, schema, "--actions", TENURE_UI_TOKEN=TOKEN) as ui:
                page = f"job?key={KEY}"
                csrf, cookie = csrf_and_cookie(ui.url, page, basic(TOKEN))
                shown = http(ui.url + page, headers=basic(TOKEN)).body
                assert re.search(rf'name="token" value="{token}"', shown), shown
                form = {"csrf": csrf, "target": KEY, "token": str(token), "next": f"/{page}"}
                done = http(
                    ui.url + "action/cancel",
                    data=urllib.parse.urlencode(form).encode(),
                    headers={**basic(TOKEN), "Cookie": cookie},
                )
                assert done.status == 303, done
                notice = urllib.parse.unquote_plus(done.headers["location"])
                assert f"run with token {token} cancelled" in notice, notice

                # The lease ended in the database: the old token's strict writes are refused.
                with pytest.raises(tenure.StaleTokenError):
                    client.results.put(KEY, {"late": True}, token=token, strict=True)
                with (
                    pytest.raises(tenure.StaleTokenError),
                    psycopg.connect(dsn) as conn,
                    conn.transaction(),
                ):
                    tenure.fence(conn, KEY, token, schema=schema)
                # The worker's renewal failed: the body's ctx.wait() returned, it stopped...
                wait_for(
                    lambda: evidence(dsn, schema, "stopped"), timeout=30, what="the body to stop"
                )
                # ... and its end, recorded by the worker, keeps the operator's outcome.
                wait_for(
                    lambda: f"token {token}: cancelled" in worker.log(),
                    timeout=30,
                    what="the worker to record the run's end",
                )
                [(outcome, error, running)] = query(
                    dsn,
                    schema,
                    "SELECT r.outcome, r.error, j.running_slot FROM {schema}.job_runs AS r "
                    "JOIN {schema}.scheduled_jobs AS j USING (job_key) "
                    "WHERE r.job_key = %s AND r.token = %s",
                    (KEY, token),
                )
                assert (outcome, running) == ("cancelled", None), error
                assert error == "cancelled by an operator (from the dashboard)"
                history = http(ui.url + page, headers=basic(TOKEN)).body
                assert "cancelled by an operator (from the dashboard)" in history
                assert 'action="/action/cancel"' not in history  # nothing runs now

                # Cancelling it again, or a token that never ran, changes nothing.
                again = http(
                    ui.url + "action/cancel",
                    data=urllib.parse.urlencode(form).encode(),
                    headers={**basic(TOKEN), "Cookie": cookie},
                )
                assert "no run with token" in urllib.parse.unquote_plus(again.headers["location"])

            # The next run takes the job with a higher token, as a new run, not a retry of
            # the cancelled slot.
            ops.trigger(client, KEY, channel=channel)
            started = wait_for(
                lambda: [r for r in evidence(dsn, schema, "started") if r[0] > token],
                timeout=30,
                what="the next run",
            )
            assert [kind for _, kind in started] == ["manual"]
    finally:
        worker.stop()
