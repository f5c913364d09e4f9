"""The rows of the statements behind ``tenure status`` (``db/sql/status.sql``), named as the
statements name their columns (:mod:`tenure.db.rows`)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import NamedTuple

from ..db.rows import row_of


@row_of("status_jobs")
class StatusRow(NamedTuple):
    """One job key of ``status_jobs``: its lease, schedule, newest run (scheduler or exec),
    counts over the window, durations (p50, p95, p99) and result. The newest run's columns,
    ``slot`` to ``exit_code``, are all NULL when the key has no run (``started_at`` NULL);
    ``kind``, ``token`` and ``outcome`` are typed as a run has them."""

    job_key: str
    fencing_token: int | None
    lease_owner: uuid.UUID | None
    lease_until: dt.datetime | None
    held: bool
    seconds_left: float | None
    scheduled: bool
    paused: bool | None
    next_slot: dt.datetime | None
    slot: dt.datetime | None
    exec_slot: str | None
    kind: str
    token: int
    outcome: str
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    error: str | None
    exit_code: int | None
    runs: int
    failures: int
    lost_leases: int
    stale_rejections: int
    durations: list[float] | None
    applied_fencing_token: int | None
    written_at: dt.datetime | None
    now: dt.datetime
    quarantine_reason: str | None
