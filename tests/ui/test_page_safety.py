"""What a page shows of what a request or a row brings: only the dashboard's own notices, no
500 for a NUL byte, keys and errors with bidi and control characters escaped (issue 29)."""

from __future__ import annotations

import asyncio
import re
import urllib.parse

from tenure.ui import Dashboard
from tests.support.ui import TOKEN, asgi_get, http, register_job, ui_server
from tests.ui.test_ui import basic, csrf_and_cookie


def pages(dsn: str, schema: str, *requests: tuple[str, str]) -> list[tuple[int, str]]:
    async def main() -> list[tuple[int, str]]:
        dashboard = Dashboard(dsn, schema=schema)
        try:
            return [await asgi_get(dashboard.app, path, query) for path, query in requests]
        finally:
            await dashboard.close()

    return asyncio.run(main())


def test_a_notice_in_the_address_is_not_shown(dsn: str, schema: str) -> None:
    register_job(dsn, schema)
    forged = urllib.parse.urlencode({"notice": "Your session expired: call +1 555 0100"})
    for status, body in pages(dsn, schema, ("/", forged), ("/jobs", forged)):
        assert status == 200
        assert "555 0100" not in body
        assert 'class="notice"' not in body


def test_the_dashboards_own_notice_is_shown_once_signed(dsn: str, schema: str) -> None:
    register_job(dsn, schema)
    with ui_server(dsn, schema, "--actions", TENURE_UI_TOKEN=TOKEN) as ui:
        csrf, cookie = csrf_and_cookie(ui.url, "job?key=report", basic(TOKEN))
        form = urllib.parse.urlencode({"csrf": csrf, "target": "report", "next": "/"}).encode()
        done = http(ui.url + "action/pause", data=form, headers={**basic(TOKEN), "Cookie": cookie})
        assert done.status == 303, done
        location = done.headers["location"]
        shown = http(ui.url + location.lstrip("/"), headers=basic(TOKEN))
        assert shown.status == 200
        notice = re.search(r'<p class="notice"[^>]*>([^<]*)</p>', shown.body)
        assert notice is not None and "paused" in notice.group(1), shown.body
        # The same address with the text changed and the signature kept shows nothing.
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))
        query["notice"] = "report paused. Call +1 555 0100 to undo"
        tampered = http(ui.url + "?" + urllib.parse.urlencode(query), headers=basic(TOKEN))
        assert tampered.status == 200 and "555 0100" not in tampered.body


def test_a_nul_byte_in_the_query_is_a_bad_request(dsn: str, schema: str) -> None:
    register_job(dsn, schema)
    answers = pages(
        dsn, schema, ("/jobs", "q=a%00b"), ("/job", "key=re%00port"), ("/leases", "q=%00")
    )
    for status, body in answers:
        assert status == 400, body
        assert "NUL" in body


def test_bidi_and_control_characters_in_keys_are_escaped(dsn: str, schema: str) -> None:
    key = "pay\u202eexe.txt\x1b[31m"
    register_job(dsn, schema, key)
    [(s1, jobs), (s2, job)] = pages(
        dsn, schema, ("/jobs", ""), ("/job", urllib.parse.urlencode({"key": key}))
    )
    assert (s1, s2) == (200, 200)
    for body in (jobs, job):
        assert "\u202e" not in body and "\x1b" not in body
        assert "\\u202e" in body and "\\x1b" in body


def test_a_cron_jobs_next_slot_is_also_shown_in_its_own_zone(dsn: str, schema: str) -> None:
    import tenure

    app = tenure.Scheduler(dsn, schema=schema, migrate=True)
    app.add_job("ny/open", lambda ctx: None, cron="30 9 * * *", timezone="America/New_York")
    app.add_job("utc/close", lambda ctx: None, cron="0 17 * * *")
    app.register()
    [(s1, job), (s2, jobs), (s3, plain)] = pages(
        dsn,
        schema,
        ("/job", "key=ny%2Fopen"),
        ("/jobs", ""),
        ("/job", "key=utc%2Fclose"),
    )
    assert (s1, s2, s3) == (200, 200, 200)
    # 09:30 in New York, whatever the server's or the browser's zone.
    in_new_york = r'<small class="tz">\(\d{4}-\d\d-\d\d 09:30:00 America/New_York\)</small>'
    assert re.search(in_new_york, job)
    assert "09:30:00 America/New_York" in jobs
    assert 'class="tz"' not in plain  # a UTC job's times need no second zone
