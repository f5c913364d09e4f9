#!/usr/bin/env python
"""Core benchmark: tenure's lease and fence operations against the same SQL via plain psycopg.

For each operation (acquire, renew, results.put with and without strict=True, fence, and
acquire while another execution holds the lease) and for 1 and 4 connections, three sides
run in the same process, in alternating rounds so that load from anything else on the
machine hits them alike:

* ``raw``: the exact SQL text tenure sends (``tenure.db.queries.queries(schema)[name]``) with
  the parameters it sends (recorded from one library call at setup), executed through a
  plain autocommit ``psycopg.Connection``, one per thread.
* ``tenure``: the library call. One client whose pool has as many connections as there are
  threads (``pool_size=1`` or ``4``), shared by the threads; ``fence`` runs on the caller's
  own connection, as it does in an application.
* ``seed``: the seed's original statements on the seed's original tables (a second
  reference: how much the safety tenure adds costs). The seed has no fence statement.

Every thread works on its own job keys, except the busy case, where all threads contend for
one key held by someone else. Round trips per operation are counted, not assumed: libpq's
protocol trace is switched on for the connections one operation can use and the server's
``ReadyForQuery`` messages (one per request/response cycle) are counted.

Run ``python bench/bench_core.py --help``; bench/README.md explains the output.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import math
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import Trace
from psycopg.types.json import Jsonb

import tenure
from tenure.db.dsn import describe, resolve
from tenure.db.queries import queries

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"

# The seed's tables and statements, verbatim except: `:name` placeholders become psycopg's
# `%(name)s`, and the acquire's `interval '30 seconds'` becomes a parameter so that the
# takeover case can use a TTL short enough for every attempt to find the lease expired.
# Unqualified names: the raw connections put the seed schema on their search_path.
SEED_DDL = b"""
create table job_leases (
  job_key text primary key,
  lease_owner uuid not null,
  lease_until timestamptz not null,
  fencing_token bigint not null
);
create table report_results (
  job_key text primary key,
  payload jsonb not null,
  applied_fencing_token bigint not null
);
"""
SEED_ACQUIRE = b"""
insert into job_leases (job_key, lease_owner, lease_until, fencing_token)
values (%(job_key)s, %(owner)s, clock_timestamp() + %(ttl)s, 1)
on conflict (job_key) do update
set lease_owner = excluded.lease_owner,
    lease_until = excluded.lease_until,
    fencing_token = job_leases.fencing_token + 1
where job_leases.lease_until < clock_timestamp()
returning fencing_token, lease_until;
"""
SEED_RENEW = b"""
update job_leases
set lease_until = clock_timestamp() + interval '30 seconds'
where job_key = %(job_key)s
  and lease_owner = %(owner)s
  and fencing_token = %(token)s
  and lease_until >= clock_timestamp()
returning lease_until;
"""
SEED_PUT = b"""
insert into report_results (job_key, payload, applied_fencing_token)
values (%(job_key)s, %(payload)s, %(token)s)
on conflict (job_key) do update
set payload = excluded.payload,
    applied_fencing_token = excluded.applied_fencing_token
