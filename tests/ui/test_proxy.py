"""The dashboard behind a real nginx (Debian's) under /ops/tenure/: `tenure ui --root-path`,
and `--forwarded-allow-ips` for the proxy's X-Forwarded-* headers (believed only then)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.servers import free_port
from tests.support.ui import TOKEN, http, paused, register_job, ui_server
from tests.ui.test_ui import basic, csrf_and_cookie

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
pytestmark = pytest.mark.skipif(
    NGINX is None, reason="needs nginx (Debian: apt-get install nginx-light; scripts/test does)"
)
PREFIX = "/ops/tenure"


@contextmanager
def nginx(tmp: Path, upstream: str) -> Iterator[str]:
    """nginx in the foreground (no daemon, no service), proxying PREFIX/ to ``upstream``
    with the prefix stripped and the usual X-Forwarded-* headers; its base URL."""
    assert NGINX is not None
    port = free_port()
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"""{user}worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location {PREFIX}/ {{
            proxy_pass {upstream};
            proxy_buffering off;
            proxy_set_header X-Forwarded-Host $http_host;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Prefix {PREFIX};
        }}
    }}
}}
"""
    )
    log = tmp / "stderr.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [NGINX, "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        for _ in range(200):  # until it listens (or exits: its error is the failure)
            if proc.poll() is not None:
                raise AssertionError(f"nginx exited: {log.read_text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _page_under_prefix(url: str, auth: dict[str, str]) -> str:
    """The page at ``url``, asserting that each of its links and assets keeps the prefix."""
    page = http(url, headers=auth)
    assert page.status == 200, page
    links = re.findall(r'(?:href|src)="(/[^"]*)"', page.body)
    assert links and all(link.startswith(PREFIX + "/") for link in links), links
    return page.body


def test_root_path_behind_nginx(dsn: str, schema: str, tmp_path: Path) -> None:
    register_job(dsn, schema)
    with (
        ui_server(
            dsn, schema, "--root-path", PREFIX + "/", "--actions", TENURE_UI_TOKEN=TOKEN
        ) as ui,
        nginx(tmp_path, ui.url) as proxy,
    ):
        auth = basic(TOKEN)
        page = _page_under_prefix(f"{proxy}{PREFIX}/", auth)
        assert f'href="{PREFIX}/static/ui.css"' in page
        css = http(f"{proxy}{PREFIX}/static/ui.css", headers=auth)
        assert css.status == 200 and "svg.timeline" in css.body
        job = http(f"{proxy}{PREFIX}/job?key=report", headers=auth)
        assert job.status == 200 and "<h1>report</h1>" in job.body
        assert f"Path={PREFIX}" in job.headers.get("set-cookie", "")
        # The proxy's headers are not believed by default: its X-Forwarded-Host is ignored,
        # so a form posted through it (Origin: the proxy's host) is refused as cross-origin.
        csrf, cookie = csrf_and_cookie(proxy, f"{PREFIX}/job?key=report", auth)
        post = http(
            f"{proxy}{PREFIX}/action/pause",
            data=urllib.parse.urlencode({"target": "report", "csrf": csrf}).encode(),
            headers={**auth, "Cookie": cookie, "Origin": proxy},
        )
        assert post.status == 403 and "cross-origin" in post.body
        assert not paused(dsn, schema, "report")
        # Nor from a client that talks to the dashboard directly.
        direct = http(ui.url, headers={**auth, "X-Forwarded-Prefix": "/elsewhere"})
        assert direct.status == 200 and "/elsewhere" not in direct.body


def test_forwarded_headers_from_a_trusted_proxy(dsn: str, schema: str, tmp_path: Path) -> None:
    register_job(dsn, schema)
    with (
        ui_server(
            dsn,
            schema,
            "--actions",
            TENURE_UI_TOKEN=TOKEN,
            TENURE_UI_FORWARDED_ALLOW_IPS="127.0.0.1",
        ) as ui,
        nginx(tmp_path, ui.url) as proxy,
    ):
        auth = basic(TOKEN)
        _page_under_prefix(f"{proxy}{PREFIX}/jobs", auth)
        csrf, cookie = csrf_and_cookie(proxy, f"{PREFIX}/job?key=report", auth)
        post = http(
            f"{proxy}{PREFIX}/action/pause",
            data=urllib.parse.urlencode(
                {"target": "report", "csrf": csrf, "next": "/job?key=report"}
            ).encode(),
            headers={**auth, "Cookie": cookie, "Origin": proxy},
        )
        assert post.status == 303, post
        assert post.headers["location"].startswith(f"{PREFIX}/job?key=report"), post.headers
        assert paused(dsn, schema, "report")
