"""Timeouts and connection settings for every connection tenure opens."""

from __future__ import annotations

import enum
import os
from typing import Any

from ..errors import ConfigurationError

# Settings for every connection tenure opens. Short statement and lock timeouts: no lease
# statement should ever wait long, and a paused holder must not block a takeover for more
# than lock_timeout. TCP keepalives and tcp_user_timeout make a dead network fail a query in
# seconds instead of hanging on kernel retransmissions.
CONNECTION_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "application_name": "tenure",
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
LOCK_TIMEOUT_MS = 2000
TIMEOUTS: dict[str, str] = {
    "statement_timeout": "5s",
    "lock_timeout": f"{LOCK_TIMEOUT_MS}ms",
    "idle_in_transaction_session_timeout": "30s",
}


def lock_timeout_ms(bound: float) -> str:
    """lock_timeout for one lease statement: tenure's default, lowered to ``bound`` seconds."""
    return f"{max(1, min(LOCK_TIMEOUT_MS, round(bound * 1000)))}ms"


class Unset(enum.Enum):
    """Marks an argument the caller did not give (so the environment decides)."""

    UNSET = "unset"


UNSET = Unset.UNSET


def prepare_threshold_from_env() -> int | None:
    """psycopg's prepare_threshold from ``$TENURE_PREPARE_THRESHOLD`` (``none``: never
    prepare, needed behind PgBouncer < 1.21 in transaction mode); default 5."""
    value = os.environ.get("TENURE_PREPARE_THRESHOLD", "").strip().lower()
    if not value:
        return 5
    if value in ("none", "off", "never"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(
            f"TENURE_PREPARE_THRESHOLD={value!r} is not a number or 'none'"
        ) from None
