"""The dashboard's runtime schedule pages (issue 27): list and search, create, edit, pause
with a note, resume and remove, each behind the action credential and CSRF, each change
recorded and shown; read-only without --actions."""

from __future__ import annotations

import html
import re
import urllib.parse

import tenure
from tests.hardening.hostile import stored
from tests.support.ui import TOKEN, http, ui_server
from tests.ui.test_ui import basic, csrf_and_cookie


def test_create_edit_pause_resume_remove(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True) as client:
        tenure.add_schedule(client, "tenant-1", task="reports.send", every="1h", args={"t": 1})
    auth = basic(TOKEN)
    with ui_server(dsn, schema, "--actions", TENURE_UI_TOKEN=TOKEN) as ui:
        csrf, cookie = csrf_and_cookie(ui.url, "schedules", auth)
        listing = http(ui.url + "schedules?q=tenant", headers=auth)
        assert (
            listing.status == 200 and "tenant-1" in listing.body and "reports.send" in listing.body
        )

        def post(action: str, **fields: str) -> str:
            body = urllib.parse.urlencode({"csrf": csrf, "next": "/schedules", **fields}).encode()
            done = http(ui.url + f"action/{action}", data=body, headers={**auth, "Cookie": cookie})
            assert done.status == 303, done
            return urllib.parse.unquote_plus(done.headers["location"])

        assert "tenant-2: added" in post(
            "schedule-save", mode="create", target="tenant-2", task="reports.send",
            trigger="cron", value="0 9 * * *", tz="Europe/Paris", args='{"t": 2}',
        )  # fmt: skip
        assert "tenant-1: changed" in post(
            "schedule-save", target="tenant-1", trigger="every", value="1h", args='{"t": 10}'
        )
        # Bad input is a notice, and changes nothing.
        before = stored(dsn, schema)
        refused = post("schedule-save", target="tenant-1", trigger="cron", value="99 * * * *")
        assert "schedule-save failed: " in refused and "invalid cron expression" in refused
        assert stored(dsn, schema) == before
        assert "tenant-1: paused" in post("schedule-pause", target="tenant-1", note="ticket 7")
        page = http(ui.url + "schedule?key=tenant-1", headers=auth)
        assert page.status == 200
        text = html.unescape(page.body)
        assert "ticket 7" in text and '"t": 10' in text
        assert re.search(r"<td>pause</td>.*<td>update</td>.*<td>add</td>", text, re.S)
        assert "resumed" in post("schedule-resume", target="tenant-1")
        assert "tenant-2: removed" in post("schedule-remove", target="tenant-2")
        # No CSRF token: refused, nothing removed.
        body = urllib.parse.urlencode({"target": "tenant-1"}).encode()
        refused_post = http(
            ui.url + "action/schedule-remove", data=body, headers={**auth, "Cookie": cookie}
        )
        assert refused_post.status == 403
    with tenure.connect(dsn, schema=schema) as client:
        [one] = tenure.list_schedules(client)
        assert (one.key, one.args, one.paused) == ("tenant-1", {"t": 10}, False)
        assert tenure.get_schedule(client, "tenant-2") is None
        actions = [c.action for c in tenure.schedule_changes(client, "tenant-1")]
        assert actions == ["resume", "pause", "update", "add"]


def test_read_only_dashboard_shows_schedules_without_forms(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True) as client:
        tenure.add_schedule(client, "ro", task="t", every="1h")
    with ui_server(dsn, schema) as ui:
        for path in ("schedules", "schedule?key=ro"):
            page = http(ui.url + path)
            assert page.status == 200 and "ro" in page.body
            assert 'method="post"' not in page.body
        assert http(ui.url + "schedule?key=nope").status == 404
        refused = http(ui.url + "action/schedule-remove", data=b"target=ro")
        assert refused.status == 403
    with tenure.connect(dsn, schema=schema) as client:
        assert tenure.get_schedule(client, "ro") is not None