where report_results.applied_fencing_token < excluded.applied_fencing_token;
"""

CONNECTIONS = (1, 4)
# Takeover case: each thread cycles over this many keys with the smallest TTL tenure accepts,
# so a key is always expired when its turn comes again (that would need >50,000 commits per
# second per thread to fail; the run stops with an error if it ever does).
KEYS_PER_WORKER = 512
TAKEOVER_TTL = 0.01
HOLD_TTL = 3600.0  # leases held for the whole run (renew, put, fence, the busy holder)
BUSY_TTL = 30.0  # what a contender asks for: the seed's 30 seconds
PAYLOAD = {"report": "daily", "rows": 1234, "ok": True}
TRACE_OPS = 20
TARGET = 1.25

Op = Callable[[], None]
Params = dict[str, Any]


class BenchError(Exception):
    """An operation did not have the outcome its case is built for."""


@dataclass
class Env:
    dsn: str
    schema: str
    seed_schema: str
    admin: psycopg.Connection[Any]
    # One plain connection per thread: the raw and seed sides, and the caller's own
    # connection for fence on both the raw and the tenure side.
    raw: list[psycopg.Connection[Any]]
    clients: dict[int, tenure.Client]
    q: dict[str, bytes]
    tokens: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    attempt: int = 0  # part of the held keys' names, so a case measured again starts fresh
    # The parameters the library sent with each query, recorded once (see record_sent):
    # the raw side replays them, changing only the job key, owner, token and payload.
    sent: dict[str, Params] = field(default_factory=dict)


Factory = Callable[[Env, int, int], Op]  # (env, connections, worker index) -> one operation


@dataclass(frozen=True)
class Case:
    name: str
    sides: dict[str, Factory]


@dataclass
class Measured:
    ops: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # this process's CPU seconds (all threads): the client-side cost
    wal_bytes: int = 0
    per_round: list[float] = field(default_factory=list)  # ops/s in each round

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.ops * 1e6 if self.ops else 0.0


@dataclass
class Row:
    case: str
    conns: int
    sides: dict[str, Measured]
    round_trips: dict[str, float]  # side -> round trips per operation (1-connection run)
    statements: dict[str, float]  # side -> statements per operation

    @property
    def cost(self) -> float:
        """tenure's time per operation over raw's (1.00: no overhead): the median over the
        rounds of raw's rate over tenure's in the same round. Pairing rounds that ran a
        moment apart, and taking the median, keeps a burst of load from other sessions on
        a shared server from deciding the ratio."""
        raw, lib = self.sides["raw"].per_round, self.sides["tenure"].per_round
        pairs = [r / t if t else math.inf for r, t in zip(raw, lib, strict=True)]
        return statistics.median(pairs) if pairs else math.nan


# -- the operations -------------------------------------------------------------------------


def _keys(prefix: str, w: int) -> Iterator[str]:
    return itertools.cycle([f"acq-{prefix}-{w}-{i}" for i in range(KEYS_PER_WORKER)])


def raw_acquire(env: Env, n: int, w: int) -> Op:
    conn, q, keys, sent = env.raw[w], env.q["acquire"], _keys("raw", w), env.sent["takeover"]

    def op() -> None:
        key = next(keys)
        rows = conn.execute(q, {**sent, "job_key": key, "owner": uuid.uuid4()}).fetchall()
        if not rows[0][0]:
            raise BenchError(f"raw acquire found {key!r} still held")

    return op


def tenure_acquire(env: Env, n: int, w: int) -> Op:
    client, keys = env.clients[n], _keys("tenure", w)

    def op() -> None:
        key = next(keys)
        if client.acquire(key, ttl=TAKEOVER_TTL) is None:
            raise BenchError(f"client.acquire found {key!r} still held")

    return op


def seed_acquire(env: Env, n: int, w: int) -> Op:
    conn, keys = env.raw[w], _keys("seed", w)
    ttl = dt.timedelta(seconds=TAKEOVER_TTL)

    def op() -> None:
        key = next(keys)
        rows = conn.execute(
            SEED_ACQUIRE, {"job_key": key, "owner": uuid.uuid4(), "ttl": ttl}
        ).fetchall()
        if not rows:
            raise BenchError(f"seed acquire found {key!r} still held")

    return op


def _hold_raw(env: Env, w: int, key: str) -> tuple[uuid.UUID, int]:
    """Take a long lease with tenure's SQL on the raw connection: (owner, token)."""
    owner = uuid.uuid4()
    params = {**env.sent["hold"], "job_key": key, "owner": owner}
    row = env.raw[w].execute(env.q["acquire"], params).fetchone()
    if row is None or not row[0]:
        raise BenchError(f"could not take {key!r} for the raw side")
    return owner, int(row[1])


def _hold_tenure(env: Env, n: int, key: str) -> tenure.Lease:
    lease = env.clients[n].acquire(key, ttl=HOLD_TTL)
    if lease is None:
        raise BenchError(f"could not take {key!r} for the tenure side")
    return lease


def _hold_seed(env: Env, w: int, key: str) -> tuple[uuid.UUID, int]:
    owner = uuid.uuid4()
    params = {"job_key": key, "owner": owner, "ttl": dt.timedelta(seconds=HOLD_TTL)}
    row = env.raw[w].execute(SEED_ACQUIRE, params).fetchone()
    if row is None:
        raise BenchError(f"could not take {key!r} for the seed side")
    return owner, int(row[0])


def raw_renew(env: Env, n: int, w: int) -> Op:
    key = f"renew-raw-{n}-{w}-{env.attempt}"
    owner, token = _hold_raw(env, w, key)
    conn, q = env.raw[w], env.q["renew"]
    params = {**env.sent["renew"], "job_key": key, "owner": owner, "token": token}

    def op() -> None:
        if not conn.execute(q, params).fetchall():
            raise BenchError(f"raw renew of {key!r} refused")

    return op


