"""The rows of the dashboard's statements (``ui/sql/ui.sql``), named as the statements name
their columns (:mod:`tenure.db.rows`; ``tests/db/test_row_types.py`` compares them)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import NamedTuple

from ..db.rows import row_of


@row_of("ui_jobs_page", "ui_jobs_by_last")
class JobsPageRow(NamedTuple):
    """One job of a page of the jobs list; ``total``: how many match, on every row."""

    job_key: str
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    paused: bool
    next_slot: dt.datetime
    running_slot: dt.datetime | None
    triggered: bool
    fencing_token: int | None
    lease_until: dt.datetime | None
    held: bool
    outcome: str | None
    finished_at: dt.datetime | None
    token: int | None
    total: int
    now: dt.datetime
    quarantined_at: dt.datetime | None


@row_of("ui_job")
class JobDetailRow(NamedTuple):
    """One key's page: its schedule (NULL unless ``scheduled``), lease, fence row and result."""

    job_key: str
    cron: str | None
    every: dt.timedelta | None
    timezone: str | None
    ttl: dt.timedelta | None
    paused: bool | None
    paused_at: dt.datetime | None
    next_slot: dt.datetime | None
    running_slot: dt.datetime | None
    running_token: int | None
    trigger_at: dt.datetime | None
    defined_by: str | None
    defined_at: dt.datetime | None
    revision: int | None
    fencing_token: int | None
    lease_owner: uuid.UUID | None
    lease_until: dt.datetime | None
    held: bool
    acquired_at: dt.datetime | None
    fence_token: int | None
    fenced_token: int | None
    fenced_at: dt.datetime | None
    applied_fencing_token: int | None
    written_at: dt.datetime | None
    payload: str | None
    scheduled: bool
    now: dt.datetime
    quarantined_at: dt.datetime | None
    quarantine_reason: str | None
    crash_streak: int | None
    app: str | None
