# WARNING: this file is generated from src/tenure/leases/_async/client.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""The client: a connection pool, the named queries, and the lease operations."""

from __future__ import annotations

import datetime as dt
import logging
import os
import select
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import Any, overload

import psycopg
from psycopg import Connection, Cursor, pq
from psycopg_pool import ConnectionPool

from ... import metrics
from ..._compat import monotonic
from ...db import migrations
from ...db.channels import channel
from ...db.dsn import describe, named, resolve
from ...db.executor import R, typed
from ...db.idle import closed_while_idle
from ...db.queries import compose, queries
from ...db.timeouts import (
    CONNECTION_KWARGS,
    TIMEOUTS,
    UNSET,
    Unset,
    lock_timeout_ms,
    prepare_threshold_from_env,
)
from ...errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidArgumentType,
    LeaseBusy,
    StaleTokenError,
    TenureError,
    Timeout,
    connection_failed,
    mapped,
    translate,
)
from ...validation import (
    Duration,
    check_dsn,
    check_encodable,
    check_int,
    check_job_key,
    check_schema,
    check_ttl,
    parse_duration,
)
from ..models import Grant, LeaseInfo
from ..rows import AcquireRow, LeaseRow
from .fencing import fence, record_refused
from .lease import Lease, LeaseContext
from .results import Results
from .waiter import ReleaseWaiter

log = logging.getLogger("tenure.client")
DEFAULT_TTL = 30.0
#: The schema when neither the caller nor $TENURE_SCHEMA names one.
DEFAULT_SCHEMA = "tenure"
#: Statements planned on every call instead of prepared (psycopg prepares a statement after 5
#: executions, and PostgreSQL then keeps a generic plan for the connection's life). The
#: scheduler's batched start and finish join a JSON batch to job_runs, job_leases and
#: scheduled_jobs: a generic plan made while those tables were small (a fresh deployment)
#: kept scanning every row of job_runs on each finish as it grew, while a plan made for
#: the call uses the indexes. Planning costs a fraction of a millisecond per batch.
PLANNED_EACH_CALL = frozenset({"sched_start", "sched_finish", "sched_running"})
#: Never prepared: planned on every call, or a utility statement the server cannot prepare.
NOT_PREPARED = PLANNED_EACH_CALL | {"sched_vacuum"}
#: More connections than this per client is a mistake (PostgreSQL's default max_connections
#: is 100).
MAX_POOL_SIZE = 1000


