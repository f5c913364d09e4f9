"""Once per slot for ``tenure exec --slot/--every``: whether a slot already completed on
some host (``exec_slot_check``), and marking it done in a transaction fenced by the run's
token (``exec_slot_done``), so a run that lost its lease cannot mark anything."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..leases._sync.client import Client
    from ..leases._sync.lease import Lease

log = logging.getLogger("tenure.exec")

#: Longest --slot name.
MAX_SLOT = 200


@dataclass(frozen=True, slots=True)
class SlotState:
    """A slot as the database sees it: its name (computed by the database for --every), its
    completion ``(token, completed_at)`` if it completed, and whether this role may mark it
    done (``can_record``, with ``role`` to name it)."""

    name: str
    done: tuple[int, Any] | None
    can_record: bool
    role: str

    def not_recordable(self, schema: str, key: str) -> str:
        """Why a run of this slot must not start (see ``can_record``)."""
        return (
            f"role {self.role!r} may not INSERT into {schema}.exec_slots, so slot "
            f"{self.name!r} of {key!r} could never be marked done and would run again on "
            f"every host; not running it. Grant the privilege (`tenure grants --role "
            f"{self.role}` prints every statement tenure needs; `tenure doctor` names what "
            "is missing)"
        )


def slot_state(client: Client, key: str, slot: str | None, every: int | None) -> SlotState:
    """The slot of this run and whether it already completed on some host, in one round
    trip."""
    rows = client._fetch(
        "exec_slot_check",
        {"job_key": key, "slot": slot, "every": every, "schema": client.schema},
        doing=f"checking the schedule slot of {key!r}",
    )
    name, token, completed_at, can_record, role = rows[0]
    done = None if token is None else (token, completed_at)
    return SlotState(name, done, bool(can_record), role)


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
