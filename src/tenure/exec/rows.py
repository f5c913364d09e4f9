"""The rows of ``tenure exec``'s statements (``db/sql/exec.sql``), named as the statements
name their columns (:mod:`tenure.db.rows`)."""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from ..db.rows import row_of


@row_of("exec_slot_check")
class SlotCheckRow(NamedTuple):
    """The slot ``exec_slot_check`` named and what the database knows of it."""

    slot: str
    token: int | None
    completed_at: dt.datetime | None
    open_until: dt.datetime | None
    can_record: bool
    role: str
