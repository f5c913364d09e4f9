"""Once per slot for ``tenure exec --slot/--every``: whether a slot already completed on
some host (``exec_slot_check``), and marking it done in a transaction fenced by the run's
token (``exec_slot_done``), so a run that lost its lease cannot mark anything."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .output import say

if TYPE_CHECKING:
    from ..leases._sync.client import Client
    from ..leases._sync.lease import Lease

log = logging.getLogger("tenure.exec")

#: Longest --slot name.
MAX_SLOT = 200


def slot_state(
    client: Client, key: str, slot: str | None, every: int | None
) -> tuple[str, tuple[int, Any] | None]:
    """The slot (computed by the database for --every) and, if it completed, its
    ``(token, completed_at)``."""
    rows = client._fetch(
        "exec_slot_check",
        {"job_key": key, "slot": slot, "every": every},
        doing=f"checking the schedule slot of {key!r}",
    )
    name, token, completed_at = rows[0]
    return name, (None if token is None else (token, completed_at))


def record_slot(client: Client, lease: Lease, slot: str, extra: dict[str, Any]) -> None:
    """Mark the slot done, in a transaction fenced by the run's token."""
    from ..db.queries import query
    from ..errors import StaleTokenError, TenureError, mapped
    from ..leases._sync.fencing import fence

    try:
        doing = f"recording slot {slot!r} of {lease.job_key!r} as done"
        with mapped(doing, wrote=True), client._pool.connection() as conn, conn.transaction():
            fence(conn, lease.job_key, lease.token, schema=client.schema)
            conn.execute(
                query(client.schema, "exec_slot_done"),
                {"job_key": lease.job_key, "slot": slot, "token": lease.token},
            )
    except StaleTokenError:
        say(
            f"warning: the command succeeded but lease {lease.job_key!r} token {lease.token} "
            f"was lost before slot {slot!r} could be marked done; the slot may run again"
        )
    except TenureError as exc:
        say(f"warning: the command succeeded but slot {slot!r} was not marked done: {exc}")
    else:
        log.info("slot %r marked done", slot, extra=extra)
