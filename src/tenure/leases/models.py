"""Values that tenure returns: immutable snapshots of database state."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """The state of one job's lease as the database saw it (times are database times)."""

    job_key: str
    owner: uuid.UUID
    token: int
    expires_at: dt.datetime
    ttl: dt.timedelta
    acquired_at: dt.datetime
    renewed_at: dt.datetime
    observed_at: dt.datetime

    @property
    def held(self) -> bool:
        """True while the lease is unexpired by the database clock at ``observed_at``."""
        return self.expires_at >= self.observed_at

    @property
    def seconds_left(self) -> float:
        return max(0.0, (self.expires_at - self.observed_at).total_seconds())


@dataclass(frozen=True, slots=True)
class Result:
    """A stored result and the fencing token that wrote it."""

    job_key: str
    payload: Any
    token: int
    written_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Grant:
    """What acquire and renew learned: the token and the database's expiry."""

    token: int
    expires_at: dt.datetime
    acquired_at: dt.datetime | None = None
