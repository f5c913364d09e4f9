"""The dashboard in a real Chromium (Debian's chromium and chromium-driver, driven by
Selenium), against a real `tenure ui` process, real worker processes and real signals.

Regenerate the README's screenshot of the job page (docs/ui-job.png):
    TENURE_UI_SCREENSHOT=docs/ui-job.png .venv/bin/python -m pytest tests/ui/test_browser.py -k demo
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import prepare, query, wait_for, worker_processes
from tests.support.ui import (
    TOKEN,
    chromium_missing,
    paused,
    register_job,
    start_browser,
    ui_server,
    wsgi_server,
)

missing = chromium_missing()
pytestmark = pytest.mark.skipif(missing is not None, reason=missing or "")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = start_browser()
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(browser: Any, check: Any, timeout: float, what: str) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # A live update replaces the page's parts in place: an element found just before a
    # re-render is stale when the check reads it, so the check is tried again (CI saw
    # `find_element(...).text` fail that way once).
    return WebDriverWait(
        browser, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(check, message=what)


def open_live(browser: Any, url: str) -> None:
    """Load ``url`` and wait until its event stream is connected; mark the document, so that
    a later check can tell an in-place update from a reload."""
    browser.get(url)
    wait_until(
        browser,
        lambda d: d.execute_script("return document.body.dataset.live") == "live",
        10,
        "the page's live connection",
    )
    browser.execute_script("window.__sameDocument = true")


def same_document(browser: Any) -> bool:
    return bool(browser.execute_script("return window.__sameDocument === true"))


def history(dsn: str, schema: str, key: str) -> list[tuple[Any, ...]]:
    return query(
        dsn,
        schema,
        "SELECT token, outcome, pid FROM {schema}.job_runs WHERE job_key = %s ORDER BY run_id",
        (key,),
    )


def test_demo_scenario_shows_on_the_job_timeline_with_both_tokens_and_the_refused_write(
    dsn: str, schema: str, tmp_path: Path, browser: Any
) -> None:
    """A holds the job and is frozen (SIGSTOP) past its lease, B takes over with the next
    token, A resumes and its result write is refused: the open job page shows all of it."""
    from selenium.webdriver.common.by import By

    prepare(dsn, schema)
    env = tenure_env(dsn, schema, SCHED_SLOW="3", SCHED_TTL="1.5s")
    with worker_processes(2, "slow", env, tmp_path) as workers, ui_server(dsn, schema) as ui:
        open_live(browser, ui.url + "job?key=slow")
        done = run_tenure(["jobs", "trigger", "slow"], env)
        assert done.returncode == 0, done.stderr
        [(token_a, _, pid_a)] = wait_for(
            lambda: history(dsn, schema, "slow"), timeout=10, what="the run to start"
        )
        [a] = [w for w in workers if w.pid == pid_a]
        [b] = [w for w in workers if w.pid != pid_a]
        a.signal(signal.SIGSTOP)
        try:
            wait_for(
                lambda: len(history(dsn, schema, "slow")) == 2,
                timeout=15,
                what="B to take the job over",
            )
        finally:
            a.signal(signal.SIGCONT)
        rows = wait_for(
            lambda: (
                (h := history(dsn, schema, "slow"))
                and [r[1] for r in h] == ["stale_rejected", "succeeded"]
                and h
            ),
            timeout=20,
            what="A's write to be refused and B's run to succeed",
        )
        assert rows == [(token_a, "stale_rejected", a.pid), (token_a + 1, "succeeded", b.pid)]

        # The open page caught up by itself (no reload): both bars, the refused write.
        wait_until(
            browser,
            lambda d: (
                d.find_elements(By.CSS_SELECTOR, "svg.timeline .marker.refused")
                and d.find_elements(By.CSS_SELECTOR, 'svg.timeline .run[data-outcome="succeeded"]')
            ),
            10,
            "the timeline to show the refused write and B's run",
        )
        assert same_document(browser)
        bars = {
            int(el.get_attribute("data-token")): el.get_attribute("data-outcome")
            for el in browser.find_elements(By.CSS_SELECTOR, "svg.timeline .run")
        }
        assert bars == {token_a: "stale_rejected", token_a + 1: "succeeded"}
        labels = " ".join(
            el.text for el in browser.find_elements(By.CSS_SELECTOR, "svg.timeline .run text")
        )
        assert f"#{token_a}" in labels and f"#{token_a + 1}" in labels
        # A's bar is hatched from B's takeover on: it ran on without its lease.
        assert browser.find_elements(
            By.CSS_SELECTOR, f'svg.timeline .run[data-token="{token_a}"] .overtaken'
        )
        events = [el.text for el in browser.find_elements(By.CSS_SELECTOR, "ol.events li")]
        assert any(
            f"takeover: token {token_a}" in e and f"token {token_a + 1}" in e for e in events
        )
        assert any(
            f"write refused: token {token_a} is stale; token {token_a + 1} had taken over" in e
            for e in events
        ), events
        facts = browser.find_element(By.CSS_SELECTOR, "dl.facts").text
        assert f"written with token {token_a + 1}" in facts
        history_text = browser.find_element(By.CSS_SELECTOR, "table.history").text
        assert "stale fencing token" in history_text
        # Times are shown in the browser's zone, with UTC kept for hover.
        first_time = browser.find_element(By.CSS_SELECTOR, "dl.facts time")
        assert first_time.get_attribute("title").endswith("UTC")
        shot = os.environ.get("TENURE_UI_SCREENSHOT")
        if shot:
            browser.set_window_size(1280, 1000)
            browser.get(ui.url + "job?key=slow")
            wait_until(
                browser,
                lambda d: d.find_elements(By.CSS_SELECTOR, "svg.timeline .marker.refused"),
                10,
                "the page to render",
            )
            Path(shot).parent.mkdir(parents=True, exist_ok=True)
            assert browser.save_screenshot(shot)


def test_a_pause_from_another_connection_updates_the_open_page(
    dsn: str, schema: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    register_job(dsn, schema, "nightly/report")
    env = tenure_env(dsn, schema)
    with ui_server(dsn, schema) as ui:
        open_live(browser, ui.url + "job?key=" + quote("nightly/report", safe=""))
        state = browser.find_element(By.ID, "job-state")
        assert "idle" in state.text
        out = run_tenure(["jobs", "pause", "nightly/report"], env)  # another process
        assert out.returncode == 0, out.stderr
        wait_until(
            browser,
            lambda d: "paused" in d.find_element(By.ID, "job-state").text,
            5,
            "the open page to show the pause",
        )
        assert same_document(browser)
        assert int(browser.execute_script("return document.body.dataset.refreshes")) >= 1

        # The jobs page at phone width: no horizontal page scroll (tables scroll inside).
        browser.set_window_size(390, 844)
        try:
            browser.get(ui.url + "jobs")
            row = browser.find_element(By.CSS_SELECTOR, "table.jobs tbody tr")
            assert "nightly/report" in row.text and "paused" in row.text
            assert browser.execute_script(
                "return document.documentElement.scrollWidth <= window.innerWidth"
            )
            # Keyboard: the first Tab reaches the skip link, Enter moves to the content.
            browser.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
            active = browser.switch_to.active_element
            assert active.text == "Skip to content"
        finally:
            browser.set_window_size(1280, 900)


def test_under_wsgi_the_open_page_polls_and_still_shows_a_pause(
    dsn: str, schema: str, browser: Any
) -> None:
    """No event stream under WSGI (it would hold a server thread per open page): the page
    polls every 5 s instead, in place."""
    from selenium.webdriver.common.by import By

    from tenure.ui import wsgi_app

    register_job(dsn, schema, "report")
    app = wsgi_app(dsn, schema=schema)
    try:
        with wsgi_server(app, "/tenure") as url:
            browser.get(url + "job?key=report")
            wait_until(
                browser,
                lambda d: d.execute_script("return document.body.dataset.live") == "polling",
                5,
                "the page to fall back to polling",
            )
            browser.execute_script("window.__sameDocument = true")
            assert "idle" in browser.find_element(By.ID, "job-state").text
            out = run_tenure(["jobs", "pause", "report"], tenure_env(dsn, schema))
            assert out.returncode == 0, out.stderr
            wait_until(
                browser,
                lambda d: "paused" in d.find_element(By.ID, "job-state").text,
                12,
                "a poll to show the pause",
            )
            assert same_document(browser)
    finally:
        app.close()


def test_actions_in_the_browser_need_the_credential_and_carry_csrf(
    dsn: str, schema: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    register_job(dsn, schema)
    with ui_server(dsn, schema, "--actions", TENURE_UI_TOKEN=TOKEN) as ui:
        browser.get(ui.url + "job?key=report")
        # Refused with 401 (the browser asks for a password): no page, no action form.
        assert browser.find_elements(By.CSS_SELECTOR, "form.action") == []
        assert "report" not in browser.title
        authed = ui.url.replace("http://", f"http://ops:{TOKEN}@")
        open_live(browser, authed + "job?key=report")  # the event stream is authorised too
        browser.find_element(By.XPATH, "//form[contains(@action, '/action/pause')]//button").click()
        wait_until(
            browser,
            lambda d: "report: paused" in d.find_element(By.CSS_SELECTOR, ".notice").text,
            10,
            "the pause to be confirmed",
        )
        assert paused(dsn, schema, "report")


def test_live_refresh_keeps_what_is_typed_in_the_search_box_and_its_focus(
    dsn: str, schema: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    register_job(dsn, schema, "tenant-7/report")
    env = tenure_env(dsn, schema)
    with ui_server(dsn, schema) as ui:
        open_live(browser, ui.url + "jobs")
        box = browser.find_element(By.CSS_SELECTOR, "input[name=q]")
        box.click()
        box.send_keys("tenant-")
        before = int(browser.execute_script("return document.body.dataset.refreshes || '0'"))
        # Each pause and resume from another process is a change the open page reloads for.
        for command in ("pause", "resume", "pause"):
            out = run_tenure(["jobs", command, "tenant-7/report"], env)
            assert out.returncode == 0, out.stderr

        def refreshed_to_the_last_change(d: Any) -> bool:
            count = int(d.execute_script("return document.body.dataset.refreshes || '0'"))
            row = d.find_element(By.CSS_SELECTOR, "table.jobs tbody tr")
            return count >= before + 2 and "paused" in row.text

        # The page may refresh once per change or gather several: wait for the last one.
        wait_until(browser, refreshed_to_the_last_change, 20, "live refreshes to the last pause")
        assert same_document(browser)
        box = browser.find_element(By.CSS_SELECTOR, "input[name=q]")
        assert box.get_attribute("value") == "tenant-"
        assert browser.execute_script("return document.activeElement.name") == "q"
        assert browser.execute_script("return document.activeElement.selectionStart") == 7
        # A local time always carries the browser's zone (this browser's is UTC).
        shown = browser.find_element(By.CSS_SELECTOR, "table.jobs tbody time").text
        assert shown.endswith((" UTC", " GMT")), shown


def _luminance(css: str) -> float:
    """WCAG relative luminance of a computed ``rgb(...)``/``rgba(...)`` colour."""
    r, g, b = (int(v) / 255 for v in re.findall(r"[\d.]+", css)[:3])

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_dark_mode_follows_the_browsers_colour_scheme(browser: Any, dsn: str, schema: str) -> None:
    register_job(dsn, schema)
    seen = {}
    with ui_server(dsn, schema) as ui:
        try:
            for scheme in ("light", "dark"):
                browser.execute_cdp_cmd(
                    "Emulation.setEmulatedMedia",
                    {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
                )
                browser.get(ui.url + "job?key=report")
                seen[scheme] = browser.execute_script(
                    "const s = getComputedStyle(document.body);"
                    "const a = getComputedStyle(document.querySelector('nav a'));"
                    "const t = document.querySelector('svg.timeline .tick');"
                    "return [s.backgroundColor, s.color, a.color,"
                    " t ? getComputedStyle(t).fill : s.color,"
                    " matchMedia('(prefers-color-scheme: dark)').matches];"
                )
        finally:
            browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    light, dark = seen["light"], seen["dark"]
    assert light[4] is False and dark[4] is True, seen
    assert _luminance(light[0]) > 0.9 and _luminance(dark[0]) < 0.05, seen
    for bg, *inks, _ in (light, dark):  # text, links and axis labels stay readable (AA)
        for ink in inks:
            assert _contrast(bg, ink) >= 4.5, (bg, ink, seen)
