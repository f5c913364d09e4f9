"""Bulk pause/resume from the jobs list, over HTTP against a real `tenure ui`: behind the
action credential, the CSRF token and the same-origin check like every action."""

from __future__ import annotations

import re
import urllib.parse

from tests.support.ui import TOKEN, http, paused, register_job, ui_server
from tests.ui.test_ui import basic, csrf_and_cookie


def test_bulk_pause_and_resume_from_the_jobs_list(dsn: str, schema: str) -> None:
    for key in ("a", "b", "c d"):
        register_job(dsn, schema, key)
    with ui_server(dsn, schema, "--actions", TENURE_UI_TOKEN=TOKEN) as ui:
        auth = basic(TOKEN)
        csrf, cookie = csrf_and_cookie(ui.url, "jobs", auth)
        page = http(ui.url + "jobs", headers=auth).body
        # A checkbox per job, each with an id of its own (the live refresh keeps it ticked).
        assert len(re.findall(r'<input type="checkbox" name="target"', page)) == 3
        assert 'id="pick-c%20d"' in page

        def post(action: str, fields: list[tuple[str, str]], **headers: str) -> int:
            reply = http(
                ui.url + f"action/{action}",
                data=urllib.parse.urlencode(fields).encode(),
                headers={**auth, "Cookie": cookie, **headers},
            )
            return reply.status

        picked = [("target", "a"), ("target", "c d"), ("next", "/jobs")]
        assert post("bulk-pause", picked) == 403  # no CSRF token
        assert post("bulk-pause", [*picked, ("csrf", csrf)], Origin="http://evil.example") == 403
        assert not any(paused(dsn, schema, k) for k in ("a", "b", "c d"))
        assert post("bulk-pause", [*picked, ("csrf", csrf)]) == 303
        assert [paused(dsn, schema, k) for k in ("a", "b", "c d")] == [True, False, True]
        assert post("bulk-resume", [("target", "c d"), ("csrf", csrf)]) == 303
        assert [paused(dsn, schema, k) for k in ("a", "b", "c d")] == [True, False, False]
    # Read-only (no --actions): no checkboxes, and the action is refused.
    with ui_server(dsn, schema) as ro:
        assert 'type="checkbox"' not in http(ro.url + "jobs").body
        refused = http(ro.url + "action/bulk-resume", data=b"target=a")
        assert refused.status == 403 and paused(dsn, schema, "a")
