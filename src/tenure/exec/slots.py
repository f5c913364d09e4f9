"""Once per slot for ``tenure exec --slot/--every``: whether a slot already completed on
some host (``exec_slot_check``), and marking it done in a transaction fenced by the run's
token (``exec_slot_done``), so a run that lost its lease cannot mark anything."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..leases._sync.client import Client
    from ..leases._sync.lease import Lease

log = logging.getLogger("tenure.exec")

#: Longest --slot name.
MAX_SLOT = 200


def _not_recordable(role: str, schema: str, key: str, slot: str) -> Exception:
    from ..errors import ConfigurationError

    return ConfigurationError(
        f"role {role!r} may not INSERT into {schema}.exec_slots, so slot {slot!r} of {key!r} "
        "could never be marked done and would run again on every host; not running it. "
        f"Grant the privilege (`tenure grants --role {role}` prints every statement tenure "
        "needs; `tenure doctor` names what is missing)"
    )


def slot_state(
    client: Client, key: str, slot: str | None, every: int | None
) -> tuple[str, tuple[int, Any] | None]:
    """The slot (computed by the database for --every) and, if it completed, its
    ``(token, completed_at)``. Raises :class:`~tenure.ConfigurationError` when it has not
    completed and this role could not mark it done."""
    rows = client._fetch(
        "exec_slot_check",
        {"job_key": key, "slot": slot, "every": every, "schema": client.schema},
        doing=f"checking the schedule slot of {key!r}",
    )
    name, token, completed_at, can_record, role = rows[0]
    if token is not None:
        return name, (token, completed_at)
    if not can_record:
        raise _not_recordable(role, client.schema, key, name)
    return name, None


def record_slot(client: Client, lease: Lease, slot: str, extra: dict[str, Any]) -> None:
    """Mark the slot done, in a transaction fenced by the run's token. Raises
    :class:`~tenure.StaleTokenError` when the lease was lost first, another
    :class:`~tenure.TenureError` when the slot could not be written."""
    from ..db.queries import query
    from ..errors import mapped
    from ..leases._sync.fencing import fence

    doing = f"recording slot {slot!r} of {lease.job_key!r} as done"
    with mapped(doing, wrote=True), client._pool.connection() as conn, conn.transaction():
        fence(conn, lease.job_key, lease.token, schema=client.schema)
        conn.execute(
            query(client.schema, "exec_slot_done"),
            {"job_key": lease.job_key, "slot": slot, "token": lease.token},
        )
    log.info("slot %r marked done", slot, extra=extra)
