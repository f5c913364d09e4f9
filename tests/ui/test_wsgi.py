"""The dashboard as a WSGI application (`tenure.ui.wsgi_app`), served by a real WSGI server
(the standard library's, threaded) over real HTTP against a real PostgreSQL."""

from __future__ import annotations

import re
import urllib.parse

from tenure.ui import wsgi_app
from tests.support.ui import TOKEN, http, paused, register_job, wsgi_server


def test_pages_static_files_and_the_prefix_under_a_wsgi_server(dsn: str, schema: str) -> None:
    register_job(dsn, schema, "a b/c")
    app = wsgi_app(dsn, schema=schema)
    try:
        with wsgi_server(app, "/ops/tenure") as url:
            jobs = http(url + "jobs")
            job = http(url + "job?key=" + urllib.parse.quote("a b/c", safe=""))
            script = http(url + "static/ui.js")
            events = http(url + "events")
    finally:
        app.close()
    assert (jobs.status, job.status, script.status) == (200, 200, 200)
    assert 'href="/ops/tenure/job?key=a%20b/c"' in jobs.body
    assert 'data-base="/ops/tenure"' in jobs.body
    assert "<h1>a b/c</h1>" in job.body and "read-only" in job.body
    assert "EventSource" in script.body
    # No event stream under WSGI: the page is told to poll, and /events says "don't retry".
    assert 'data-stream="off"' in job.body
    assert events.status == 204


def test_a_credential_and_an_action_through_a_wsgi_server(dsn: str, schema: str) -> None:
    """The request body and headers make it through the adapter: the credential is checked,
    and a POST with its CSRF token pauses the job."""
    register_job(dsn, schema, "report")
    app = wsgi_app(dsn, schema=schema, actions=True, credential=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with wsgi_server(app) as url:
            assert http(url + "jobs").status == 401
            page = http(url + "job?key=report", headers=auth)
            assert page.status == 200, page.body
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.body)
            assert csrf is not None
            cookie = page.headers["set-cookie"].split(";", 1)[0]
            form = urllib.parse.urlencode({"csrf": csrf.group(1), "target": "report"}).encode()
            posted = http(
                url + "action/pause",
                data=form,
                headers={
                    **auth,
                    "Cookie": cookie,
                    "Content-Type": "application/x-www-form-urlencoded",
                },
            )
    finally:
        app.close()
    assert posted.status == 303, posted.body
    assert paused(dsn, schema, "report")
