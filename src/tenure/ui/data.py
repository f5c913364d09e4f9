"""Read-only access to tenure's tables for the dashboard: one small async pool, one READ ONLY
transaction with a statement timeout per page, values as frozen dataclasses."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..db.executor import typed
from ..db.queries import query
from ..db.rows import row_of
from ..db.timeouts import CONNECTION_KWARGS
from ..errors import DatabaseUnavailable, one_line
from ..scheduler._async.runtime import (
    get_schedule_async,
    list_schedules_async,
    schedule_changes_async,
)
from ..scheduler.definitions import ScheduleChange, ScheduleInfo
from ..scheduler.jobs import JOB_STATES as STATES
from ..scheduler.jobs import job_state
from ..scheduler.looplag import THRESHOLD
from ..scheduler.schedules import schedule_from_row
from .queries import ui_queries
from .rows import JobDetailRow, JobsPageRow

log = logging.getLogger("tenure.ui")

#: Bound on every dashboard statement: a page that cannot answer says so instead of hanging.
STATEMENT_TIMEOUT = 5.0
PAGE_SIZE = 50
#: The jobs page's filters: every state (scheduler.jobs.JOB_STATES), or all.
JOB_STATES = ("all", *STATES)
JOB_SORTS = ("key", "next", "last")
#: Zoom levels of the timeline (label, seconds).
WINDOWS: tuple[tuple[str, int], ...] = (
    ("1m", 60),
    ("5m", 300),
    ("15m", 900),
    ("1h", 3600),
    ("6h", 6 * 3600),
    ("1d", 86400),
    ("7d", 7 * 86400),
    ("28d", 28 * 86400),
)
#: Most runs drawn one by one on a timeline. A window with more is "dense": its plain
#: successes are drawn as a density strip (TIMELINE_BUCKETS columns) and only the notable
#: runs (failures, takeovers, refused writes...) get bars, the newest TIMELINE_LIMIT of them.
TIMELINE_LIMIT = 400
TIMELINE_BUCKETS = 200
#: Most slices of a throughput and lateness chart, and the narrowest (a short window has
#: fewer, so that a slice's rate is not one run blown up to a rate per minute).
CHART_SLICES = 60
CHART_MIN_STRIDE = dt.timedelta(seconds=10)
#: A loop lag marked on the workers page: the most a worker lets pass without its warning
#: (scheduler/looplag.py: a third of its shortest TTL, at most this).
LOOP_LAG_WARNING = THRESHOLD
#: A dense timeline's outcome classes (the density strip's colours).
OUTCOME_CLASS = {
    "succeeded": "ok",
    "running": "ok",
    "failed": "failed",
    "lease_lost": "fenced",
    "stale_rejected": "fenced",
}


@dataclass(frozen=True, slots=True)
class Overview:
    now: dt.datetime
    jobs_total: int
    paused: int
    running: int
    failing: int
    overdue: int
    quarantined: int
    idle: int
    leases_total: int
    leases_held: int
    stale: int
    lost: int
    failed: int
    runs: int
    window: str
    incidents: tuple[Incident, ...]
    topics: tuple[Topic, ...]
    execs: int = 0  # of ``runs``: `tenure exec` runs
    throughput: Throughput | None = None  # every job's runs of the window, per slice

    @property
    def dead(self) -> int:
        return sum(t.dead for t in self.topics)

    @property
    def backlog(self) -> int:
        return sum(t.pending for t in self.topics)

    @property
    def alerts(self) -> list[str]:
        """What the shipped alert rules (deploy/prometheus/alerts.yml) would fire on."""
        out = []
        if self.stale:
            out.append(f"{self.stale} stale-token rejection(s) in the last {self.window}")
        if self.lost:
            out.append(f"{self.lost} lost lease(s) in the last {self.window}")
        if self.quarantined:
            out.append(
                f"{self.quarantined} job(s) quarantined: their runs kept dying with their "
                "worker; fix, then resume"
            )
        if self.failing:
            out.append(f"{self.failing} job(s) whose last run failed")
        if self.overdue:
            out.append(f"{self.overdue} job(s) overdue: no worker claims them")
        if self.dead:
            out.append(f"{self.dead} dead outbox message(s)")
        for t in self.topics:
            if t.oldest_pending_age is not None and t.oldest_pending_age > 600:
                out.append(
                    f"outbox topic {t.topic!r}: oldest pending message is "
                    f"{t.oldest_pending_age / 60:.0f} min old"
                )
        return out


@row_of("ui_overview_incidents")  # built by position: Incident(*row)
@dataclass(frozen=True, slots=True)
class Incident:
    job_key: str
    token: int
    outcome: str
    at: dt.datetime
    worker: str
    error: str | None


@row_of("ui_outbox_topics")  # built by position: Topic(*row)
@dataclass(frozen=True, slots=True)
class Topic:
    topic: str
    pending: int
    dead: int
    oldest_pending_age: float | None


@row_of("ui_outbox_dead")  # built by position: DeadMessage(*row)
@dataclass(frozen=True, slots=True)
class DeadMessage:
    id: int
    topic: str
    key: str
    attempts: int
    last_error: str | None
    last_attempt_at: dt.datetime | None
    created_at: dt.datetime
    job_key: str | None
    token: int | None


@dataclass(frozen=True, slots=True)
class JobRow:
    job_key: str
    schedule: str
    timezone: str
    paused: bool
    next_slot: dt.datetime
    running: bool
    triggered: bool
    token: int | None
    lease_until: dt.datetime | None
    held: bool
    last_outcome: str | None
    last_at: dt.datetime | None
    last_token: int | None
    now: dt.datetime
    quarantined: bool = False
    #: No live worker of its app defines it (scheduler/presence.py).
    undefined: bool = False

    @property
    def state(self) -> str:
        return job_state(
            undefined=self.undefined,
            quarantined=self.quarantined,
            paused=self.paused,
            running=self.running,
            failed=self.last_outcome == "failed",
        )

    @property
    def seconds_left(self) -> float | None:
        if not self.held or self.lease_until is None:
            return None
        return max(0.0, (self.lease_until - self.now).total_seconds())


@row_of("ui_other_keys")  # built by position: OtherKey(*row)
@dataclass(frozen=True, slots=True)
class OtherKey:
    """A key with a lease and no schedule: a `tenure exec` command or a bare library lease."""

    job_key: str
    token: int
    lease_until: dt.datetime
    held: bool
    acquired_at: dt.datetime
    last_outcome: str | None  # of its newest `tenure exec` run; None: a library lease
    last_at: dt.datetime | None
    last_token: int | None
    now: dt.datetime
    total: int = 0

    @property
    def seconds_left(self) -> float | None:
        if not self.held:
            return None
        return max(0.0, (self.lease_until - self.now).total_seconds())


@row_of("ui_workers")  # built by position: Worker(*row)
@dataclass(frozen=True, slots=True)
class Worker:
    """A worker seen in the window's runs, running something now, or present (migration
    13's scheduler_workers row)."""

    worker: str
    app: str | None  # None: no presence row (an older worker, or its row is gone)
    host: str | None
    pid: int | None
    seen_until: dt.datetime | None
    alive: bool
    defines: int | None
    runs: int
    failed: int
    fenced: int
    last_at: dt.datetime | None
    running: list[str]
    # Its last presence beat's (migration 17): the longest its event loop was blocked since
    # the beat before (seconds), and whether it was saturated. None: no beat says.
    loop_lag: float | None
    saturated: bool | None
    now: dt.datetime

    @property
    def lagging(self) -> bool:
        """A loop lag the worker itself warns about (scheduler/looplag.py's threshold)."""
        return self.loop_lag is not None and self.loop_lag >= LOOP_LAG_WARNING


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: tuple[JobRow, ...]
    total: int
    page: int
    pages: int
    state: str
    sort: str
    desc: bool
    search: str | None
    others: tuple[OtherKey, ...] = ()  # keys with a lease and no schedule (state "all")