def tenure_renew(env: Env, n: int, w: int) -> Op:
    lease = _hold_tenure(env, n, f"renew-tenure-{n}-{w}-{env.attempt}")

    def op() -> None:
        lease.renew()

    return op


def seed_renew(env: Env, n: int, w: int) -> Op:
    key = f"renew-seed-{n}-{w}-{env.attempt}"
    owner, token = _hold_seed(env, w, key)
    conn, params = env.raw[w], {"job_key": key, "owner": owner, "token": token}

    def op() -> None:
        if not conn.execute(SEED_RENEW, params).fetchall():
            raise BenchError(f"seed renew of {key!r} refused")

    return op


def raw_put(env: Env, n: int, w: int) -> Op:
    key = f"put-raw-{n}-{w}-{env.attempt}"
    _, token = _hold_raw(env, w, key)
    conn, q, sent = env.raw[w], env.q["result_put"], env.sent["result_put"]

    def op() -> None:
        params = {**sent, "job_key": key, "payload": Jsonb(PAYLOAD), "token": token}
        row = conn.execute(q, params).fetchone()
        if row is None or row[0] is None:
            raise BenchError(f"raw result_put of {key!r} refused")

    return op


def tenure_put(env: Env, n: int, w: int) -> Op:
    key = f"put-tenure-{n}-{w}-{env.attempt}"
    lease = _hold_tenure(env, n, key)
    results = env.clients[n].results

    def op() -> None:
        results.put(key, PAYLOAD, token=lease.token)

    return op


def raw_put_strict(env: Env, n: int, w: int) -> Op:
    key = f"strict-raw-{n}-{w}-{env.attempt}"
    _, token = _hold_raw(env, w, key)
    conn, q, sent = env.raw[w], env.q["result_put_strict"], env.sent["result_put_strict"]

    def op() -> None:
        params = {**sent, "job_key": key, "payload": Jsonb(PAYLOAD), "token": token}
        row = conn.execute(q, params).fetchone()
        if row is None or row[0] is None:
            raise BenchError(f"raw result_put_strict of {key!r} refused")

    return op


def tenure_put_strict(env: Env, n: int, w: int) -> Op:
    key = f"strict-tenure-{n}-{w}-{env.attempt}"
    lease = _hold_tenure(env, n, key)
    results = env.clients[n].results

    def op() -> None:
        results.put(key, PAYLOAD, token=lease.token, strict=True)

    return op


def seed_put(env: Env, n: int, w: int) -> Op:
    # The seed's store refuses a second write with the same token (`<`), so every write
    # brings a newer one; the seed's tables do not check that a token was issued.
    key, conn, tokens = f"put-seed-{n}-{w}-{env.attempt}", env.raw[w], env.tokens

    def op() -> None:
        params = {"job_key": key, "payload": Jsonb(PAYLOAD), "token": next(tokens)}
        if conn.execute(SEED_PUT, params).rowcount != 1:
            raise BenchError(f"seed result write of {key!r} refused")

    return op


def raw_fence(env: Env, n: int, w: int) -> Op:
    key = f"fence-raw-{n}-{w}-{env.attempt}"
    _, token = _hold_raw(env, w, key)
    conn, q = env.raw[w], env.q["fence"]
    params = {**env.sent["fence"], "job_key": key, "token": token}

    def op() -> None:
        with conn.transaction():
            row = conn.execute(q, params).fetchone()
            if row is None or row[0] is None:
                raise BenchError(f"raw fence of {key!r} refused")

    return op


def tenure_fence(env: Env, n: int, w: int) -> Op:
    key = f"fence-tenure-{n}-{w}-{env.attempt}"
    lease = _hold_tenure(env, n, key)
    conn, schema = env.raw[w], env.schema

    def op() -> None:
        with conn.transaction():
            tenure.fence(conn, key, lease.token, schema=schema)

    return op


def raw_busy(env: Env, n: int, w: int) -> Op:
    conn, q, sent = env.raw[w], env.q["acquire"], env.sent["busy"]

    def op() -> None:
        rows = conn.execute(q, {**sent, "job_key": "busy", "owner": uuid.uuid4()}).fetchall()
        if rows[0][0]:
            raise BenchError("raw acquire took the busy lease")

    return op


def tenure_busy(env: Env, n: int, w: int) -> Op:
    client = env.clients[n]

    def op() -> None:
        if client.acquire("busy", ttl=BUSY_TTL) is not None:
            raise BenchError("client.acquire took the busy lease")

    return op


