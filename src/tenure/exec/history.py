"""The run history of ``tenure exec`` (``exec_runs``), read by ``tenure status``: a row when
the command starts under its token, completed when it ends.

History, not a guarantee: a row that cannot be written is a warning, and the command runs
(or its outcome stands) regardless; once-per-slot rests on :mod:`.slots`, not on this. Each
write waits at most :data:`WAIT` seconds: with the database unreachable (the likely reason
a lease was lost), the history must not hold up the command or tenure exec's exit.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .output import say

if TYPE_CHECKING:
    from ..leases._sync.client import Client

log = logging.getLogger("tenure.exec")

#: Longest error text kept on a run (the full story is in the command's own output).
MAX_ERROR = 2000
#: Seconds a history write may take before tenure exec goes on without it.
WAIT = 2.0


def _bounded(write: Callable[[], Any], what: str) -> None:
    """Run ``write`` in a daemon thread for at most :data:`WAIT` seconds; warn on failure."""
    from ..errors import TenureError

    failed: list[str] = []

    def run() -> None:
        try:
            write()
        except TenureError as exc:
            failed.append(str(exc))

    thread = threading.Thread(target=run, name="tenure-exec-history", daemon=True)
    thread.start()
    thread.join(WAIT)
    if thread.is_alive():
        failed.append(f"the database did not answer within {WAIT:g}s")
    if failed:
        say(f"warning: {failed[0]}; {what}")


def record_start(client: Client, key: str, token: int, slot: str | None) -> None:
    _bounded(
        lambda: client.fetch(
            "exec_run_start",
            {
                "job_key": key,
                "token": token,
                "slot": slot,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            },
            doing=f"recording the start of {key!r} token {token} in the exec history",
            wrote=True,
        ),
        "the command runs; `tenure status` will not show this run",
    )


def record_finish(
    client: Client, key: str, token: int, outcome: str, exit_code: int, error: str | None
) -> None:
    _bounded(
        lambda: client.fetch(
            "exec_run_finish",
            {
                "job_key": key,
                "token": token,
                "outcome": outcome,
                "exit_code": exit_code,
                "error": None if error is None else error[:MAX_ERROR],
            },
            doing=f"recording the outcome of {key!r} token {token} in the exec history",
            wrote=True,
        ),
        "`tenure status` will show this run as unfinished",
    )


#: Rows one opportunistic prune statement deletes, and the most statements per table per
#: run: a run adds one row, so any run rate is outpaced while each exec pays a few ms.
PRUNE_BATCH = 1000
PRUNE_BATCHES = 2


def prune_history(client: Client, retention: float) -> None:
    """After a run: delete a bounded amount of exec history older than ``retention``
    seconds (see :mod:`tenure.db.retention`), for at most :data:`WAIT` seconds. Quiet: a
    role without DELETE on the history (or a schema not migrated yet) is logged at debug
    level, and the run's outcome stands regardless."""
    from ..db.pruning import describe, prune
    from ..db.retention import EXEC_TABLES, Retention
    from ..errors import TenureError

    def run() -> None:
        failed: dict[str, TenureError] = {}
        counts = prune(
            client,
            Retention.of(retention),
            tables=EXEC_TABLES,
            batch=PRUNE_BATCH,
            max_batches=PRUNE_BATCHES,
            failed=failed,
        )
        if any(counts.values()):
            log.info("pruned exec history: %s", describe(counts))
        for name, exc in failed.items():
            log.debug("could not prune %s: %s", name, exc)

    thread = threading.Thread(target=run, name="tenure-exec-prune", daemon=True)
    thread.start()
    thread.join(WAIT)
