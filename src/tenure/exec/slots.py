"""Once per slot, for ``tenure exec --slot/--every`` and ``@tenure.once``.

A slot is a name (``"2026-12-01T14:05:00Z"``, or a caller's own string). It counts as done
once a row for ``(job_key, slot)`` is in ``exec_slots``; that row is written in a transaction
fenced by the run's token, so only the current holder of the lease can complete a slot, and a
successor that took over meanwhile sees the row in its post-acquire check (see
``sql/exec.sql``).

Slot names from a period (``every``) are computed by the database clock: the latest multiple
of the period (epoch-aligned, UTC) at or before the clock plus an early tolerance (2 s by
default, at most half the period). Callers whose schedulers fire a moment before or any time
after the boundary share the slot, and no slot runs more than the tolerance early.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..db.queries import query
from ..errors import InvalidArgument, mapped
from ..validation import check_text
from .rows import SlotCheckRow

if TYPE_CHECKING:
    from ..leases._sync.client import Client
    from ..leases._sync.lease import Lease

log = logging.getLogger("tenure.exec")

#: Longest slot name a caller may give (``--slot``).
MAX_SLOT = 200


@dataclass(frozen=True, slots=True)
class SlotState:
    """A slot as the database sees it: its name (computed by the database for --every), which
    token completed it and when (database clock) if some run did, and whether this role may
    mark it done (``can_record``, with ``role`` to name it). ``open_until``: for a slot
    computed from a period, the end of its window (no run can name it after that, so
    retention may forget it); None for a slot named by the caller."""

    slot: str
    done_token: int | None
    done_at: dt.datetime | None
    can_record: bool
    role: str
    open_until: dt.datetime | None = None

    @property
    def done(self) -> bool:
        return self.done_token is not None

    def not_recordable(self, schema: str, key: str) -> str:
        """Why a run of this slot must not start (see ``can_record``)."""
        return (
            f"role {self.role!r} may not INSERT into {schema}.exec_slots, so slot "
            f"{self.slot!r} of {key!r} could never be marked done and would run again on "
            f"every host; not running it. Grant the privilege (`tenure grants --role "
            f"{self.role}` prints every statement tenure needs; `tenure doctor` names what "
            "is missing)"
        )


def check_period(seconds: float) -> int:
    """A slot period must be a whole number of seconds, at least 1 (the SQL rounds on it)."""
    if seconds < 1 or seconds != int(seconds):
        raise InvalidArgument(
            f"{seconds:g}s: the period must be a whole number of seconds, at least 1s"
        )
    return int(seconds)


def check_slot(value: object) -> str:
    """A slot name: text of 1 to :data:`MAX_SLOT` characters, valid UTF-8, without NUL."""
    return check_text(value, what="a slot", max_chars=MAX_SLOT)


#: How far before a slot's time (seconds) a call may already run it (``tenure exec --every``,
#: ``@tenure.once``): hosts whose cron fires a moment before the boundary share the slot
#: about to start, and no call runs a slot earlier than this. Capped at half the period.
EARLY_TOLERANCE = 2.0


def format_slot(instant: dt.datetime) -> str:
    """The name of a slot at ``instant``: UTC, whole seconds, as the SQL writes them."""
    return instant.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_state(
    client: Client,
    job_key: str,
    slot: str | None,
    every: int | None,
    early: float = EARLY_TOLERANCE,
) -> SlotState:
    """The slot (named by ``slot``, by the database clock to ``every`` seconds with an early
    tolerance of ``early`` seconds, or ``slot@time`` with both) and whether it already
    completed, in one round trip."""
    r = client.fetch(
        "exec_slot_check",
        {
            "job_key": job_key,
            "slot": slot,
            "every": every,
            "early": early,
            "schema": client.schema,
        },
        doing=f"checking the schedule slot of {job_key!r}",
        row=SlotCheckRow,
    )[0]
    return SlotState(r.slot, r.token, r.completed_at, bool(r.can_record), r.role, r.open_until)


def record_slot(
    client: Client,
    lease: Lease,
    slot: str,
    extra: dict[str, Any] | None = None,
    *,
    open_until: dt.datetime | None = None,
) -> None:
    """Mark ``slot`` done, in a transaction fenced by ``lease``'s token. ``open_until``: the
    end of the slot's window (:class:`SlotState`), None for a slot named by the caller (kept
    for good: it may be asked for again at any time).

    Raises :class:`~tenure.StaleTokenError` when the lease was taken over meanwhile (the slot
    may then run again), or another :class:`~tenure.TenureError` when the database fails.
    """
    doing = f"recording slot {slot!r} of {lease.job_key!r} as done"
    params: dict[str, Any] = {
        "job_key": lease.job_key,
        "slot": slot,
        "token": lease.token,
        "open_until": open_until,
    }
    with mapped(doing, wrote=True), client.fenced(lease.job_key, lease.token) as conn:
        conn.execute(query(client.schema, "exec_slot_done"), params)
    log.info("slot %r marked done", slot, extra=extra or {"job": lease.job_key})


__all__ = [
    "EARLY_TOLERANCE",
    "MAX_SLOT",
    "SlotState",
    "check_period",
    "check_slot",
    "format_slot",
    "record_slot",
    "slot_state",
]
