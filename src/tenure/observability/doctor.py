"""What ``tenure doctor`` checks: can this host run tenure against this database, and how
is it set up?

Checks, in order (a failed connection skips the ones that need it):

* ``dsn``: where the DSN comes from (``--dsn``, ``$TENURE_DSN``, ``$DATABASE_URL`` or the
  embedded server), shown without its password.
* ``connect``: connection time and round trip, TLS.
* ``server``: PostgreSQL version (12 or later: generated columns), and that it is a primary
  accepting writes (a standby cannot issue tokens).
* ``schema``: the applied schema version against the one this tenure expects.
* ``privileges``: what the current role lacks of the privileges tenure uses on the schema's
  tables and the functions it calls (:mod:`tenure.db.privileges`, the list ``tenure grants``
  prints), each named with what needs it.
* ``vacuum``: whether this role may vacuum the scheduler's one-row-per-job tables, as the
  workers do (:mod:`tenure.scheduler.vacuum`), and whether autovacuum is on. A warning when
  neither: nothing then removes the dead rows every run leaves, and a busy scheduler's
  claims slow down the longer it runs.
* ``clock``: this host's clock against the database's. A warning only: tenure decides
  everything lease- and schedule-related by the database clock, but logs and people do not.
* ``timeouts``: the server's defaults and what tenure sets on each of its connections.
* ``pooler``: is something (PgBouncer) between this host and PostgreSQL? Two signs: the
  address and port the client connected to differ from the ones the server reports it was
  reached on (``inet_server_addr()``/``inet_server_port()``, or the ``port`` setting over a
  Unix socket): a hop, pooler or not; and two connections made one after the other are
  served by the same server process (``pg_backend_pid()``): a pooler. Only then is the
  PgBouncer admin console asked (``SHOW VERSION``, ``SHOW CONFIG`` for ``pool_mode``),
  because on a plain PostgreSQL that attempt logs an error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from ..db import migrations
from ..db.dsn import describe, named, parse, redact, remember
from ..db.privileges import FUNCTIONS, TABLES
from ..db.queries import queries
from ..db.timeouts import CONNECTION_KWARGS, TIMEOUTS
from ..errors import TenureError, connection_failed, one_line, translate
from ..scheduler import vacuum
from .status import answered_by

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
MIN_SERVER = 120000  # PostgreSQL 12: generated columns (scheduler tables)
CLOCK_WARN = 1.0  # seconds of difference worth telling
#: shared_buffers wanted per scheduled job: a run's history row goes into two job_runs
#: indexes led by job_key (job_runs_run, job_runs_window; three before migration 19), so each
#: busy job keeps a leaf page of each hot (2 x 8 kB), twice over for the rest of the working
#: set. Measured with three: 5,000 jobs every second thrashed 128 MB once history passed it
#: (p99 lateness 31 ms rising to 155 ms within 300 s) and stayed flat with 512 MB
#: (bench/README.md, "Sixth pass").
BUFFERS_PER_JOB = 2 * 2 * 8192
PGBOUNCER_PORT = 6432
#: The server settings that bound how long tenure's statements and transactions may wait.
TIMEOUT_SETTINGS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


@dataclass(frozen=True, slots=True)
class Check:
    """One finding: ``status`` is ok, warn, fail or skip."""

    name: str
    status: str
    summary: str
    details: tuple[tuple[str, str], ...] = ()
    advice: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "details": dict(self.details),
            "advice": self.advice,
        }


@dataclass
class _Context:
    conninfo: str | None = None
    where: str = ""
    source: str = ""  # where the DSN came from, as resolve() names it
    conn: psycopg.Connection[tuple[Any, ...]] | None = None
    found: list[Check] = field(default_factory=list)


def diagnose(dsn: str | None, schema: str, *, origin: str | None = None) -> list[Check]:
    """Run every check. ``origin`` says where an explicit ``dsn`` came from (for the
    report); without ``dsn``, the environment and then the embedded server are used."""
    ctx = _Context()
    ctx.found.append(_dsn(ctx, dsn, origin))
    ctx.found.append(_connect(ctx))
    try:
        steps: list[tuple[str, Callable[[], Check]]] = [
            ("server", lambda: _server(ctx)),
            ("schema", lambda: _schema(ctx, schema)),
            ("privileges", lambda: _privileges(ctx, schema)),
            ("vacuum", lambda: _vacuum(ctx, schema)),
            ("memory", lambda: _memory(ctx, schema)),
            ("clock", lambda: _clock(ctx)),
            ("timeouts", lambda: _timeouts(ctx)),
            ("pooler", lambda: _pooler(ctx)),
        ]
        for name, step in steps:
            if ctx.conn is None or ctx.conn.closed:
                ctx.found.append(Check(name, SKIP, "no connection"))
                continue
            try:
                ctx.found.append(step())
            except psycopg.Error as exc:
                ctx.found.append(Check(name, FAIL, str(translate(exc, f"checking {name}"))))
    finally:
        if ctx.conn is not None:
            ctx.conn.close()
    # A server or driver message may quote the DSN: the report never shows a password.
    return [
        Check(
            c.name,
            c.status,
            redact(c.summary, ctx.conninfo),
            tuple((k, redact(v, ctx.conninfo)) for k, v in c.details),
            None if c.advice is None else redact(c.advice, ctx.conninfo),
        )
        for c in ctx.found
    ]


# -- the checks ------------------------------------------------------------------------------


def _dsn(ctx: _Context, dsn: str | None, origin: str | None) -> Check:
    if dsn:
        source = origin or "the DSN given"
    else:
        source = ""
        for var in ("TENURE_DSN", "DATABASE_URL"):
            if os.environ.get(var):
                dsn, source = os.environ[var], f"${var}"
                break
    embedded = not dsn
    if embedded:
        from ..db import embedded as emb

        dsn, source = emb.dsn(), "the embedded server (no --dsn, $TENURE_DSN or $DATABASE_URL)"
    assert dsn is not None
    remember(dsn)
    try:
        params = parse(dsn, source)
    except TenureError as exc:
        message, _, advice = str(exc).partition("; ")
        return Check("dsn", FAIL, message, advice=advice or None)
    ctx.conninfo, ctx.where = dsn, describe(dsn)
    ctx.source = "embedded" if embedded else source
    details = [("source", source), ("target", ctx.where)]
    if params.get("password"):
        details.append(("password", "in the DSN (not shown)"))
    elif os.environ.get("PGPASSWORD"):
        details.append(("password", "from $PGPASSWORD (not shown)"))
    else:
        details.append(("password", "none given (trust, peer, certificate or ~/.pgpass)"))
    details.append(
        ("sslmode", str(params.get("sslmode") or os.environ.get("PGSSLMODE") or "prefer"))
    )
    if embedded:
        return Check(
            "dsn",
            WARN,
            f"{ctx.where}, from {source}",
            tuple(details),
            "the embedded server is for trying tenure out; set $TENURE_DSN for real work",
        )
    return Check("dsn", OK, f"{ctx.where}, from {source}", tuple(details))


def _connect(ctx: _Context) -> Check:
    if ctx.conninfo is None:
        return Check("connect", SKIP, "no usable DSN")
    kwargs = {**CONNECTION_KWARGS, "application_name": "tenure doctor", "prepare_threshold": None}
    started = time.perf_counter()
    try:
        conn = psycopg.connect(ctx.conninfo, **kwargs)
    except psycopg.Error as exc:
        failed = connection_failed(exc, f"connecting to {ctx.where}", named(ctx.source))
        return Check("connect", FAIL, str(failed))
    connect_ms = (time.perf_counter() - started) * 1000
    ctx.conn = conn
    rtts = []
    for _ in range(3):
        sent = time.perf_counter()
        conn.execute(b"SELECT 1")
        rtts.append((time.perf_counter() - sent) * 1000)
    info = conn.info
    via = f"socket {info.host}" if info.host.startswith("/") else f"{info.host}:{info.port}"
    details = (
        ("connected to", via),
        ("address", info.hostaddr or "-"),
        ("tls", "yes" if conn.pgconn.ssl_in_use else "no"),
        ("backend pid", str(info.backend_pid)),
    )
    return Check(
        "connect",
        OK,
        f"connected in {connect_ms:.1f} ms, round trip {min(rtts):.2f} ms",
        details,
    )


def _conn(ctx: _Context) -> psycopg.Connection[tuple[Any, ...]]:
    assert ctx.conn is not None
    return ctx.conn


def _server(ctx: _Context) -> Check:
    conn = _conn(ctx)
    version_num = conn.info.server_version
    [(version, standby, read_only, address, port, timeline)] = conn.execute(
        queries("tenure")["observe_server"]  # no schema in it: any name loads it
    ).fetchall()
    # Through an HA endpoint (HAProxy, a multi-host DSN): the member that answered.
    answered = answered_by(address, port)
    details = (
        ("version", str(version)),
        ("server_version_num", str(version_num)),
        ("answered_by", answered),
        ("timeline", "-" if timeline is None else str(timeline)),
    )
    if version_num < MIN_SERVER:
        return Check(
            "server",
            FAIL,
            f"PostgreSQL {version} is too old: tenure needs 12 or later",
            details,
            "upgrade PostgreSQL (tenure's scheduler tables use generated columns)",
        )
    if standby:
        return Check(
            "server",
            FAIL,
            f"PostgreSQL {version} is a standby (in recovery): it cannot issue tokens",
            details,
            "point the DSN at the primary (a read-write endpoint, or target_session_attrs="
            "read-write with several hosts)",
        )
    if read_only == "on":
        return Check(
            "server",
            FAIL,
            f"PostgreSQL {version}: default_transaction_read_only is on for this role/database",
            details,
            "tenure writes on every acquire: use a role and database that can write",
        )
    return Check(
        "server",
        OK,
        f"PostgreSQL {version}, primary, read-write, timeline {timeline}, answered by {answered}",
        details,
    )


def _schema(ctx: _Context, schema: str) -> Check:
    conn = _conn(ctx)
    expected = migrations.latest()
    named = queries(schema)
    [(exists,)] = conn.execute(
        named["observe_has_table"], {"schema": schema, "table": "tenure_migrations"}
    ).fetchall()
    version = None
    if exists:
        [(version,)] = conn.execute(named["observe_schema_version"], {}).fetchall()
    details = (("schema", schema), ("applied", str(version)), ("expected", str(expected)))
    if version is None:
        return Check(
            "schema",
            FAIL,
            f"schema {schema!r} has no tenure tables (this tenure expects version {expected})",
            details,
            "run `tenure migrate` (or start a worker with --migrate)",
        )
    if version < expected:
        return Check(
            "schema",
            FAIL,
            f"schema {schema!r} is at version {version}, this tenure expects {expected}",
            details,
            "run `tenure migrate` (forward-only, safe while other processes run)",
        )
    if version > expected:
        return Check(
            "schema",
            WARN,
            f"schema {schema!r} is at version {version}, newer than the {expected} this "
            "tenure knows",
            details,
            "upgrade tenure on this host to the version that migrated the schema",
        )
    return Check("schema", OK, f"schema {schema!r} at version {version}", details)


def _privileges(ctx: _Context, schema: str) -> Check:
    conn = _conn(ctx)
    [(role,)] = conn.execute(b"SELECT current_user").fetchall()
    pairs = [(need.table, p) for need in TABLES for p in need.privileges]
    missing = conn.execute(
        queries(schema)["observe_missing_privileges"],
        {
            "schema": schema,
            "tables": [table for table, _ in pairs],
            "privileges": [privilege for _, privilege in pairs],
            "functions": [signature for signature, _ in FUNCTIONS],
        },
    ).fetchall()
    if not missing:
        return Check(
            "privileges",
            OK,
            f"role {role!r} has every privilege tenure uses on schema {schema!r} "
            f"({len(TABLES)} tables) and its functions",
        )
    used_by = {need.table: need.used_by for need in TABLES} | dict(FUNCTIONS)
    names: list[str] = []
    lacking: dict[str, tuple[list[str], str]] = {}
    for kind, name, privilege in missing:
        if kind == "table":
            where, why = f"{schema}.{name}", used_by[name]
        elif kind == "schema":
            where, why = f"schema {name}", "every command"
        else:
            where, why = name, used_by[name]
        names.append(f"{privilege} on {where}")
        lacking.setdefault(where, ([], why))[0].append(privilege)
    details = tuple(
        (where, f"missing {', '.join(privileges)}: needed by {why}")
        for where, (privileges, why) in lacking.items()
    )
    return Check(
        "privileges",
        FAIL,
        f"role {role!r} lacks {len(names)} privilege(s) tenure uses: {', '.join(names)}",
        details,
        f"as the schema's owner (or a superuser), run what `tenure grants --role {role} "
        f"--schema {schema}` prints"
        + (
            f"; and, as a superuser, GRANT EXECUTE ON FUNCTION ... TO {role} for each function"
            if any(kind == "function" for kind, _, _ in missing)
            else ""
        ),
    )


def _vacuum(ctx: _Context, schema: str) -> Check:
    conn = _conn(ctx)
    [(role,)] = conn.execute(b"SELECT current_user").fetchall()
    [(_due, permitted, tables)] = conn.execute(
        queries(schema)["sched_vacuum_due"], vacuum.due_params(schema, vacuum.DEFAULT_EVERY)
    ).fetchall()
    if not tables:
        return Check("vacuum", SKIP, f"schema {schema!r} has no scheduler tables yet")
    autovacuum = _show(conn, "autovacuum")
    details = (
        ("role may vacuum", "yes" if permitted else "no"),
        ("autovacuum", f"{autovacuum}, naptime {_show(conn, 'autovacuum_naptime')}"),
    )
    if permitted:
        return Check(
            "vacuum",
            OK,
            f"role {role!r} may vacuum the scheduler tables: its workers vacuum them as runs "
            "leave dead rows",
            details,
        )
    if autovacuum == "on":
        return Check(
            "vacuum",
            OK,
            f"role {role!r} may not vacuum the scheduler tables (not their owner): its "
            "workers leave them to autovacuum",
            details,
        )
    return Check(
        "vacuum",
        WARN,
        f"role {role!r} may not vacuum the scheduler tables and autovacuum is off: nothing "
        "removes the dead rows every run leaves, so a busy scheduler's claims slow down the "
        "longer it runs",
        details,
        "run the workers as the tables' owner (the role that ran `tenure migrate`), GRANT "
        "MAINTAIN on scheduled_jobs, job_leases and job_state (PostgreSQL 17+), or turn "
        "autovacuum on (docs/retention.md, 'Vacuum')",
    )


def _memory(ctx: _Context, schema: str) -> Check:
    conn = _conn(ctx)
    named = queries(schema)
    [(exists,)] = conn.execute(
        named["observe_has_table"], {"schema": schema, "table": "scheduled_jobs"}
    ).fetchall()
    if not exists:
        return Check("memory", SKIP, f"schema {schema!r} has no scheduler tables yet")
    [(jobs, shared)] = conn.execute(named["observe_history_memory"], {}).fetchall()
    wanted = jobs * BUFFERS_PER_JOB
    mb = 1024 * 1024
    shared_mb, wanted_mb = shared // mb, -(-wanted // mb)  # wanted: rounded up
    details = (
        ("scheduled jobs (unpaused)", str(jobs)),
        ("shared_buffers", f"{shared_mb} MB"),
        ("wanted for frequent jobs", f"{wanted_mb} MB ({BUFFERS_PER_JOB // 1024} kB per job)"),
    )
    if shared >= wanted:
        return Check(
            "memory",
            OK,
            f"shared_buffers ({shared_mb} MB) holds the history pages {jobs} jobs write to",
            details,
        )
    return Check(
        "memory",
        WARN,
        f"shared_buffers ({shared_mb} MB) is smaller than the {wanted_mb} MB that "
        f"{jobs} jobs keep hot when they run every few seconds: once their history outgrows "
        "it, every run's history write reads and evicts pages, and runs start later",
        details,
        "raise shared_buffers (a restart; 25 % of the server's memory is the usual start), "
        "or ignore this if most jobs run minutes or more apart (docs/retention.md, 'Memory')",
    )


def _clock(ctx: _Context) -> Check:
    conn = _conn(ctx)
    best: tuple[float, float] | None = None  # (half round trip, difference)
    for _ in range(3):
        before = time.time()
        [(db_now,)] = conn.execute(b"SELECT clock_timestamp()").fetchall()
        after = time.time()
        half = (after - before) / 2
        diff = db_now.timestamp() - (before + half)
        if best is None or half < best[0]:
            best = (half, diff)
    assert best is not None
    half, diff = best
    way = "ahead of" if diff < 0 else "behind"
    text = f"this host's clock is {abs(diff):.3f}s {way} the database's (±{half * 1000:.1f} ms)"
    details = (
        ("host_minus_database_seconds", f"{-diff:+.3f}"),
        ("uncertainty_seconds", f"{half:.4f}"),
    )
    if abs(diff) - half > CLOCK_WARN:
        return Check(
            "clock",
            WARN,
            text,
            details,
            "harmless for leases and schedules (tenure only trusts the database clock), but "
            "this host's log times will not match the database's: run NTP (chrony, "
            "systemd-timesyncd) here or on the database host",
        )
    return Check("clock", OK, text, details)


def _timeouts(ctx: _Context) -> Check:
    conn = _conn(ctx)
    defaults = {name: _show(conn, name) for name in TIMEOUT_SETTINGS}
    # Transaction-local, so that nothing leaks behind a transaction-pooling PgBouncer.
    with conn.transaction():
        for name, value in TIMEOUTS.items():
            conn.execute(b"SELECT set_config(%s, %s, true)", (name, value))
        applied = {name: _show(conn, name) for name in TIMEOUTS}
    details: list[tuple[str, str]] = []
    for name in TIMEOUT_SETTINGS:
        tenure_value = applied.get(name, "-")
        details.append((name, f"server default {defaults[name]}, tenure sets {tenure_value}"))
    details += [
        ("lease statements", "lock_timeout lowered to the TTL (acquire) or a third of it (renew)"),
        ("connect_timeout", f"{CONNECTION_KWARGS.get('connect_timeout')}s"),
        (
            "tcp keepalives",
            f"idle {CONNECTION_KWARGS.get('keepalives_idle')}s, interval "
            f"{CONNECTION_KWARGS.get('keepalives_interval')}s, count "
            f"{CONNECTION_KWARGS.get('keepalives_count')}",
        ),
        ("tcp_user_timeout", f"{CONNECTION_KWARGS.get('tcp_user_timeout')} ms"),
    ]
    summary = ", ".join(f"{name} {applied[name]}" for name in TIMEOUTS)
    return Check("timeouts", OK, f"in force on tenure's connections: {summary}", tuple(details))


def _show(conn: psycopg.Connection[Any], name: str) -> str:
    [(value,)] = conn.execute(b"SELECT current_setting(%s)", (name,)).fetchall()
    return str(value)


def _pooler(ctx: _Context) -> Check:
    conn = _conn(ctx)
    info = conn.info
    [(server_addr, server_port, port_setting)] = conn.execute(
        b"SELECT host(inet_server_addr()), inet_server_port(), current_setting('port')::int"
    ).fetchall()
    unix = info.host.startswith("/")
    client_port = int(info.port)
    if unix:
        server_side = f"socket port {port_setting}"
        moved = client_port != port_setting
    else:
        server_side = f"{server_addr}:{server_port}"
        moved = client_port != server_port or (
            bool(info.hostaddr) and server_addr is not None and info.hostaddr != server_addr
        )
    # Two client connections one after the other: without a pooler each gets a new server
    # process; a pooler hands the second one the server connection the first gave back.
    first, second = _backend_pid(ctx), _backend_pid(ctx)
    pooled = first == second
    details = [
        ("client connected to", f"{info.hostaddr or info.host}:{client_port}"),
        ("server was reached on", server_side),
        ("backend pids of two connections", f"{first}, {second}"),
    ]
    if not moved and not pooled:
        note = ""
        if client_port == PGBOUNCER_PORT:
            note = f" (port {PGBOUNCER_PORT} is PgBouncer's default, but PostgreSQL answers on it)"
        return Check("pooler", OK, f"direct connection to PostgreSQL{note}", tuple(details))
    # Only now ask for a PgBouncer admin console: a plain PostgreSQL would log the attempt
    # as an error (no database "pgbouncer").
    found, version, mode = _pgbouncer(ctx)
    if not found and not pooled:
        return Check(
            "pooler",
            OK,
            "a port mapping or TCP proxy in front of PostgreSQL (the addresses differ, but "
            "every connection gets its own server process): no connection pooler",
            tuple(details),
        )
    if not found:
        return Check(
            "pooler",
            WARN,
            "a connection pooler sits between this host and PostgreSQL (two connections "
            "were served by the same server process): probably PgBouncer; its pool mode is "
            "unknown",
            (*details, ("admin console", version)),
            _POOL_ADVICE,
        )
    details += [("pgbouncer", version), ("pool_mode", mode)]
    if mode == "session":
        return Check(
            "pooler", OK, f"{version} in session pooling mode: fine for tenure", tuple(details)
        )
    return Check("pooler", WARN, f"{version} in {mode} pooling mode", tuple(details), _POOL_ADVICE)


def _backend_pid(ctx: _Context) -> int:
    assert ctx.conninfo is not None
    kwargs = {**CONNECTION_KWARGS, "application_name": "tenure doctor", "prepare_threshold": None}
    with psycopg.connect(ctx.conninfo, **kwargs) as conn:
        [(pid,)] = conn.execute(b"SELECT pg_backend_pid()").fetchall()
        return int(pid)


_POOL_ADVICE = (
    "in transaction (or statement) pooling mode: (1) LISTEN/NOTIFY does not reach a client, "
    "so `tenure worker` and `tenure relay` only poll: give them a DSN to PostgreSQL directly "
    "or to a session-mode pool; (2) session settings made at connect (tenure's "
    "statement_timeout and lock_timeout) stay on whichever server connection ran them: other "
    "clients of the pool inherit them and tenure's connections may run without them; give "
    "tenure a pool of its own and set them per role (ALTER ROLE ... SET lock_timeout = '2s'); "
    "(3) psycopg prepares "
    "statements after 5 executions: PgBouncer older than 1.21 (or max_prepared_statements = 0) "
    "needs prepare_threshold=None on every connection"
)


def _pgbouncer(ctx: _Context) -> tuple[bool, str, str]:
    """Ask the PgBouncer admin console: ``(True, version, pool_mode)``, or ``(False, why
    not, "")`` when nothing answered as one (PostgreSQL itself, or a PgBouncer that does not
    let this user in: admin_users / stats_users)."""
    assert ctx.conninfo is not None
    admin = make_conninfo(
        ctx.conninfo, dbname="pgbouncer", application_name="tenure doctor", connect_timeout=5
    )
    try:
        conn = psycopg.connect(admin, autocommit=True)
    except psycopg.Error as exc:
        return False, f"not reachable for this user: {one_line(str(exc))}", ""
    try:
        # The admin console speaks only the simple query protocol: PQexec, not psycopg's
        # extended-protocol execute().
        version = _admin_value(conn, b"SHOW VERSION", 0)
        if version is None:
            return False, "the database named pgbouncer is not a PgBouncer admin console", ""
        mode = "unknown"
        res = conn.pgconn.exec_(b"SHOW CONFIG")
        if res.status == psycopg.pq.ExecStatus.TUPLES_OK:
            for row in range(res.ntuples):
                if res.get_value(row, 0) == b"pool_mode":
                    mode = (res.get_value(row, 1) or b"").decode()
        return True, version, mode
    finally:
        conn.close()


def _admin_value(conn: psycopg.Connection[Any], command: bytes, column: int) -> str | None:
    res = conn.pgconn.exec_(command)
    if res.status != psycopg.pq.ExecStatus.TUPLES_OK or res.ntuples == 0:
        return None
    value = res.get_value(0, column)
    return None if value is None else value.decode()


# -- text output ----------------------------------------------------------------------------

_MARK = {OK: "ok", WARN: "WARN", FAIL: "FAIL", SKIP: "skip"}


def render(checks: list[Check]) -> Iterator[str]:
    width = max(len(c.name) for c in checks)
    for check in checks:
        yield f"{_MARK[check.status]:<5} {check.name:<{width}}  {check.summary}"
        for key, value in check.details:
            yield f"{'':<5} {'':<{width}}    {key}: {value}"
        if check.advice:
            yield f"{'':<5} {'':<{width}}    -> {check.advice}"
