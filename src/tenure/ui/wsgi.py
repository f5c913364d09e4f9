"""The dashboard as a WSGI application, for Django, Flask or any WSGI server.

The dashboard is an ASGI application; :func:`wsgi_app` runs it behind a2wsgi's
``ASGIMiddleware``: one event loop on a daemon thread of its own carries the dashboard's
database pool, and each WSGI request (on whatever thread the server gives it) is handed to
that loop and waited for.

Live updates degrade to polling: under WSGI an open server-sent event stream holds a worker
(a thread, or a whole process with a sync server) for as long as the page stays open, so a
few open tabs could starve the application that mounts the dashboard. The pages poll every
5 s instead (``/events`` answers 204, which stops an EventSource from reconnecting).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigurationError
from .app import Dashboard


class WsgiDashboard:
    """A WSGI callable serving :attr:`dashboard`. :meth:`close` closes its database pools
    (at the end of the process; WSGI has no shutdown hook of its own)."""

    def __init__(self, dashboard: Dashboard) -> None:
        try:
            from a2wsgi import ASGIMiddleware
        except ImportError:  # pragma: no cover - depends on the environment
            raise ConfigurationError(
                "the dashboard under WSGI needs a2wsgi: pip install 'tenure[ui]'"
            ) from None
        self.dashboard = dashboard
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tenure-ui-wsgi", daemon=True
        )
        self._thread.start()
        self._middleware = ASGIMiddleware(dashboard.app, loop=self._loop)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        return self._middleware(environ, start_response)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.dashboard.close(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


def wsgi_app(
    dsn: str | None = None,
    *,
    schema: str = "tenure",
    actions: bool = False,
    credential: str | None = None,
) -> WsgiDashboard:
    """The dashboard for ``schema`` as a WSGI application (arguments as for
    :class:`~tenure.ui.Dashboard`). Mount it under a path prefix with your framework's
    dispatcher (the prefix arrives as ``SCRIPT_NAME``; links follow it)."""
    return WsgiDashboard(
        Dashboard(dsn, schema=schema, actions=actions, credential=credential, stream=False)
    )
