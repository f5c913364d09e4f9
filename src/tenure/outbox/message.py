"""One outbox message as the database saw it, and the states it goes through."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["pending", "delivered", "dead"]
STATES: tuple[State, ...] = ("pending", "delivered", "dead")


@dataclass(frozen=True, slots=True)
class Message:
    """One outbox message as the database saw it (times are database times).

    ``attempts`` counts claims by relays, including the one delivering it now (a handler sees
    1 on the first delivery). ``token`` and ``job_key`` say which fenced execution enqueued
    it, when the caller passed them.
    """

    id: int
    topic: str
    key: str
    payload: Any
    order_key: str | None
    job_key: str | None
    token: int | None
    state: State
    attempts: int
    created_at: dt.datetime
    available_at: dt.datetime
    last_error: str | None
    last_attempt_at: dt.datetime | None
    delivered_at: dt.datetime | None
    claimed_until: dt.datetime | None

    @property
    def idempotency_key(self) -> str:
        """``topic:key``: what a consumer deduplicates on (the webhook's Idempotency-Key)."""
        return f"{self.topic}:{self.key}"