def seed_busy(env: Env, n: int, w: int) -> Op:
    conn, ttl = env.raw[w], dt.timedelta(seconds=BUSY_TTL)

    def op() -> None:
        params = {"job_key": "busy", "owner": uuid.uuid4(), "ttl": ttl}
        if conn.execute(SEED_ACQUIRE, params).fetchall():
            raise BenchError("the seed's acquire took the busy lease")

    return op


CASES = (
    Case("acquire", {"raw": raw_acquire, "tenure": tenure_acquire, "seed": seed_acquire}),
    Case("renew", {"raw": raw_renew, "tenure": tenure_renew, "seed": seed_renew}),
    Case("results.put", {"raw": raw_put, "tenure": tenure_put, "seed": seed_put}),
    Case("results.put strict", {"raw": raw_put_strict, "tenure": tenure_put_strict}),
    Case("fence", {"raw": raw_fence, "tenure": tenure_fence}),
    Case("acquire (busy)", {"raw": raw_busy, "tenure": tenure_busy, "seed": seed_busy}),
)


# -- what the library sends ------------------------------------------------------------------


@contextmanager
def recording() -> Iterator[list[tuple[Any, Params]]]:
    """Record the (query, parameters) of every ``psycopg.Cursor.execute`` meanwhile (what
    ``Connection.execute`` calls too; the client runs its statements on a cursor it keeps
    per pooled connection).

    Used only during setup, with no other thread running queries.
    """
    seen: list[tuple[Any, Params]] = []
    original = psycopg.Cursor.execute

    def spy(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        if isinstance(params, dict):
            seen.append((query, dict(params)))
        return original(self, query, params, **kw)

    psycopg.Cursor.execute = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def sent_with(env: Env, name: str, call: Callable[[], object]) -> Params:
    """Call the library once; return the parameters it sent with the named query."""
    with recording() as seen:
        call()
    found = [params for query, params in seen if query == env.q[name]]
    if not found:
        raise BenchError(
            f"the library no longer sends tenure.db.queries' {name!r} query for this call: "
            "update bench/bench_core.py"
        )
    return found[-1]


def record_sent(env: Env) -> None:
    """What the library sends for each case, so the raw side replays the same SQL text with
    the same parameters (TTL, lock timeouts, fence options, ...), whatever they become."""
    client = env.clients[1]

    def probe() -> str:
        return f"probe-{uuid.uuid4()}"

    def takeover() -> None:
        client.acquire(probe(), ttl=TAKEOVER_TTL)

    env.sent["takeover"] = sent_with(env, "acquire", takeover)
    env.sent["hold"] = sent_with(env, "acquire", lambda: client.acquire(probe(), ttl=HOLD_TTL))
    env.sent["busy"] = sent_with(env, "acquire", lambda: client.acquire("busy", ttl=BUSY_TTL))
    lease = _hold_tenure(env, 1, probe())
    env.sent["renew"] = sent_with(env, "renew", lease.renew)
    env.sent["result_put"] = sent_with(
        env, "result_put", lambda: client.results.put(lease.job_key, PAYLOAD, token=lease.token)
    )
    env.sent["result_put_strict"] = sent_with(
        env,
        "result_put_strict",
        lambda: client.results.put(lease.job_key, PAYLOAD, token=lease.token, strict=True),
    )

    def fence() -> None:
        with env.raw[0].transaction():
            tenure.fence(env.raw[0], lease.job_key, lease.token, schema=env.schema)

    env.sent["fence"] = sent_with(env, "fence", fence)


# -- measuring ------------------------------------------------------------------------------


def run_timed(ops: Sequence[Op], seconds: float) -> tuple[int, float, float]:
    """Run each op in its own thread, as often as it can for ``seconds``:
    (operations, elapsed seconds, process CPU seconds)."""
    counts = [0] * len(ops)
    errors: list[BaseException] = []
    gate = threading.Barrier(len(ops) + 1)
    deadline = [0.0]

    def work(i: int, op: Op) -> None:
        gate.wait()
        end, done = deadline[0], 0
        try:
            while time.perf_counter() < end:
                op()
                done += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        counts[i] = done

    threads = [
        threading.Thread(target=work, args=(i, op), name=f"bench-{i}", daemon=True)
        for i, op in enumerate(ops)
    ]
    for thread in threads:
        thread.start()
    cpu = time.process_time()
    start = time.perf_counter()
    deadline[0] = start + seconds
    gate.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    if errors:
        raise errors[0]
    return sum(counts), elapsed, cpu


def wal_position(env: Env) -> int:
    row = env.admin.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
    ).fetchone()
    assert row is not None
    return int(row[0])


