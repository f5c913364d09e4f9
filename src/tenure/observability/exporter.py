"""What the monitoring endpoint reads: the database side (readiness and a cached snapshot
of per-job and per-topic gauges) and the Prometheus registry that exposes them with the
process's own counters (:mod:`tenure.metrics`). Served by :mod:`.http`.

* ``/metrics``: the process's own counters and histograms (:mod:`tenure.metrics`: leases,
  renewals, stale-token rejections, job runs, lateness, outbox deliveries) plus gauges read
  from the database at scrape time (:class:`DatabaseCollector`: per scheduled job the age of
  its newest success and its slot interval, per outbox topic the backlog). Those are
  cluster-wide, the same from every process: aggregate them with ``max``, not ``sum``.
* ``/healthz``: 200 while the process is alive (and its HTTP thread answers).
* ``/readyz``: 200 when the database answers and tenure's schema is at least at the version
  this code expects (:func:`tenure.db.migrations.latest`), else 503 with the reason. A newer
  schema is ready: migrations are forward-only and applied before a rolling deploy, so the
  old processes must stay in service until they are replaced.

Database access uses a short-lived connection per probe or scrape (cached for a few
seconds), not the process's pool: a probe must not wait behind busy lease connections, and
a connection broken by a network fault is never reused.

Several processes, one endpoint (gunicorn): set ``PROMETHEUS_MULTIPROC_DIR`` to an empty
directory before the processes start, call :func:`tenure.metrics.install_prometheus` in each,
and serve :class:`App` from one of them, or mount it in the application;
:func:`exposition_registry` then merges every process's files as prometheus_client documents,
and gunicorn's ``child_exit`` hook should call
``prometheus_client.multiprocess.mark_process_dead(worker.pid)``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from ..db import migrations
from ..db.dsn import describe, redact, resolve
from ..db.queries import queries
from ..db.timeouts import CONNECTION_KWARGS
from ..errors import ConfigurationError, one_line
from ..validation import check_schema

log = logging.getLogger("tenure.observe")

#: Seconds a database snapshot serves scrapes (several Prometheus servers, or a dashboard
#: refreshing, do not each cost a query), and a readiness answer serves probes.
SNAPSHOT_CACHE = 5.0
READY_CACHE = 1.0
#: Bound on each probe or scrape query, and on connecting for it.
PROBE_TIMEOUT = 3.0
#: A cron job's interval is its largest gap between slots over at least this many slots and
#: this long a span (weekday-only or business-hours schedules have long gaps).
INTERVAL_SLOTS = 8
INTERVAL_SPAN = dt.timedelta(days=8)
INTERVAL_MAX_SLOTS = 5000


# -- the database side ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str
    schema_version: int | None
    expected: int


@dataclass(frozen=True, slots=True)
class JobGauges:
    job_key: str
    paused: bool
    interval: float | None
    last_success: float | None  # unix time (database clock) of the newest successful run
    since_success: float  # seconds without a success (a lower bound; see db/sql/observe.sql)
    quarantined: bool = False


@dataclass(frozen=True, slots=True)
class TopicGauges:
    topic: str
    pending: int
    dead: int
    oldest_pending_age: float | None
    unhandled: int = 0  # pending messages of this topic that no live relay handles


@dataclass(frozen=True, slots=True)
class Snapshot:
    up: bool
    schema_version: int | None = None
    jobs: tuple[JobGauges, ...] = ()
    topics: tuple[TopicGauges, ...] = ()
    error: str | None = None


class Database:
    """Readiness and scrape-time gauges from one schema, on short-lived connections."""

    def __init__(self, dsn: str | None, schema: str, *, timeout: float = PROBE_TIMEOUT) -> None:
        self.schema = check_schema(schema)
        self._conninfo, self.source = resolve(dsn)
        self.where = describe(self._conninfo)
        self.timeout = timeout
        self._queries = queries(schema)
        # Separate locks: a scrape stuck on a partitioned network must not hold up probes.
        self._ready_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._ready: tuple[float, Readiness] | None = None
        self._snapshot: tuple[float, Snapshot] | None = None
        self._intervals: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
        self._was_up = True

    def __repr__(self) -> str:
        return f"<Database {self.where} schema={self.schema!r}>"

    @contextlib.contextmanager
    def session(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        """One connection, one transaction bounded by the probe timeout (SET LOCAL: nothing
        outlives the transaction, also behind a transaction-pooling PgBouncer)."""
        kwargs = {
            **CONNECTION_KWARGS,
            "application_name": "tenure observe",
            "connect_timeout": max(2, math.ceil(self.timeout)),
            "prepare_threshold": None,
        }
        conn = psycopg.connect(self._conninfo, **kwargs)
        try:
            with conn.transaction():
                conn.execute(
                    b"SELECT set_config('statement_timeout', %s, true)",
                    (f"{round(self.timeout * 1000)}ms",),
                )
                yield conn
        finally:
            conn.close()

    def _run(
        self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        return conn.execute(self._queries[name], params or {}).fetchall()

    def _schema_version(self, conn: psycopg.Connection[Any]) -> int | None:
        [(exists,)] = self._run(
            conn, "observe_has_table", {"schema": self.schema, "table": "tenure_migrations"}
        )
        if not exists:
            return None
        [(version,)] = self._run(conn, "observe_schema_version")
        return None if version is None else int(version)

    def readiness(self) -> Readiness:
        """Is the database reachable, with tenure's schema at the expected version?"""
        with self._ready_lock:
            cached = self._ready
            if cached is not None and time.monotonic() - cached[0] < READY_CACHE:
                return cached[1]
            result = self._check_ready()
            self._ready = (time.monotonic(), result)
            return result

    def _check_ready(self) -> Readiness:
        expected = migrations.latest()
        try:
            with self.session() as conn:
                version = self._schema_version(conn)
        except psycopg.Error as exc:
            return Readiness(
                False, f"database {self.where} unreachable: {_one_line(exc)}", None, expected
            )
        if version is None:
            return Readiness(
                False,
                f"schema {self.schema!r} on {self.where} has no tenure tables; run "
                "`tenure migrate`",
                None,
                expected,
            )
        if version < expected:
            return Readiness(
                False,
                f"schema {self.schema!r} on {self.where} is at version {version}, this tenure "
                f"needs {expected}; run `tenure migrate`",
                version,
                expected,
            )
        newer = f" (newer than the {expected} this code expects)" if version > expected else ""
        reason = f"schema {self.schema!r} on {self.where} at version {version}{newer}"
        return Readiness(True, reason, version, expected)

    def snapshot(self) -> Snapshot:
        """The cluster-wide gauges, read at most every :data:`SNAPSHOT_CACHE` seconds."""
        with self._snapshot_lock:
            cached = self._snapshot
            if cached is not None and time.monotonic() - cached[0] < SNAPSHOT_CACHE:
                return cached[1]
            result = self._read_snapshot()
            self._snapshot = (time.monotonic(), result)
        if result.up != self._was_up:
            self._was_up = result.up
            if result.up:
                log.info("metrics: the database %s answers again", self.where)
            else:
                log.warning(
                    "metrics: cannot read tenure's state from %s (%s); tenure_database_up is 0",
                    self.where,
                    result.error,
                )
        return result

    def _read_snapshot(self) -> Snapshot:
        try:
            with self.session() as conn:
                version = self._schema_version(conn)
                [(now,)] = conn.execute(b"SELECT clock_timestamp()").fetchall()
                # Version 5 added the quarantine the query reads.
                jobs = self._run(conn, "observe_jobs") if version and version >= 5 else []
                topics = self._run(conn, "observe_outbox") if version and version >= 4 else []
                # Schema 6 registers the relays' topics.
                orphans = self._run(conn, "outbox_unhandled") if version and version >= 8 else []
        except psycopg.Error as exc:
            return Snapshot(False, error=_one_line(exc))
        unhandled = {topic: int(n) for topic, n, _ in orphans}
        return Snapshot(
            True,
            version,
            tuple(
                JobGauges(
                    key, paused, self._interval(key, cron, every, tz, now), last, since, quarantined
                )
                for key, cron, every, tz, paused, quarantined, last, since in jobs
            ),
            tuple(
                TopicGauges(topic, pending, dead, age, unhandled.get(topic, 0))
                for topic, pending, dead, age in topics
            ),
        )

    def _interval(
        self,
        key: str,
        cron: str | None,
        every: dt.timedelta | None,
        timezone: str,
        now: dt.datetime,
    ) -> float | None:
        """Seconds between slots: ``every``, or a cron schedule's largest gap (from the
        database clock's now), cached per schedule for an hour."""
        if every is not None:
            return every.total_seconds()
        if cron is None:
            return None
        cache_key = (cron, timezone)
        cached = self._intervals.get(cache_key)
        if cached is not None and abs((now - cached[0]).total_seconds()) < 3600:
            return cached[1]
        from ..scheduler.schedules import schedule_from_row

        try:
            slots = schedule_from_row(key, cron, None, timezone).iter_after(now)
            first = previous = next(slots)
            gap = 0.0
            for count, slot in enumerate(slots, start=1):
                gap = max(gap, (slot - previous).total_seconds())
                previous = slot
                enough = count >= INTERVAL_SLOTS and slot - first >= INTERVAL_SPAN
                if enough or count >= INTERVAL_MAX_SLOTS:
                    break
        except (ValueError, StopIteration, LookupError) as exc:
            log.warning("job %r: cannot compute its slot interval: %s", key, exc)
            return None
        if len(self._intervals) > 10_000:
            self._intervals.clear()
        self._intervals[cache_key] = (now, gap)
        return gap