@row_of("ui_timeline", "ui_history")  # built by position: Run(*row)
@dataclass(frozen=True, slots=True)
class Run:
    run_id: int
    slot: dt.datetime
    kind: str
    attempt: int
    token: int
    worker: str
    host: str
    pid: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    outcome: str
    error: str | None
    recorded_at: dt.datetime

    @property
    def lateness(self) -> float | None:
        """Seconds between the slot and the run's start (scheduled runs)."""
        if self.started_at is None or self.kind != "scheduled":
            return None
        return (self.started_at - self.slot).total_seconds()


@dataclass(frozen=True, slots=True)
class Bucket:
    """A slice of a dense timeline: how many runs were recorded in it, by outcome class."""

    start: dt.datetime
    end: dt.datetime
    runs: int
    ok: int
    failed: int
    fenced: int  # lease lost or write refused
    other: int  # cancelled, abandoned, skipped
    late: float | None = None  # the worst lateness of a scheduled run in it (seconds)


@row_of("ui_throughput_job", "ui_throughput_all")  # built by position: Rate(*row)
@dataclass(frozen=True, slots=True)
class Rate:
    """Runs started in one slice of a chart (``bin`` its start; None: the whole window), and
    the median and 99th percentile of its scheduled runs' lateness (seconds; None: none)."""

    bin: dt.datetime | None
    runs: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class Throughput:
    """The throughput and lateness charts' data: ``slices`` of ``stride`` from ``since`` to
    ``until`` (only those with runs), and ``total`` for the whole window."""

    since: dt.datetime
    until: dt.datetime
    stride: dt.timedelta
    slices: tuple[Rate, ...]
    total: Rate

    def per_minute(self, runs: int, width: dt.timedelta | None = None) -> float:
        """``runs`` over ``width`` (a slice's stride; the whole window by default), per minute."""
        seconds = (width or (self.until - self.since)).total_seconds()
        return runs * 60.0 / max(seconds, 1e-6)