def count_round_trips(
    conns: Sequence[psycopg.Connection[Any]], op: Op, times: int = TRACE_OPS
) -> tuple[float, float]:
    """Run ``op`` with libpq's protocol trace on ``conns``: (round trips, statements) per op.

    A round trip is a server ``ReadyForQuery`` (the client waits for one after every
    request it sends); a statement is a ``Query`` or an extended-protocol ``Execute``.
    """
    files = []
    for conn in conns:
        # psycopg hands the descriptor to libpq (fdopen); libpq flushes it on untrace.
        trace_file = tempfile.TemporaryFile("w+b")  # noqa: SIM115 - closed below
        conn.pgconn.trace(trace_file.fileno())
        conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        files.append(trace_file)
    try:
        for _ in range(times):
            op()
    finally:
        for conn in conns:
            conn.pgconn.untrace()
    round_trips = statements = 0
    for trace_file in files:
        with trace_file:
            trace_file.seek(0)
            for line in trace_file.read().decode("utf-8", "replace").splitlines():
                parts = line.split("\t")
                if len(parts) < 3:
                    continue
                if parts[0] == "B" and parts[2] == "ReadyForQuery":
                    round_trips += 1
                elif parts[0] == "F" and parts[2] in ("Query", "Execute"):
                    statements += 1
    if not round_trips:
        raise BenchError("the protocol trace saw no traffic: cannot count round trips")
    return round_trips / times, statements / times