class Client:
    """Leases, fenced results and migrations on one PostgreSQL schema.

    Every statement runs on tenure's own pooled connections in autocommit mode: an acquire
    commits on its own and never joins a caller's transaction, so a token is valid exactly
    when the statement that issued it has committed.
    """

    def __init__(self, pool: ConnectionPool[Connection[Any]], *, schema: str, where: str) -> None:
        self._pool = pool
        self.schema = schema
        self.where = where
        self._queries = queries(schema)
        self.results = Results(self)
        self._timings: dict[tuple[type, Any, type, Any], _Timing] = {}
        #: Where releases are announced, for waiters (see :class:`ReleaseWaiter`).
        self.lease_channel = channel("leases", schema)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.where} schema={self.schema!r}>"

    def close(self, timeout: float = 5.0) -> None:
        """Close the pool, waiting up to ``timeout`` seconds for connections in use."""
        self._pool.close(timeout=timeout)

    @property
    def conninfo(self) -> str | None:
        """What the pool connects with (None: a pool built with something else than a
        string), for a process or a listening connection of the caller's own."""
        conninfo = self._pool.conninfo
        return conninfo if isinstance(conninfo, str) else None

    def connection(self) -> AbstractContextManager[Connection[Any]]:
        """A pooled connection, for statements that are not named (a tool's setup)."""
        return self._pool.connection()

    @contextmanager
    def fenced(self, job_key: str, token: int) -> Iterator[Connection[Any]]:
        """A transaction on a pooled connection, fenced with ``token`` (strict) before the
        caller's statements: they commit only if it is still the newest token of
        ``job_key``, else :class:`~tenure.StaleTokenError` is raised and it rolls back."""
        refused = False
        try:
            with self._pool.connection() as conn, conn.transaction():
                try:
                    fence(conn, job_key, token, schema=self.schema)
                except StaleTokenError:
                    refused = True
                    raise
                yield conn
        finally:
            if refused:
                # The fence refused the token; the transaction has rolled back and its
                # connection is back in the pool: the refusal is recorded for the key's
                # timeline, from the pool (migration 18).
                record_refused(self, job_key, token, "fence")

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @overload
    def fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> list[tuple[Any, ...]]: ...

    @overload
    def fetch(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False, row: type[R]
    ) -> list[R]: ...

    def fetch(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        wrote: bool = False,
        row: type[R] | None = None,
    ) -> list[tuple[Any, ...]] | list[R]:
        """Run the named statement ``name`` (``db/sql/*.sql``) on a pooled autocommit
        connection; its rows, columns in the statement's order, as ``row`` records (its row
        type, :mod:`tenure.db.rows`) or tuples. A psycopg error becomes a
        :class:`~tenure.TenureError` saying what was being done (``doing``); ``wrote``: the
        statement writes, so a lost connection leaves its outcome unknown."""
        # getconn/putconn rather than `pool.connection()`: the latter wraps the connection in
        # `with conn:`, which sends a needless COMMIT-check on every call of this hot path.
        pool = self._pool
        try:
            conn = pool.getconn()
        except psycopg.Error as exc:  # no connection: nothing was sent
            raise translate(exc, doing) from exc
        try:
            try:
                cur = _cursor(conn)
                cur.execute(
                    self._queries[name], params, prepare=False if name in NOT_PREPARED else None
                )
                # No description: a statement that returns nothing (VACUUM).
                rows = [] if cur.description is None else cur.fetchall()
            finally:
                pool.putconn(conn)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                self._drop_dead_connections()
            raise translate(exc, doing, wrote=wrote) from exc
        return rows if row is None else typed(rows, row)

    @overload
    def fetch_one(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False
    ) -> tuple[Any, ...] | None: ...

    @overload
    def fetch_one(
        self, name: str, params: dict[str, Any], *, doing: str, wrote: bool = False, row: type[R]
    ) -> R | None: ...

    def fetch_one(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        wrote: bool = False,
        row: type[R] | None = None,
    ) -> tuple[Any, ...] | R | None:
        """:meth:`fetch`'s first row, or None when the statement returned none."""
        rows = self.fetch(name, params, doing=doing, wrote=wrote)
        if not rows:
            return None
        return rows[0] if row is None else typed(rows[:1], row)[0]

    @overload
    def fetch_sized(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        seconds: float,
        serialize: str,
        wrote: bool = False,
    ) -> list[tuple[Any, ...]]: ...

    @overload
    def fetch_sized(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        seconds: float,
        serialize: str,
        wrote: bool = False,
        row: type[R],
    ) -> list[R]: ...

    def fetch_sized(
        self,
        name: str,
        params: dict[str, Any],
        *,
        doing: str,
        seconds: float,
        serialize: str,
        wrote: bool = False,
        row: type[R] | None = None,
    ) -> list[tuple[Any, ...]] | list[R]:
        """Run a statement whose work grows with its input (registering an app's 100,000s of
        jobs takes seconds, longer on a busy server) in its own transaction: statement and
        lock timeouts of ``seconds`` instead of the pool's 5 s and 2 s, and one at a time per
        ``serialize`` name in this schema (a transaction-level advisory lock), so that workers
        started together queue behind the first instead of timing out on its new rows."""
        ms = f"{max(1, round(seconds * 1000))}ms"
        with mapped(doing, wrote=wrote):
            with self._pool.connection() as conn, conn.transaction():
                conn.execute(
                    b"SELECT set_config('statement_timeout', %s, true), "
                    b"set_config('lock_timeout', %s, true)",
                    (ms, ms),
                )
                conn.execute(
                    b"SELECT pg_advisory_xact_lock(hashtext(%s))",
                    (f"tenure:{self.schema}:{serialize}",),
                )
                cur = conn.execute(self._queries[name], params)
                rows = cur.fetchall()
        return rows if row is None else typed(rows, row)

    def _drop_dead_connections(self) -> None:
        """After a connection failure (server restart, terminated backends), test the idle
        connections once, so the next calls get live ones instead of failing one by one."""
        try:
            self._pool.check()
        except psycopg.Error:  # the server is still away: the next call reconnects
            log.debug("checking pooled connections failed", exc_info=True)

    def _release_waiter(self, job_key: str) -> ReleaseWaiter:
        """A waiter that wakes when ``job_key``'s lease is released (see :mod:`.waiter`)."""
        conninfo, kwargs = (self._pool.conninfo, self._pool.kwargs)
        if not isinstance(conninfo, str) or not isinstance(kwargs, dict):
            return ReleaseWaiter(None, job_key)  # a pool we did not build: poll
        return ReleaseWaiter.start(conninfo, kwargs, self.lease_channel, job_key)

    # -- schema -----------------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply pending migrations under an advisory lock; returns the versions applied.

        Safe to run twice, or from several processes at once.
        """
        applied: list[int] = []
        with mapped(f"migrating schema {self.schema!r}", wrote=True):
            with self._pool.connection() as conn, conn.transaction():
                conn.execute(b"SET LOCAL lock_timeout = '60s'")
                conn.execute(b"SET LOCAL statement_timeout = '10min'")
                conn.execute(b"SELECT pg_advisory_xact_lock(hashtext(%s))", (migrations.LOCK_NAME,))
                conn.execute(compose(migrations.BOOTSTRAP, self.schema, with_params=False))
                cur = conn.execute(
                    compose(
                        "SELECT version FROM {schema}.tenure_migrations",
                        self.schema,
                        with_params=False,
                    )
                )
                done = {row[0] for row in cur.fetchall()}
                for mig in migrations.available():
                    if mig.version in done:
                        continue
                    if done and mig.version < max(done):
                        raise ConfigurationError(
                            f"migration {mig.version} ({mig.name}) is older than the applied "
                            f"version {max(done)} of schema {self.schema!r}: migrations are "
                            "forward-only and must be added with increasing numbers"
                        )
                    conn.execute(compose(mig.sql, self.schema, with_params=False))
                    conn.execute(
                        compose(
                            "INSERT INTO {schema}.tenure_migrations (version, name) "
                            "VALUES (%s, %s)",
                            self.schema,
                        ),
                        (mig.version, mig.name),
                    )
                    applied.append(mig.version)
        if applied:
            log.info("schema %r migrated to version %s", self.schema, applied[-1])
        return applied

    def schema_version(self) -> int | None:
        """The applied schema version, or None if tenure's schema is not there."""
        with self._pool.connection() as conn:
            cur = conn.execute(
                b"SELECT EXISTS (SELECT 1 FROM pg_tables"
                b" WHERE schemaname = %s AND tablename = 'tenure_migrations')",
                (self.schema,),
            )
            row = cur.fetchone()
            if not row or not row[0]:
                return None
            cur = conn.execute(
                compose(
                    "SELECT max(version) FROM {schema}.tenure_migrations",
                    self.schema,
                    with_params=False,
                )
            )
            row = cur.fetchone()
            return row[0] if row else None

    # -- leases -----------------------------------------------------------------------------
    def _timing(self, ttl: Duration, safety_margin: Duration | None) -> _Timing:
        """The validated TTL and margin, and the statement parameters they give.

        Callers pass the same few TTLs over and over: the result of a successful validation
        is kept per (type, value), so the hot path skips parsing; anything else, including
        every value that fails, goes through the full checks."""
        key = None
        if type(ttl) in _PLAIN and type(safety_margin) in _PLAIN_OR_NONE:
            key = (type(ttl), ttl, type(safety_margin), safety_margin)
            timing = self._timings.get(key)
            if timing is not None:
                return timing
        ttl_s = check_ttl(ttl)
        margin = (
            default_margin(ttl_s)
            if safety_margin is None
            else parse_duration(safety_margin, what="safety_margin")
        )
        if not 0 <= margin < ttl_s:
            raise InvalidArgument(
                f"safety_margin {safety_margin!r} must be at least 0 and less than the ttl"
            )
        timing = (ttl_s, margin, dt.timedelta(seconds=ttl_s), lock_timeout_ms(ttl_s))
        if key is not None:
            if len(self._timings) >= _TIMINGS_KEPT:
                self._timings.clear()
            self._timings[key] = timing
        return timing

    def _take(
        self, job_key: str, ttl: Duration, safety_margin: Duration | None
    ) -> Lease | _Busy | None:
        """One acquire statement: the lease, or who holds it (None: a concurrent first
        acquire of the key won, and this statement could not see its row)."""
        check_job_key(job_key)
        ttl_s, margin, ttl_param, lock_timeout = self._timing(ttl, safety_margin)
        owner = uuid.uuid4()
        sent = monotonic()
        try:
            rows = self.fetch(
                "acquire",
                {
                    "job_key": job_key,
                    "owner": owner,
                    "ttl": ttl_param,
                    "lock_timeout": lock_timeout,
                },
                doing=f"acquiring lease {job_key!r}",
                wrote=True,
                row=AcquireRow,
            )
        except Timeout:
            # The previous holder's fenced transaction still holds the job-state row.
            metrics.emit(metrics.ACQUIRE, job_key, "busy")
            return (None, None, None, ": its fenced transaction is still open")
        except TenureError:
            metrics.emit(metrics.ACQUIRE, job_key, "error")
            raise
        if rows:
            r = rows[0]
            token, expires_at = (r.fencing_token, r.lease_until)
            if r.acquired:
                metrics.emit(metrics.ACQUIRE, job_key, "acquired")
                if log.isEnabledFor(logging.INFO):
                    log.info(
                        "lease %r acquired with token %s until %s",
                        job_key,
                        token,
                        expires_at.isoformat(),
                        extra={"job": job_key, "token": token, "owner": str(owner)},
                    )
                return Lease(
                    self,
                    job_key,
                    owner,
                    Grant(token, expires_at, r.acquired_at),
                    ttl=ttl_s,
                    safety_margin=margin,
                    sent_at=sent,
                )
            metrics.emit(metrics.ACQUIRE, job_key, "busy")
            # The busy answer's now is the database's, for retry_after.
            return (token, expires_at, (expires_at - r.now).total_seconds(), "")
        metrics.emit(metrics.ACQUIRE, job_key, "busy")
        return None

    def _attempt(
        self, job_key: str, ttl: Duration, safety_margin: Duration | None
    ) -> Lease | LeaseBusy:
        outcome = self._take(job_key, ttl, safety_margin)
        if isinstance(outcome, Lease):
            return outcome
        if outcome is not None:
            token, expires_at, retry_after, detail = outcome
            return LeaseBusy(job_key, token, expires_at, detail, retry_after=retry_after)
        # A concurrent first acquire of this key won the race: our statement's snapshot
        # predates its row. One more (rare) statement names the winner.
        info = self.inspect(job_key)
        if info is None:
            return LeaseBusy(job_key, None, None)
        return LeaseBusy(job_key, info.token, info.expires_at)

    def acquire(
        self, job_key: str, *, ttl: Duration = DEFAULT_TTL, safety_margin: Duration | None = None
    ) -> Lease | None:
        """Take the lease if it is free or expired; None if another execution holds it.

        The returned lease is not renewed automatically: call ``renew()`` within its TTL,
        or use :meth:`lease`, which renews in the background.
        """
        # No LeaseBusy here: nobody would see its message, and building it is a fair share
        # of a busy answer's client-side cost.
        outcome = self._take(job_key, ttl, safety_margin)
        return outcome if isinstance(outcome, Lease) else None

    def lease(
        self,
        job_key: str,
        *,
        ttl: Duration = DEFAULT_TTL,
        wait: Duration | None = None,
        safety_margin: Duration | None = None,
    ) -> LeaseContext:
        """Context manager: acquire (waiting up to ``wait`` seconds) or raise
        :class:`LeaseBusy`; renew every ttl/3 in the background; release on exit."""
        check_job_key(job_key)
        ttl_s = check_ttl(ttl)
        wait_s = None if wait is None else parse_duration(wait, what="wait")
        if wait_s is not None and wait_s < 0:
            raise InvalidArgument(f"wait must not be negative, got {wait!r}")
        margin = (
            None if safety_margin is None else parse_duration(safety_margin, what="safety_margin")
        )
        if margin is not None and margin >= ttl_s:
            raise InvalidArgument(
                f"safety_margin {safety_margin!r} must be at least 0 and less than the ttl"
            )
        return LeaseContext(self, job_key, ttl=ttl_s, wait=wait_s, safety_margin=margin)

    def inspect(self, job_key: str) -> LeaseInfo | None:
        """The current lease on ``job_key`` (held or expired), or None if never acquired."""
        check_job_key(job_key)
        rows = self.fetch(
            "inspect", {"job_key": job_key}, doing=f"inspecting lease {job_key!r}", row=LeaseRow
        )
        return _info(rows[0]) if rows else None

    def leases(self) -> list[LeaseInfo]:
        """Every job's lease, held or expired, ordered by job key."""
        rows = self.fetch("leases", {}, doing="listing leases", row=LeaseRow)
        return [_info(row) for row in rows]

    def release(self, job_key: str) -> int | None:
        """Operator action: expire whatever lease is live on ``job_key`` now.

        Returns the token that was expired, or None if no lease was live. The token stays,
        so the old holder's writes remain fenced.
        """
        check_job_key(job_key)
        rows = self.fetch(
            "force_release",
            {"job_key": job_key, "channel": self.lease_channel},
            doing=f"releasing {job_key!r}",
            wrote=True,
        )
        if not rows:
            return None
        token: int = rows[0][0]
        log.warning(
            "lease %r token %s expired by an operator",
            job_key,
            token,
            extra={"job": job_key, "token": token, "owner": str(rows[0][1])},
        )
        return token

    def now(self) -> dt.datetime:
        """The database clock: the only clock tenure trusts."""
        rows = self.fetch("now", {}, doing="reading the database clock")
        value: dt.datetime = rows[0][0]
        return value


