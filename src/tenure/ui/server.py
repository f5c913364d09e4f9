"""Serve the dashboard standalone (``tenure ui``) with uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from typing import Any

from ..errors import ConfigurationError
from .app import Dashboard

log = logging.getLogger("tenure.ui")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8484


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int, flags: str = "--port (0: any free port) or --host") -> socket.socket:
    """The listening socket (bound here, so that ``port=0`` can report the port it got).
    ``flags``: what to change, in the error (the command's own option names)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}; choose "
            f"another {flags}"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _server(app: Any) -> Any:
    try:
        import uvicorn
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigurationError(
            "serving the dashboard needs uvicorn: pip install 'tenure[ui]'"
        ) from None
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # Open event streams never end by themselves: give them a moment, then close.
        timeout_graceful_shutdown=2,
        proxy_headers=False,
    )
    return uvicorn.Server(config)


def serve(dashboard: Dashboard, sock: socket.socket) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then close the dashboard's pools."""
    _server(dashboard.app).run(sockets=[sock])


class BackgroundServer:
    """An ASGI app (the dashboard's, or one that also carries the metrics endpoints) on a
    daemon thread with its own event loop, beside a process's main work (``tenure worker
    --ui-port`` / ``--ui``): signals stay with the main thread."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        self.url = url_of(sock)
        self._sock = sock
        self._server = _server(app)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="tenure-ui", daemon=True
        )

    def start(self) -> BackgroundServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()