def _one_line(exc: BaseException) -> str:
    # Shown on /readyz and in logs: never a password.
    return redact(one_line(str(exc))) or type(exc).__name__


# -- Prometheus ------------------------------------------------------------------------------


class DatabaseCollector:
    """A prometheus_client collector: cluster-wide gauges read from the database at scrape
    time (through :meth:`Database.snapshot`'s cache)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def describe(self) -> list[Any]:
        return list(self._families(Snapshot(False)))

    def collect(self) -> Iterator[Any]:
        yield from self._families(self.db.snapshot())

    def _families(self, snap: Snapshot) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "tenure_database_up",
            "1 if this process read tenure's state from the database at the last scrape",
        )
        up.add_metric([], 1.0 if snap.up else 0.0)
        yield up
        version = GaugeMetricFamily(
            "tenure_schema_version", "Applied version of tenure's schema (tenure migrate)"
        )
        if snap.schema_version is not None:
            version.add_metric([], float(snap.schema_version))
        yield version
        interval = GaugeMetricFamily(
            "tenure_job_interval_seconds",
            "Seconds between a scheduled job's slots (cron: the largest gap over 8 slots/days)",
            labels=["job_key"],
        )
        paused = GaugeMetricFamily(
            "tenure_job_paused",
            "1 if the scheduled job is paused (tenure jobs pause)",
            labels=["job_key"],
        )
        quarantined = GaugeMetricFamily(
            "tenure_job_quarantined",
            "1 if the scheduler quarantined the job (paused it: its runs kept ending with their "
            "worker gone); tenure jobs resume lifts it",
            labels=["job_key"],
        )
        since = GaugeMetricFamily(
            "tenure_job_seconds_since_success",
            "Seconds since the job's newest successful run finished (database clock); with "
            "none in the run history, since its oldest history row or its registration",
            labels=["job_key"],
        )
        last = GaugeMetricFamily(
            "tenure_job_last_success_timestamp_seconds",
            "When the job's newest successful run in the history finished (database clock)",
            labels=["job_key"],
        )
        for job in snap.jobs:
            if job.interval is not None:
                interval.add_metric([job.job_key], job.interval)
            paused.add_metric([job.job_key], 1.0 if job.paused else 0.0)
            quarantined.add_metric([job.job_key], 1.0 if job.quarantined else 0.0)
            since.add_metric([job.job_key], max(0.0, job.since_success))
            if job.last_success is not None:
                last.add_metric([job.job_key], job.last_success)
        yield from (interval, paused, quarantined, since, last)
        pending = GaugeMetricFamily(
            "tenure_outbox_pending_messages",
            "Outbox messages waiting for delivery (including those backing off)",
            labels=["topic"],
        )
        dead = GaugeMetricFamily(
            "tenure_outbox_dead_messages",
            "Outbox messages parked as dead: delivered only after `tenure outbox retry`",
            labels=["topic"],
        )
        age = GaugeMetricFamily(
            "tenure_outbox_oldest_pending_age_seconds",
            "Age of the oldest pending outbox message (database clock)",
            labels=["topic"],
        )
        unhandled = GaugeMetricFamily(
            "tenure_outbox_unhandled_messages",
            "Pending outbox messages whose topic no running relay has a handler for: they wait "
            "until one starts",
            labels=["topic"],
        )
        for topic in snap.topics:
            unhandled.add_metric([topic.topic], float(topic.unhandled))
            pending.add_metric([topic.topic], float(topic.pending))
            dead.add_metric([topic.topic], float(topic.dead))
            if topic.oldest_pending_age is not None:
                age.add_metric([topic.topic], max(0.0, topic.oldest_pending_age))
        yield from (pending, dead, age, unhandled)


class _Chain:
    """Exposes another registry's metrics through a fresh one (so that a second server in a
    process never registers the database collector twice in the global registry)."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield from self._registry.collect()


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def exposition_registry(source: Any = None) -> Any:
    """A registry to expose: every process's metrics merged from ``PROMETHEUS_MULTIPROC_DIR``
    when it is set (prometheus_client's multiprocess mode), else ``source`` (default: the
    global registry, where :func:`tenure.metrics.install_prometheus` puts tenure's)."""
    try:
        import prometheus_client as prom
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(
            "the metrics endpoint needs prometheus_client: pip install 'tenure[prometheus]'"
        ) from exc
    registry = prom.CollectorRegistry(auto_describe=False)
    if multiprocess_dir() is not None and source is None:
        from prometheus_client import multiprocess

        try:
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise ConfigurationError(
                f"PROMETHEUS_MULTIPROC_DIR={multiprocess_dir()!r}: {exc}; create the directory "
                "(empty) before the processes start"
            ) from exc
    else:
        registry.register(_Chain(prom.REGISTRY if source is None else source))
    return registry
