"""The web dashboard (``tenure ui``): jobs, leases, takeovers and refused writes, live.

Needs the ``ui`` extra (``pip install 'tenure[ui]'``): Starlette, Jinja2 and, to serve it
standalone, uvicorn. :class:`Dashboard` is mountable in any ASGI application, and
:func:`wsgi_app` in any WSGI one (Django, Flask; through a2wsgi).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from ..errors import ConfigurationError

    raise ConfigurationError(
        f"the dashboard needs the ui extra ({exc.name} is missing): pip install 'tenure[ui]'"
    ) from None

from .app import Dashboard, create_app
from .wsgi import wsgi_app

__all__ = ["Dashboard", "create_app", "wsgi_app"]
