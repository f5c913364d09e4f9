"""The lease core's rows (``db/sql/queries.sql``), named as the statements name their
columns (:mod:`tenure.db.rows`; ``tests/db/test_row_types.py`` compares them)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NamedTuple

from ..db.rows import row_of


@row_of("acquire")
class AcquireRow(NamedTuple):
    """The lease taken (``acquired``), or the holder's token and expiry; ``now`` is the
    database clock, for a busy answer's retry_after."""

    acquired: bool
    fencing_token: int
    lease_until: dt.datetime
    acquired_at: dt.datetime | None
    now: dt.datetime


@row_of("inspect", "leases")
class LeaseRow(NamedTuple):
    """One job's lease, held or expired, as :class:`~tenure.LeaseInfo` holds it."""

    job_key: str
    lease_owner: uuid.UUID
    fencing_token: int
    lease_until: dt.datetime
    lease_ttl: dt.timedelta
    acquired_at: dt.datetime
    renewed_at: dt.datetime
    now: dt.datetime


@row_of("result_get")
class ResultRow(NamedTuple):
    job_key: str
    payload: Any
    applied_fencing_token: int
    written_at: dt.datetime