def assigns_xid(conn: psycopg.Connection[Any], stmt: bytes, params: Params) -> bool:
    """Whether ``stmt`` makes its transaction take a transaction id: PostgreSQL assigns one
    on the first write, and a row lock is a write (xmax), so no xid means no write, no row
    lock and no commit record. The transaction is rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute(stmt, params)
        row = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
    return row is not None and row[0] is not None


def fill_pool(client: tenure.Client, n: int) -> None:
    """Open all ``n`` pool connections now: n threads each hold one until all have one."""
    gate = threading.Barrier(n)

    def hold() -> None:
        with client.connection():
            gate.wait(timeout=30)

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def retrying(env: Env, case: Case, n: int, seconds: float, rounds: int, tries: int = 3) -> Row:
    """Measure a case; measure it again if a connection was terminated meanwhile (the
    server is shared: other sessions' fault tests may terminate every connection named
    'tenure', which is what tenure's pool calls its connections)."""
    for attempt in itertools.count(1):
        try:
            return measure(env, case, n, seconds, rounds)
        except (psycopg.OperationalError, tenure.DatabaseUnavailable) as exc:
            if attempt >= tries:
                raise
            print(
                f"({case.name}, {n} conn(s): a connection failed ({exc}); measuring again)",
                file=sys.stderr,
            )
            env.attempt += 1
            for w, conn in enumerate(env.raw):
                if conn.closed or conn.broken:
                    conn.close()
                    env.raw[w] = psycopg.connect(env.dsn, **raw_kwargs(env.seed_schema))
    raise AssertionError("unreachable")


def raw_kwargs(seed_schema: str) -> dict[str, Any]:
    # search_path only matters to the seed's unqualified statements; tenure's SQL names its
    # schema.
    return {"autocommit": True, "options": f"-c search_path={seed_schema}"}


def measure(env: Env, case: Case, n: int, seconds: float, rounds: int) -> Row:
    if n > 1:
        fill_pool(env.clients[n], n)  # again: terminated connections are replaced lazily
    sides = list(case.sides)
    ops = {side: [case.sides[side](env, n, w) for w in range(n)] for side in sides}
    for side_ops in ops.values():  # past psycopg's prepare threshold (5), connections warm
        for op in side_ops:
            for _ in range(8):
                op()
    measured = {side: Measured() for side in sides}
    for r in range(rounds):
        # Rotate the order so no side always runs first (or right after another one).
        for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
            wal_before = wal_position(env)
            done, elapsed, cpu = run_timed(ops[side], seconds / rounds)
            measured[side].wal_bytes += wal_position(env) - wal_before
            measured[side].ops += done
            measured[side].seconds += elapsed
            measured[side].cpu += cpu
            measured[side].per_round.append(done / elapsed)
    round_trips: dict[str, float] = {}
    statements: dict[str, float] = {}
    if n == 1:
        # Trace every connection the operation could use: the thread's own connection and
        # the one connection of the pool_size=1 client.
        with env.clients[1].connection() as pooled:
            pass
        for side in ("raw", "tenure"):
            round_trips[side], statements[side] = count_round_trips(
                [env.raw[0], pooled], ops[side][0]
            )
    return Row(case.name, n, measured, round_trips, statements)


# -- setup ----------------------------------------------------------------------------------


def pick_dsn(given: str | None) -> tuple[str, str]:
    if given:
        return given, "--dsn"
    if os.environ.get("TENURE_DSN"):
        return os.environ["TENURE_DSN"], "$TENURE_DSN"
    try:
        psycopg.connect(DEFAULT_DSN, connect_timeout=3).close()
        return DEFAULT_DSN, "default"
    except psycopg.OperationalError:
        return resolve(None)  # $DATABASE_URL, else the embedded server


def setup(dsn: str, schema: str, seed_schema: str) -> Env:
    admin = psycopg.connect(dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(seed_schema)))
    admin.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(seed_schema)))
    admin.execute(SEED_DDL)
    clients = {1: tenure.connect(dsn, schema=schema, pool_size=1, migrate=True)}
    clients[4] = tenure.connect(dsn, schema=schema, pool_size=4)
    fill_pool(clients[4], 4)
    raw = [psycopg.connect(dsn, **raw_kwargs(seed_schema)) for _ in range(max(CONNECTIONS))]
    env = Env(dsn, schema, seed_schema, admin, raw, clients, queries(schema))
    # The takeover keys exist and are expired before the first attempt, so every timed
    # acquire is a takeover (an UPDATE), never the first INSERT of a key.
    workers = max(CONNECTIONS)
    for prefix in ("raw", "tenure"):
        params = {"p": prefix, "workers": workers, "k": KEYS_PER_WORKER}
        admin.execute(
            sql.SQL(
                "INSERT INTO {s}.job_leases (job_key, lease_owner, lease_until, fencing_token,"
                " lease_ttl, acquired_at, renewed_at)"
                " SELECT format('acq-%%s-%%s-%%s', %(p)s::text, w, i), gen_random_uuid(),"
                " now() - interval '1 hour', 1, interval '1 second', now(), now()"
                " FROM generate_series(0, %(workers)s - 1) w, generate_series(0, %(k)s - 1) i"
            ).format(s=sql.Identifier(schema)),
            params,
        )
        admin.execute(
            sql.SQL(
                "INSERT INTO {s}.job_state (job_key, token)"
                " SELECT job_key, fencing_token FROM {s}.job_leases"
                " WHERE job_key LIKE 'acq-' || %(p)s || '-%%'"
            ).format(s=sql.Identifier(schema)),
            params,
        )
    admin.execute(
        sql.SQL(
            "INSERT INTO {s}.job_leases (job_key, lease_owner, lease_until, fencing_token)"
            " SELECT format('acq-seed-%%s-%%s', w, i), gen_random_uuid(),"
            " now() - interval '1 hour', 1"
            " FROM generate_series(0, %(workers)s - 1) w, generate_series(0, %(k)s - 1) i"
        ).format(s=sql.Identifier(seed_schema)),
        {"workers": workers, "k": KEYS_PER_WORKER},
    )
    # The busy case's holder: another execution, holding the key for the whole run.
    _hold_tenure(env, 1, "busy")
    _hold_seed(env, 0, "busy")
    record_sent(env)
    return env


def teardown(env: Env | None, dsn: str, schemas: Sequence[str]) -> None:
    if env is not None:
        for client in env.clients.values():
            client.close()
        for conn in env.raw:
            conn.close()
        env.admin.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


# -- output ---------------------------------------------------------------------------------


def _rate(m: Measured | None) -> str:
    return "-" if m is None else f"{m.rate:,.0f}"