def chart_stride(since: dt.datetime, until: dt.datetime) -> dt.timedelta:
    """Slices of whole microseconds, at most CHART_SLICES over the window, none narrower than
    CHART_MIN_STRIDE."""
    span_us = math.ceil((until - since) / dt.timedelta(microseconds=1))
    return max(CHART_MIN_STRIDE, dt.timedelta(microseconds=max(1, -(-span_us // CHART_SLICES))))


@dataclass(frozen=True, slots=True)
class TimelineData:
    since: dt.datetime
    runs: tuple[Run, ...]
    density: tuple[Bucket, ...]  # empty unless the window is dense
    history: tuple[Run, ...]

    @property
    def dense(self) -> bool:
        return bool(self.density)


@dataclass(frozen=True, slots=True)
class Job:
    job_key: str
    scheduled: bool
    schedule: str | None
    timezone: str | None
    ttl: dt.timedelta | None
    paused: bool
    paused_at: dt.datetime | None
    next_slot: dt.datetime | None
    running_slot: dt.datetime | None
    running_token: int | None
    trigger_at: dt.datetime | None
    defined_by: str | None
    defined_at: dt.datetime | None
    revision: int | None
    token: int | None
    owner: uuid.UUID | None
    lease_until: dt.datetime | None
    held: bool
    acquired_at: dt.datetime | None
    fence_token: int | None
    fenced_token: int | None
    fenced_at: dt.datetime | None
    result_token: int | None
    result_written_at: dt.datetime | None
    result_payload: str | None
    now: dt.datetime
    quarantined_at: dt.datetime | None = None
    quarantine_reason: str | None = None
    crash_streak: int | None = None
    app: str | None = None

    @property
    def seconds_left(self) -> float | None:
        if not self.held or self.lease_until is None:
            return None
        return max(0.0, (self.lease_until - self.now).total_seconds())


@dataclass(frozen=True, slots=True)
class LeaseRow:
    job_key: str
    owner: uuid.UUID
    token: int
    lease_until: dt.datetime
    held: bool
    seconds_left: float
    ttl: dt.timedelta
    acquired_at: dt.datetime
    renewed_at: dt.datetime
    scheduled: bool


@dataclass(frozen=True, slots=True)
class LeasePage:
    rows: tuple[LeaseRow, ...]
    total: int
    page: int
    pages: int
    search: str | None
    now: dt.datetime


@row_of("ui_lease_events")  # built by position: LeaseEvent(*row)
@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """One of a key's lease events (migration 18): a takeover ('acquired', the token it got)
    or a refused write ('refused', the token refused and what refused it)."""

    id: int
    token: int
    event: str
    at: dt.datetime
    detail: str | None


def lease_runs(job: Job, events: Sequence[LeaseEvent]) -> tuple[Run, ...]:
    """A key without run history (a bare library lease) drawn from its lease events: each
    token from its takeover to the next takeover (the newest: to its lease's expiry, or
    now). A token whose write was refused is drawn as the scheduler draws a stale run
    (``stale_rejected``), until its last refused write. Without events (pruned, or taken
    before migration 18) the lease row's newest token is all there is (:func:`lease_run`)."""
    taken = sorted((e for e in events if e.event == "acquired"), key=lambda e: (e.at, e.id))
    refused: dict[int, list[LeaseEvent]] = {}
    for e in sorted(events, key=lambda e: (e.at, e.id)):
        if e.event == "refused":
            refused.setdefault(e.token, []).append(e)
    runs: list[Run] = []
    owner = str(job.owner)[:8] if job.owner is not None else "-"
    for i, e in enumerate(taken):
        if i + 1 < len(taken):
            end = taken[i + 1].at
        elif e.token == job.token and job.lease_until is not None:
            end = max(e.at, min(job.lease_until, job.now))
        else:
            end = e.at
        runs.append(_lease_event_run(e.id, e.token, e.at, end, refused.pop(e.token, [])))
    for token, rows in refused.items():  # refused tokens whose takeover is not in the window
        runs.append(_lease_event_run(rows[0].id, token, rows[0].at, rows[0].at, rows))
    if job.token is not None and all(r.token != job.token for r in runs):
        newest = lease_run(job)
        if newest is not None:
            runs.append(newest)
    if runs and job.token is not None:
        # The newest holder's owner is known from the lease row; the others' are not.
        runs = [r if r.token != job.token else replace(r, worker=owner) for r in runs]
    return tuple(sorted(runs, key=lambda r: (r.started_at or r.slot, r.token)))


def _lease_event_run(
    ident: int, token: int, start: dt.datetime, end: dt.datetime, refused: Sequence[LeaseEvent]
) -> Run:
    error = None
    if refused:
        end = max(end, refused[-1].at)
        error = "; ".join(
            f"{e.detail or 'write'} refused at {e.at.astimezone(dt.UTC):%H:%M:%S.%f}"[:-3] + " UTC"
            for e in refused[:10]
        ) + (f"; and {len(refused) - 10} more" if len(refused) > 10 else "")
    return Run(
        run_id=-ident,
        slot=start,
        kind="lease",
        attempt=1,
        token=token,
        worker="-",
        host="-",
        pid=0,
        started_at=start,
        finished_at=end,
        outcome="stale_rejected" if refused else "lease",
        error=error,
        recorded_at=start,
    )


def lease_run(job: Job) -> Run | None:
    """A key without run history (a bare library lease) drawn from its lease row: the
    newest holder's token from its acquisition to its expiry (or now). Its predecessors'
    tokens are all that is known of them: the table keeps the newest lease only."""
    if job.token is None or job.acquired_at is None or job.lease_until is None:
        return None
    return Run(
        run_id=0,
        slot=job.acquired_at,
        kind="lease",
        attempt=1,
        token=job.token,
        worker=str(job.owner)[:8],
        host="-",
        pid=0,
        started_at=job.acquired_at,
        finished_at=min(job.lease_until, job.now),
        outcome="lease",
        error=None,
        recorded_at=job.acquired_at,
    )


def _describe(key: str, cron: str | None, every: dt.timedelta | None, tz: str) -> str:
    try:
        return schedule_from_row(key, cron, every, tz).describe()
    except Exception:  # a definition this version cannot parse still gets listed
        return cron or str(every)


#: Runtime schedules per page of the dashboard.
SCHEDULES_PAGE = 50


class Reader:
    """The dashboard's database access. The pool opens on first use (so the app can be
    mounted without lifespan events) and closes with :meth:`close`."""

    def __init__(self, conninfo: str, schema: str, *, max_size: int = 4) -> None:
        self.schema = schema
        self._q = ui_queries(schema)
        self._readers: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] | None = None
        self._conninfo = conninfo
        self._max_size = max_size
        self._lock = asyncio.Lock()

    async def _open(self) -> AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]]:
        async with self._lock:
            if self._readers is None:
                pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] = (
                    AsyncConnectionPool(
                        self._conninfo,
                        min_size=1,
                        max_size=self._max_size,
                        kwargs={
                            **CONNECTION_KWARGS,
                            "application_name": "tenure ui",
                            "prepare_threshold": None,
                        },
                        open=False,
                        name="tenure-ui",
                        timeout=STATEMENT_TIMEOUT,
                    )
                )
                await pool.open()
                self._readers = pool
            return self._readers

    async def close(self) -> None:
        if self._readers is not None:
            await self._readers.close()
            self._readers = None

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[psycopg.AsyncConnection[tuple[Any, ...]]]:
        pool = await self._open()
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(b"SET TRANSACTION READ ONLY")
                await conn.execute(
                    b"SELECT set_config('statement_timeout', %s, true)",
                    (f"{round(STATEMENT_TIMEOUT * 1000)}ms",),
                )
                yield conn
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(
                f"the dashboard could not read the database: {one_line(str(exc))}"
            ) from exc
        except PoolTimeout as exc:
            raise DatabaseUnavailable(
                "the dashboard cannot get a database connection (pool timeout)"
            ) from exc

    async def _all(
        self, conn: psycopg.AsyncConnection[Any], name: str, params: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        cur = await conn.execute(self._q[name], params or {})
        return await cur.fetchall()

    async def overview(self, window: str = "15m", seconds: int = 900) -> Overview:
        interval = dt.timedelta(seconds=seconds)
        async with self._session() as conn:
            [(now,)] = await self._all(conn, "ui_clock")
            [(total, paused, running, failing, overdue, quarantined)] = await self._all(
                conn, "ui_overview_jobs"
            )
            [(leases, held)] = await self._all(conn, "ui_overview_leases")
            since = {"since": now - interval}
            [(stale, lost, failed, runs, execs)] = await self._all(
                conn, "ui_overview_events", since
            )
            incidents = await self._all(conn, "ui_overview_incidents", since)
            topics = await self._all(conn, "ui_outbox_topics")
            throughput = await self._throughput(conn, None, now - interval, now)
        return Overview(
            now=now,
            jobs_total=total,
            paused=paused,
            running=running,
            failing=failing,
            overdue=overdue,
            quarantined=quarantined,
            idle=max(0, total - quarantined - paused - running - failing),
            leases_total=leases,
            leases_held=held,
            stale=stale,
            lost=lost,
            failed=failed,
            runs=runs,
            window=window,
            incidents=tuple(Incident(*row) for row in incidents),
            topics=tuple(Topic(*row) for row in topics),
            execs=execs,
            throughput=throughput,
        )

    async def throughput(self, job_key: str, since: dt.datetime, until: dt.datetime) -> Throughput:
        """``job_key``'s runs per slice of the window and their lateness (its page's charts)."""
        async with self._session() as conn:
            return await self._throughput(conn, job_key, since, until)

    async def _throughput(
        self,
        conn: psycopg.AsyncConnection[Any],
        job_key: str | None,
        since: dt.datetime,
        until: dt.datetime,
    ) -> Throughput:
        stride = chart_stride(since, until)
        params: dict[str, Any] = {
            "since": since,
            "until": until,
            "stride": stride,
            "limit": CHART_SLICES + 2,  # the slices, and the whole window's row
        }
        if job_key is None:
            rows = await self._all(conn, "ui_throughput_all", params)
        else:
            rows = await self._all(conn, "ui_throughput_job", {**params, "job_key": job_key})
        rates = [Rate(*row) for row in rows]
        total = next((r for r in rates if r.bin is None), Rate(None, 0, None, None))
        slices = tuple(r for r in rates if r.bin is not None)
        return Throughput(since, until, stride, slices, total)

    async def jobs(
        self,
        *,
        state: str = "all",
        sort: str = "key",
        desc: bool = False,
        search: str | None = None,
        page: int = 1,
    ) -> JobPage:
        name = (
            "ui_jobs_by_last"
            if state in ("failing", "idle") or sort == "last"
            else ("ui_jobs_page")
        )
        params = {
            "state": state,
            "sort": sort,
            "desc": desc,
            "search": search or None,
            "limit": PAGE_SIZE,
            "offset": (page - 1) * PAGE_SIZE,
        }
        async with self._session() as conn:
            rows = typed(await self._all(conn, name, params), JobsPageRow)
            undefined: set[str] = set()
            if rows:  # the scheduler's own statement (scheduler/presence.py): a few keys
                cur = await conn.execute(query(self.schema, "sched_undefined"))
                undefined = {r[0] for r in await cur.fetchall()}
            others: tuple[OtherKey, ...] = ()
            if state == "all":
                others = tuple(
                    OtherKey(*row)
                    for row in await self._all(
                        conn, "ui_other_keys", {"search": search or None, "limit": PAGE_SIZE}
                    )
                )
        total = rows[0].total if rows else 0
        out = tuple(
            JobRow(
                r.job_key,
                _describe(r.job_key, r.cron, r.every, r.timezone),
                r.timezone,
                r.paused,
                r.next_slot,
                r.running_slot is not None,
                r.triggered,
                r.fencing_token,
                r.lease_until,
                r.held,
                r.outcome,
                r.finished_at,
                r.token,
                r.now,
                r.quarantined_at is not None,
                r.job_key in undefined,
            )
            for r in rows
        )
        pages = max(1, math.ceil(total / PAGE_SIZE))
        return JobPage(out, total, page, pages, state, sort, desc, search, others)

    async def job(self, job_key: str) -> Job | None:
        async with self._session() as conn:
            rows = typed(await self._all(conn, "ui_job", {"job_key": job_key}), JobDetailRow)
        if not rows:
            return None
        r = rows[0]
        schedule = None
        if r.scheduled and r.timezone is not None:  # a scheduled job has its zone
            schedule = _describe(r.job_key, r.cron, r.every, r.timezone)
        return Job(
            job_key=r.job_key,
            scheduled=r.scheduled,
            schedule=schedule,
            timezone=r.timezone,
            ttl=r.ttl,
            paused=bool(r.paused),
            paused_at=r.paused_at,
            next_slot=r.next_slot,
            running_slot=r.running_slot,
            running_token=r.running_token,
            trigger_at=r.trigger_at,
            defined_by=r.defined_by,
            defined_at=r.defined_at,
            revision=r.revision,
            token=r.fencing_token,
            owner=r.lease_owner,
            lease_until=r.lease_until,
            held=r.held,
            acquired_at=r.acquired_at,
            fence_token=r.fence_token,
            fenced_token=r.fenced_token,
            fenced_at=r.fenced_at,
            result_token=r.applied_fencing_token,
            result_written_at=r.written_at,
            result_payload=r.payload,
            now=r.now,
            quarantined_at=r.quarantined_at,
            quarantine_reason=r.quarantine_reason,
            crash_streak=r.crash_streak,
            app=r.app,
        )

    async def timeline(
        self, job_key: str, since: dt.datetime | None, now: dt.datetime, *, history: int = 50
    ) -> TimelineData:
        """The window's runs (oldest first), or for a dense window its notable runs and a
        density strip, and the newest ``history`` runs. ``since=None``: fit the window to
        the runs in that history."""
        async with self._session() as conn:
            newest = tuple(
                Run(*row)
                for row in await self._all(
                    conn, "ui_history", {"job_key": job_key, "limit": history}
                )
            )
            if since is None:
                starts = [r.started_at or r.recorded_at for r in newest]
                first = min(starts, default=now - dt.timedelta(minutes=1))
                margin = max(dt.timedelta(seconds=2), (now - first) / 20)
                since = min(first - margin, now - dt.timedelta(seconds=10))
            params: dict[str, Any] = {"job_key": job_key, "since": since}
            rows = await self._all(conn, "ui_timeline", {**params, "limit": TIMELINE_LIMIT + 1})
            density: tuple[Bucket, ...] = ()
            if len(rows) > TIMELINE_LIMIT:
                running = [row for row in rows if row[10] == "running"]
                # Slices of whole microseconds that cover the window (date_bin's stride).
                span_us = math.ceil((now - since) / dt.timedelta(microseconds=1))
                stride = dt.timedelta(microseconds=max(1, -(-span_us // TIMELINE_BUCKETS)))
                counts: dict[int, dict[str, int]] = {}
                notable: dict[int, tuple[Any, ...]] = {}
                lateness: dict[int, float] = {}
                for row in await self._all(
                    conn,
                    "ui_timeline_dense",
                    {**params, "stride": stride, "limit": TIMELINE_LIMIT},
                ):
                    if row[0] == "run":
                        notable[row[4]] = row[4:]
                        continue
                    index = round((row[1] - since) / stride)
                    if 0 <= index < TIMELINE_BUCKETS:  # not runs recorded after ``now``
                        per = counts.setdefault(index, {})
                        cls = OUTCOME_CLASS.get(row[14], "other")
                        per[cls] = per.get(cls, 0) + row[2]
                        if row[3] is not None and row[14] != "misfire_skipped":
                            worst = lateness.get(index)
                            lateness[index] = row[3] if worst is None else max(worst, row[3])
                for row in running:  # the run in progress, whenever it started
                    notable.setdefault(row[0], row)
                rows = [notable[run_id] for run_id in sorted(notable)]
                density = tuple(
                    Bucket(
                        since + index * stride,
                        min(now, since + (index + 1) * stride),
                        sum(per.values()),
                        per.get("ok", 0),
                        per.get("failed", 0),
                        per.get("fenced", 0),
                        per.get("other", 0),
                        lateness.get(index),
                    )
                    for index, per in sorted(counts.items())
                )
        return TimelineData(since, tuple(Run(*row) for row in rows), density, newest)

    async def lease_events(
        self, job_key: str, since: dt.datetime | None, *, limit: int = TIMELINE_LIMIT
    ) -> tuple[LeaseEvent, ...]:
        """``job_key``'s newest ``limit`` lease events since ``since`` (None: the newest),
        oldest first."""
        async with self._session() as conn:
            rows = await self._all(
                conn, "ui_lease_events", {"job_key": job_key, "since": since, "limit": limit}
            )
        return tuple(LeaseEvent(*row) for row in reversed(rows))

    async def leases(self, *, search: str | None = None, page: int = 1) -> LeasePage:
        params = {
            "search": search or None,
            "limit": PAGE_SIZE * 4,
            "offset": (page - 1) * PAGE_SIZE * 4,
        }
        async with self._session() as conn:
            rows = await self._all(conn, "ui_leases", params)
            [(now,)] = await self._all(conn, "ui_clock")
        total = rows[0][10] if rows else 0
        out = tuple(LeaseRow(*row[:10]) for row in rows)
        pages = max(1, math.ceil(total / (PAGE_SIZE * 4)))
        return LeasePage(out, total, page, pages, search, now)

    async def workers(self, seconds: int = 900) -> tuple[tuple[Worker, ...], dt.datetime]:
        """Every worker of the last ``seconds`` (runs recorded), running now, or present."""
        async with self._session() as conn:
            [(now,)] = await self._all(conn, "ui_clock")
            rows = await self._all(
                conn, "ui_workers", {"since": now - dt.timedelta(seconds=seconds)}
            )
        return tuple(Worker(*row) for row in rows), now

    async def outbox(
        self, *, dead_limit: int = 100
    ) -> tuple[tuple[Topic, ...], tuple[DeadMessage, ...], dt.datetime]:
        async with self._session() as conn:
            topics = await self._all(conn, "ui_outbox_topics")
            dead = await self._all(conn, "ui_outbox_dead", {"limit": dead_limit})
            [(now,)] = await self._all(conn, "ui_clock")
        return (
            tuple(Topic(*row) for row in topics),
            tuple(DeadMessage(*row) for row in dead),
            now,
        )

    # -- runtime schedules (issue 27): read with the scheduler's own statements -------------

    async def schedules(
        self, *, search: str | None, after: str, limit: int = SCHEDULES_PAGE
    ) -> list[ScheduleInfo]:
        async with self._session() as conn:
            return await list_schedules_async(
                conn, after=after, search=search, limit=limit, schema=self.schema
            )

    async def schedule(self, key: str) -> tuple[ScheduleInfo | None, list[ScheduleChange]]:
        async with self._session() as conn:
            info = await get_schedule_async(conn, key, schema=self.schema)
            changes = await schedule_changes_async(conn, key, limit=50, schema=self.schema)
        return info, changes