#: Validated (ttl, safety_margin) pairs kept per client: a few in practice; the cache is
#: emptied when a caller cycles through more than this.
_TIMINGS_KEPT = 64
#: Hashable argument types whose validation result depends on the value alone.
_PLAIN: tuple[type, ...] = (int, float, str, dt.timedelta)
_PLAIN_OR_NONE: tuple[type, ...] = (*_PLAIN, type(None))
#: (ttl seconds, safety margin seconds, ttl parameter, lock_timeout parameter)
_Timing = tuple[float, float, dt.timedelta, str]
#: A busy answer: (holder's token, its expiry, seconds until then, detail); None when unknown.
_Busy = tuple[int | None, dt.datetime | None, float | None, str]
_CURSOR_ATTR = "_tenure_cursor"


def _cursor(conn: Connection[Any]) -> Cursor[Any]:
    """The connection's own cursor, made once: a pooled connection serves one caller at a
    time, and a new cursor per statement is a measurable part of a short statement's cost.
    It lives as long as the connection (a reference cycle the collector frees)."""
    cur: Cursor[Any] | None = getattr(conn, _CURSOR_ATTR, None)
    if cur is None:
        cur = conn.cursor()
        setattr(conn, _CURSOR_ATTR, cur)
    return cur


def default_margin(ttl: float) -> float:
    """A tenth of the TTL: covers clock-rate drift and the time to stop work."""
    return ttl / 10


