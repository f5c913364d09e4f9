"""Helpers for the dashboard tests: the real `tenure ui` in a child process, a real Chromium
(Debian's chromium + chromium-driver, driven by Selenium), plain HTTP requests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import tenure
from tenure.scheduler import jobs as ops
from tests.support.env import ROOT, tenure_env

TOKEN = "s3cret-token"
CHROMIUM = os.environ.get("TENURE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TENURE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")


@dataclass
class UiServer:
    url: str
    proc: subprocess.Popen[str]
    lines: list[str]

    def log(self) -> str:
        return "".join(self.lines)


@contextmanager
def ui_server(dsn: str, schema: str, *args: str, **env: str) -> Iterator[UiServer]:
    """``python -m tenure ui --port 0 ARGS`` until the block ends (SIGTERM, then wait)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure", "ui", "--port", "0", *args],
        cwd=ROOT,
        env=tenure_env(dsn, schema, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    url = None
    for line in proc.stderr:
        lines.append(line)
        if "dashboard on " in line:
            url = line.split("dashboard on ", 1)[1].split()[0]
            break
    if url is None:
        proc.wait(timeout=10)
        raise AssertionError(f"tenure ui did not start ({proc.returncode}):\n{''.join(lines)}")
    stderr = proc.stderr

    def drain() -> None:
        for rest in stderr:
            lines.append(rest)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield UiServer(url, proc, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
        stderr.close()


@dataclass(frozen=True)
class Reply:
    status: int
    body: str
    headers: dict[str, str]


def http(
    url: str,
    *,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> Reply:
    """One request, no redirects followed; any status is returned, not raised."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with opener.open(request, timeout=15) as resp:
            return Reply(resp.status, resp.read().decode(), dict(resp.headers))
    except urllib.error.HTTPError as err:
        with err:
            return Reply(err.code, err.read().decode(), dict(err.headers))


def chromium_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(path)):
            return f"{path} is not installed (scripts/test installs chromium and chromium-driver)"
    return None


def start_browser(width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium driven through chromedriver (both Debian's, never downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def register_job(dsn: str, schema: str, key: str = "report") -> None:
    """A scheduled job's row, as a worker's registration writes it (no worker runs it)."""
    app = tenure.Scheduler(dsn, schema=schema, migrate=True)
    app.add_job(key, lambda ctx: None, cron="0 0 1 1 *")
    app.register()


def paused(dsn: str, schema: str, key: str) -> bool:
    with tenure.connect(dsn, schema=schema) as client:
        [status] = [j for j in ops.list_jobs(client) if j.job_key == key]
    return status.paused


async def asgi_get(app: Any, path: str, query: str = "") -> tuple[int, str]:
    """One GET through an ASGI app in this process: (status, body)."""
    import asyncio

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    status = 0
    body = b""
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, body
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body += message.get("body", b"")

    await app(scope, receive, send)
    return status, body.decode()


@contextmanager
def wsgi_server(app: Any, prefix: str = "") -> Iterator[str]:
    """``app`` under ``prefix`` on the standard library's WSGI server (a thread per request,
    as a threaded WSGI server runs Django or Flask), on a free loopback port; its base URL."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
    from wsgiref.util import shift_path_info

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    parts = [p for p in prefix.split("/") if p]

    def dispatch(environ: dict[str, Any], start_response: Any) -> Any:
        # What a framework's mount does: the prefix moves from PATH_INFO to SCRIPT_NAME.
        for part in parts:
            if shift_path_info(environ) != part:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not mounted here\n"]
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, dispatch, server_class=Server, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{prefix}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
