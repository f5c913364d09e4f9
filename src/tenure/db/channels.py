"""LISTEN/NOTIFY channel names, one per schema and purpose."""

from __future__ import annotations

import hashlib

#: PostgreSQL's limit for identifiers, channel names included.
MAX_IDENTIFIER = 63


def channel_name(prefix: str, schema: str) -> str:
    """``{prefix}_{schema}``, or the prefix with a hash of the schema when that would pass
    :data:`MAX_IDENTIFIER` bytes (PostgreSQL rejects longer channel names)."""
    name = f"{prefix}_{schema}"
    if len(name.encode("utf-8")) <= MAX_IDENTIFIER:
        return name
    return f"{prefix}_" + hashlib.sha256(schema.encode("utf-8")).hexdigest()[:32]


def lease_channel(schema: str) -> str:
    """Where a release of a lease in ``schema`` is announced (payload: the job key)."""
    return channel_name("tenure_leases", schema)
