"""LISTEN/NOTIFY channel names: one function, one name per schema and purpose.

The SQL side spells the same rule: migration 6's trigger function builds the dashboard's
channel name the way :func:`channel` does, and every other statement that notifies gets its
channel name as a parameter computed here.
"""

from __future__ import annotations

import hashlib
from typing import Literal

#: PostgreSQL's limit for identifiers, channel names included.
MAX_IDENTIFIER = 63

#: What a channel announces: ``jobs``: the scheduler's (job definitions, pause, resume,
#: trigger, hand-overs); ``outbox``: a committed outbox message; ``ui``: the dashboard's (runs
#: that ended, were skipped or have been running a second); ``leases``: a released lease
#: (payload: the job key).
Purpose = Literal["jobs", "outbox", "ui", "leases"]


def channel(purpose: Purpose, schema: str) -> str:
    """``tenure_{purpose}_{schema}``, or ``tenure_{purpose}_`` with a hash of the schema when
    that would pass :data:`MAX_IDENTIFIER` bytes (PostgreSQL rejects longer channel names)."""
    prefix = f"tenure_{purpose}"
    name = f"{prefix}_{schema}"
    if len(name.encode("utf-8")) <= MAX_IDENTIFIER:
        return name
    return f"{prefix}_" + hashlib.sha256(schema.encode("utf-8")).hexdigest()[:32]
