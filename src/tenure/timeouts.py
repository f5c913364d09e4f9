"""Timeouts and connection settings for every connection tenure opens."""

from __future__ import annotations

from typing import Any

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
