"""A small HTTP endpoint for monitoring: ``/metrics``, ``/healthz`` and ``/readyz``.

``tenure worker --metrics-port 9464`` and ``tenure relay --metrics-port 9465`` serve it
(bound to 127.0.0.1 unless ``--metrics-host`` says otherwise); a program of your own calls
:func:`serve`, or mounts :class:`App` (a WSGI application) in its own server. What each
path answers is described in :mod:`.exporter`.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .. import metrics
from ..errors import ConfigurationError
from .exporter import Database, DatabaseCollector, exposition_registry

log = logging.getLogger("tenure.observe")

DEFAULT_HOST = "127.0.0.1"
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class App:
    """The WSGI application: ``/metrics`` (``registry``), ``/healthz``, ``/readyz`` (``db``;
    without one, ready whenever alive)."""

    def __init__(self, registry: Any, db: Database | None) -> None:
        self.registry = registry
        self.db = db

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "/")
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _reply(start_response, "405 Method Not Allowed", b"GET only\n")
        if path == "/metrics":
            from prometheus_client.exposition import choose_encoder

            encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
            return _reply(start_response, "200 OK", encoder(self.registry), content_type)
        if path == "/healthz":
            return _reply(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            if self.db is None:
                return _reply(start_response, "200 OK", b"ready\n")
            ready = self.db.readiness()
            status = "200 OK" if ready.ready else "503 Service Unavailable"
            word = "ready" if ready.ready else "not ready"
            return _reply(start_response, status, f"{word}: {ready.reason}\n".encode())
        return _reply(
            start_response, "404 Not Found", b"not found: try /metrics, /healthz or /readyz\n"
        )


def _reply(
    start_response: Callable[..., Any],
    status: str,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]


@functools.cache
def _server_classes() -> tuple[type[Any], type[Any], type[Any]]:
    """The HTTP server classes, built on first use: every `tenure` command imports this
    module, and http.server is not free to import."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a slow scraper never keeps a stopping process alive
        allow_reuse_address = True

    class Server6(Server):
        address_family = socket.AF_INET6

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug("metrics server: " + format, *args)

    return Server, Server6, QuietHandler


class MetricsServer:
    """The HTTP server, on a daemon thread. ``port=0`` picks a free port (see :attr:`port`)."""

    def __init__(self, app: WsgiApp, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.app = app
        self.host = host
        from wsgiref.simple_server import make_server

        server, server6, handler = _server_classes()
        try:
            self._server = make_server(
                host,
                port,
                app,
                server_class=server6 if ":" in host else server,
                handler_class=handler,
            )
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; choose another "
                "--metrics-port (0: any free port) or --metrics-host"
            ) from None
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="tenure-metrics",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start() if not self._thread.is_alive() else self

    def __exit__(self, *exc: object) -> None:
        self.close()


def exporter_app(*, dsn: str | None, schema: str) -> App:
    """Export tenure's metrics (installing the Prometheus sink) and build the WSGI application
    answering ``/metrics``, ``/healthz`` and ``/readyz`` for ``schema``, to serve on a server
    of your own (:func:`serve` starts one)."""
    metrics.install_prometheus()
    registry = exposition_registry()
    db = Database(dsn, schema)
    registry.register(DatabaseCollector(db))
    return App(registry, db)


def serve(
    *,
    dsn: str | None,
    schema: str,
    host: str = DEFAULT_HOST,
    port: int = 0,
) -> MetricsServer:
    """Export tenure's metrics (installing the Prometheus sink) and serve ``/metrics``,
    ``/healthz`` and ``/readyz`` for ``schema`` on ``host:port``, in a daemon thread."""
    app = exporter_app(dsn=dsn, schema=schema)
    server = MetricsServer(app, host, port).start()
    log.info(
        "metrics on %s/metrics (health: /healthz, /readyz) for schema %r on %s",
        server.url,
        schema,
        app.db.where if app.db is not None else "-",
    )
    return server