def _info(r: LeaseRow) -> LeaseInfo:
    return LeaseInfo(
        r.job_key,
        r.lease_owner,
        r.fencing_token,
        r.lease_until,
        r.lease_ttl,
        r.acquired_at,
        r.renewed_at,
        r.now,
    )


def _configure(conn: Connection[Any]) -> None:
    for name, value in TIMEOUTS.items():
        conn.execute(b"SELECT set_config(%s, %s, false)", (name, value))


#: What tenure.db.idle looks for on an idle socket.
_POLL_EVENTS = select.POLLIN | select.POLLERR | select.POLLHUP if hasattr(select, "poll") else 0
_POLLER_ATTR = "_tenure_poller"


def _went_away(conn: Connection[Any]) -> bool:
    """:func:`~tenure.db.idle.closed_while_idle`, the same look at the socket, through a
    poll object made once per connection: making and registering one on every checkout was
    most of the look's cost. Anything but a healthy idle connection gets the full check."""
    pgconn = conn.pgconn
    if (
        not _POLL_EVENTS
        or pgconn.status != pq.ConnStatus.OK
        or pgconn.transaction_status != pq.TransactionStatus.IDLE
    ):
        return closed_while_idle(conn)
    try:
        fd = pgconn.socket
    except psycopg.Error:  # no socket: the full check says it is gone
        return closed_while_idle(conn)
    kept: tuple[int, Any] | None = getattr(conn, _POLLER_ATTR, None)
    if kept is None or kept[0] != fd:
        poller = select.poll()
        poller.register(fd, _POLL_EVENTS)
        kept = (fd, poller)
        setattr(conn, _POLLER_ATTR, kept)
    return bool(kept[1].poll(0))