def print_table(rows: Sequence[Row]) -> None:
    trips = {row.case: row for row in rows if row.conns == 1}
    header = (
        "operation",
        "conns",
        "raw ops/s",
        "tenure ops/s",
        "ratio",
        "rt/op",
        "cpu us/op raw",
        "tenure",
        "seed ops/s",
        "raw/seed",
    )
    table = [header]
    for row in rows:
        raw, lib, seed = row.sides["raw"], row.sides["tenure"], row.sides.get("seed")
        table.append(
            (
                row.case,
                str(row.conns),
                _rate(raw),
                _rate(lib),
                f"{row.cost:.2f}x",
                f"{trips[row.case].round_trips['tenure']:g}",
                f"{raw.cpu_us:.0f}",
                f"{lib.cpu_us:.0f}",
                _rate(seed),
                "-" if seed is None or not seed.rate else f"{raw.rate / seed.rate:.2f}x",
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for i, line in enumerate(table):
        cells = [c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(line)]
        print("  ".join(cells))
        if i == 0:
            print("  ".join("-" * w for w in widths))


LEGEND = f"""
ratio      raw ops/s / tenure ops/s, the median over the rounds: tenure's time per
           operation relative to the same SQL and parameters through plain psycopg
           (target <= {TARGET:.2f}x)
rt/op      round trips per tenure call, counted in libpq's protocol trace (1-connection
           run); fence's 3 are the caller's BEGIN, the fence statement and COMMIT
cpu us/op  this process's CPU time per operation, raw and tenure: the client-side cost,
           which load from other sessions on the server does not blur
raw/seed   tenure's SQL against the seed's original statements, both through psycopg"""


def report(env: Env, rows: Sequence[Row]) -> bool:
    """Print the table and the checks; False if a round-trip or no-write check failed."""
    print_table(rows)
    print(LEGEND)
    ok = True
    print()
    print("checks:")
    for row in rows:
        if row.conns != 1:
            continue
        rt, st = row.round_trips, row.statements
        own = 3.0 if row.case == "fence" else 1.0  # fence: the caller's BEGIN and COMMIT
        good = rt["tenure"] == rt["raw"] == own and st["tenure"] == st["raw"]
        ok = ok and good
        print(
            f"  {'ok  ' if good else 'FAIL'} {row.case}: {rt['tenure']:g} round trip(s) and "
            f"{st['tenure']:g} statement(s) per call (the raw SQL: {rt['raw']:g} and "
            f"{st['raw']:g})"
        )
    over = [row for row in rows if row.cost > TARGET]
    print(
        f"  {'ok  ' if not over else 'MISS'} ratio <= {TARGET:.2f}x in "
        f"{len(rows) - len(over)} of {len(rows)} rows"
        + ("" if not over else ": " + ", ".join(f"{r.case}/{r.conns}" for r in over))
    )
    busy = [row for row in rows if row.case == "acquire (busy)"]
    if busy:
        ok = report_busy(env, busy) and ok
    return ok


def statement_wal(conn: psycopg.Connection[Any], stmt: bytes, params: Params) -> tuple[int, int]:
    """(WAL records, WAL bytes) that one run of ``stmt`` writes, from its own plan
    (EXPLAIN (ANALYZE, WAL)), so other sessions on the server do not count. Each top-level
    ModifyTable node (the statement's own, or a data-modifying CTE's) counts once; the commit
    record, the same for any statement that writes, is not included."""
    conn.execute(b"BEGIN")
    try:
        row = conn.execute(b"EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + stmt, params).fetchone()
    finally:
        conn.execute(b"COMMIT")
    assert row is not None
    records = size = 0
    stack = [row[0][0]["Plan"]]
    while stack:
        node = stack.pop()
        if node["Node Type"] == "ModifyTable":
            records += node.get("WAL Records", 0)
            size += node.get("WAL Bytes", 0)
        else:
            stack.extend(node.get("Plans", []))
    return records, size


def report_takeover(env: Env) -> None:
    """What a takeover writes: tenure's acquire (the lease row and, for strict fencing, the
    job-state row) against the seed's upsert (the lease row only). Counted, not timed."""
    ttl = dt.timedelta(milliseconds=1)
    ours: list[tuple[int, int]] = []
    seeds: list[tuple[int, int]] = []
    for i in range(5):
        for stmt, found, params in (
            (env.q["acquire"], ours, {"lock_timeout": "1000"}),
            (SEED_ACQUIRE, seeds, {}),
        ):
            base = {"job_key": f"wal-{i}", "ttl": ttl, **params}
            statement_wal(env.raw[0], stmt, {**base, "owner": uuid.uuid4()})  # first insert
            time.sleep(0.005)  # the 1 ms lease expires: the next one is a takeover
            found.append(statement_wal(env.raw[0], stmt, {**base, "owner": uuid.uuid4()}))
    (our_records, our_bytes), (seed_records, seed_bytes) = (
        (statistics.median(r for r, _ in got), statistics.median(b for _, b in got))
        for got in (ours, seeds)
    )
    print()
    print("takeover cost (one statement's own WAL, EXPLAIN ANALYZE WAL, median of 5; commit")
    print("record excluded, the same for both):")
    print(
        f"  tenure's acquire: {our_records:g} WAL records, {our_bytes:g} bytes (the lease row, "
        "the job-state row that strict fencing moves to the new token, and the takeover's "
        "lease event with its two index entries)"
    )
    print(
        f"  the seed's upsert: {seed_records:g} WAL records, {seed_bytes:g} bytes (the lease row)"
    )


def report_busy(env: Env, rows: Sequence[Row]) -> bool:
    params = {**env.sent["busy"], "job_key": "busy", "owner": uuid.uuid4()}
    ours = assigns_xid(env.admin, env.q["acquire"], params)
    free = assigns_xid(env.admin, env.q["acquire"], {**params, "job_key": "xid-probe"})
    seeds = assigns_xid(
        env.admin,
        SEED_ACQUIRE,
        {"job_key": "busy", "owner": uuid.uuid4(), "ttl": dt.timedelta(seconds=BUSY_TTL)},
    )
    print()
    print("busy contender (the lease is held by another execution; all threads on one key):")
    for row in rows:
        raw, seed, lib = row.sides["raw"], row.sides["seed"], row.sides["tenure"]
        print(
            f"  {row.conns} conn(s): tenure's SQL answers busy at {raw.rate:,.0f}/s, the seed's "
            f"upsert at {seed.rate:,.0f}/s: {raw.rate / seed.rate:.2f}x; client.acquire at "
            f"{lib.rate:,.0f}/s: {lib.rate / seed.rate:.2f}x the seed's"
        )
        print(
            "     WAL bytes per answer (server-wide LSN delta, other sessions included): "
            f"tenure's SQL {raw.wal_bytes / max(raw.ops, 1):.0f}, client.acquire "
            f"{lib.wal_bytes / max(lib.ops, 1):.0f}, the seed's upsert "
            f"{seed.wal_bytes / max(seed.ops, 1):.0f}"
        )

    def says(wrote: bool) -> str:
        return "takes a transaction id (writes)" if wrote else "takes no transaction id"

    print(f"  tenure's acquire on a held lease {says(ours)}: no write, no row lock, no flush")
    print(f"  the seed's upsert on a held lease {says(seeds)}: a row lock and a commit record")
    print(f"  (check of the check: tenure's acquire of a free key {says(free)})")
    good = not ours and seeds and free
    print(f"  {'ok  ' if good else 'FAIL'} a busy answer from tenure writes nothing")
    return good


def reference_loop() -> float:
    """Milliseconds a fixed pure-Python loop takes (best of 5): how fast this machine is
    right now, printed beside the rows so that runs on a shared machine can be compared."""
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - start)
    assert total > 0
    return best * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="tenure's acquire, renew, results.put and fence against the same SQL "
        "through plain psycopg (and the seed's original statements), with 1 and 4 connections."
    )
    parser.add_argument(
        "--dsn",
        help="PostgreSQL to use (default: $TENURE_DSN, else 127.0.0.1:5432 user postgres if it "
        "answers, else $DATABASE_URL, else the embedded server)",
    )
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="time per side per case (default 3)"
    )
    parser.add_argument(
        "--rounds", type=int, default=6, help="alternating rounds per case (default 6)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 0.5 s per side per case, one round"
    )
    args = parser.parse_args(argv)
    seconds, rounds = (0.5, 1) if args.quick else (args.seconds, args.rounds)
    if seconds <= 0 or rounds < 1:
        parser.error("--seconds must be positive and --rounds at least 1")

    dsn, source = pick_dsn(args.dsn)
    suffix = secrets.token_hex(4)
    schema, seed_schema = f"bench_{suffix}", f"bench_{suffix}_seed"
    env: Env | None = None
    try:
        env = setup(dsn, schema, seed_schema)
        info = env.admin.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit')"
        ).fetchone()
        assert info is not None
        print(
            f"tenure {tenure.__version__}, psycopg {psycopg.__version__}, PostgreSQL {info[0]} "
            f"(synchronous_commit={info[1]}) at {describe(dsn)} ({source}); "
            f"{os.cpu_count()} CPUs; schema {schema}"
        )
        print(f"{seconds:g} s per side per case in {rounds} alternating round(s)")
        print()
        before = reference_loop()
        rows = [retrying(env, case, n, seconds, rounds) for case in CASES for n in CONNECTIONS]
        after = reference_loop()
        ok = report(env, rows)
        print()
        print(
            f"reference: a fixed Python loop took {before:.1f} ms before the rows and "
            f"{after:.1f} ms after them (best of 5; lower is a faster machine)"
        )
        report_takeover(env)
    finally:
        teardown(env, dsn, (schema, seed_schema))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