class _IdleCheck:
    """The pool's ``check``: before a connection is handed out, discard it if the server
    closed it while it sat idle (see :mod:`tenure.db.idle`), so a statement is never sent
    on it and reported as an unknown outcome. The first dead one found makes the pool test
    its other idle connections too (they usually died together: a restart, a proxy)."""

    def __init__(self) -> None:
        self.pool: ConnectionPool[Connection[Any]] | None = None

    def __call__(self, conn: Connection[Any]) -> None:
        if not _went_away(conn):
            return
        log.info("a pooled connection was closed by the server while idle; using a fresh one")
        conn.close()
        if self.pool is not None:
            self.pool.check()
        raise psycopg.OperationalError("the server closed this connection while it was idle")


def connect(
    dsn: str | None = None,
    *,
    schema: str | None = None,
    pool_size: int = 4,
    migrate: bool = False,
    application_name: str = "tenure",
    prepare_threshold: int | Unset | None = UNSET,
) -> Client:
    """Connect to PostgreSQL (``dsn``, else ``$TENURE_DSN``, ``$DATABASE_URL``, else the
    embedded server) and return a client for ``schema`` (else ``$TENURE_SCHEMA``, which every
    command honours and ``tenure exec`` exports to its command, else ``tenure``).

    ``pool_size``: connections kept for lease operations and renewals. ``migrate``: apply
    pending migrations first. ``application_name``: shown in ``pg_stat_activity``.
    ``prepare_threshold``: psycopg's server-side prepared statements (after 5 executions of a
    query; default ``$TENURE_PREPARE_THRESHOLD``, else 5); pass None (or set
    ``TENURE_PREPARE_THRESHOLD=none``) behind PgBouncer in transaction mode before 1.21,
    where one client's prepared statements reach another's server connection.
    """
    check_dsn(dsn)
    if schema is None:
        schema = os.environ.get("TENURE_SCHEMA") or DEFAULT_SCHEMA  # empty: unset, as for click
    check_schema(schema)
    check_int(pool_size, what="pool_size", minimum=1, maximum=MAX_POOL_SIZE)
    if not isinstance(application_name, str):
        raise InvalidArgumentType(f"application_name must be a string, got {application_name!r}")
    check_encodable(application_name, what="application_name")
    if not isinstance(prepare_threshold, Unset) and prepare_threshold is not None:
        check_int(prepare_threshold, what="prepare_threshold", minimum=0, maximum=2**31 - 1)
    conninfo, source = resolve(dsn)
    where = describe(conninfo)
    kwargs = {
        **CONNECTION_KWARGS,
        "application_name": application_name,
        "prepare_threshold": prepare_threshold_from_env()
        if isinstance(prepare_threshold, Unset)
        else prepare_threshold,
    }
    try:
        # One direct attempt first: its error says what is wrong, a pool timeout would not.
        probe = Connection.connect(conninfo, **kwargs)
        probe.close()
    except psycopg.Error as exc:
        raise connection_failed(exc, f"connecting to {where}", named(source)) from exc
    check = _IdleCheck()
    pool: ConnectionPool[Connection[Any]] = ConnectionPool(
        conninfo,
        min_size=1,
        max_size=pool_size,
        kwargs=kwargs,
        configure=_configure,
        check=check,
        timeout=10.0,
        open=False,
        name=f"tenure-{schema}",
    )
    check.pool = pool
    pool.open(wait=True, timeout=10.0)
    client = Client(pool, schema=schema, where=where)
    if migrate:
        client.migrate()
    return client
