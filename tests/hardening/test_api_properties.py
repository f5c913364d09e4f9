"""Property: the public API, driven with generated hostile input, raises nothing but the
documented :class:`tenure.InvalidArgument` (:class:`tenure.InvalidArgumentType` for a wrong
type) for what it refuses, accepts what the documented rules allow, and never changes rows
that were stored before.

The rules are restated in :mod:`tests.hardening.hostile` (``valid_text``, ``valid_schema``,
``valid_topic``, ``payload_ok``), from the README's "Limits and guarantees", not from the
code under test.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import tenure
from tenure.validation import MAX_DURATION
from tests.hardening.hostile import (
    SEEDED_KEY,
    Seeded,
    examples,
    has_float,
    hostile_crons,
    hostile_durations,
    hostile_payloads,
    hostile_text,
    hostile_zones,
    payload_ok,
    tried,
    valid_schema,
    valid_text,
    valid_topic,
    wrong_types,
)

SEEDED_KEYS = {SEEDED_KEY, "seeded-job", "seeded-schedule"}


def outcome(call: Callable[[], Any]) -> BaseException | None:
    """Run ``call``; the exception it raised, if any."""
    try:
        call()
    except BaseException as exc:  # the property is about which ones
        return exc
    return None


def refused_as_documented(exc: BaseException | None, *, wrong_type: bool) -> None:
    assert isinstance(exc, tenure.InvalidArgument), repr(exc)
    assert isinstance(exc, tenure.TenureError) and isinstance(exc, ValueError)
    if wrong_type:
        assert isinstance(exc, tenure.InvalidArgumentType) and isinstance(exc, TypeError)
    message = str(exc)
    assert message and "\n" not in message, message


def _is_duration_type(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float | str | dt.timedelta)


# -- durations --------------------------------------------------------------------------------


@settings(max_examples=examples(300))
@given(value=hostile_durations)
@example(value=float("nan"))
@example(value=10**400)
@example(value=dt.timedelta.max)
@example(value="99999999999d")
@example(value="٣s")
@example(value=True)
def test_durations_are_bounded_or_refused(value: object) -> None:
    tried("api: parse_duration")
    try:
        seconds = tenure.parse_duration(value)  # type: ignore[arg-type]
    except tenure.InvalidArgument as exc:
        refused_as_documented(exc, wrong_type=not _is_duration_type(value))
        return
    assert math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION, seconds


@settings(max_examples=examples(150))
@given(
    field=st.sampled_from(["every", "ttl", "misfire_grace", "shutdown_grace", "retention"]),
    value=hostile_durations,
)
def test_scheduler_durations_refused_only_with_invalid_argument(field: str, value: Any) -> None:
    tried("api: Scheduler durations")
    if field in ("every", "misfire_grace"):
        assume(value is not None)  # None: not given

    def call() -> None:
        if field == "shutdown_grace":
            tenure.Scheduler(shutdown_grace=value)
        elif field == "retention":
            tenure.Scheduler(history_retention=value)
        elif field == "every":
            tenure.Scheduler().job("k", every=value)(lambda ctx: None)
        else:
            kwargs = {field: value}
            tenure.Scheduler().job("k", every="1m", **kwargs)(lambda ctx: None)

    exc = outcome(call)
    if exc is not None:
        refused_as_documented(exc, wrong_type=not _is_duration_type(value))


# -- cron strings and time zones --------------------------------------------------------------


@settings(max_examples=examples(300))
@given(cron=hostile_crons, timezone=st.one_of(st.none(), hostile_zones))
@example(cron="0 2 * * *", timezone="../../etc/passwd")
@example(cron="0 2 * * *", timezone="Europe/Berlin\x00")
@example(cron="0 2 * * *", timezone=["Europe/Berlin"])
def test_cron_and_timezone_refused_or_schedulable(cron: Any, timezone: Any) -> None:
    tried("api: cron and timezone")
    app = tenure.Scheduler()
    try:
        spec = app.add_job("k", lambda ctx: None, cron=cron, timezone=timezone)
    except tenure.InvalidArgument as exc:
        refused_as_documented(exc, wrong_type=False)
        return
    # Accepted: the schedule yields increasing slots.
    start = dt.datetime(2024, 3, 30, 23, 0, tzinfo=dt.UTC)
    first = spec.schedule.next_after(start)
    assert first > start and spec.schedule.next_after(first) > first


# -- keys, through every client method --------------------------------------------------------


@settings(max_examples=examples(30))
@given(key=st.one_of(hostile_text, wrong_types))
@example(key="\ud800")
@example(key="k" * 201)
@example(key="a\x00b")
@example(key="%s'\"{schema}")
def test_job_keys_refused_or_round_trip(seeded: Seeded, key: Any) -> None:
    tried("api: job keys")
    assume(not (isinstance(key, str) and key in SEEDED_KEYS))
    client = seeded.client
    if not valid_text(key, 200):
        wrong_type = not isinstance(key, str)
        for call in (
            lambda: client.acquire(key),
            lambda: client.inspect(key),
            lambda: client.release(key),
            lambda: client.lease(key),
            lambda: client.results.get(key),
            lambda: client.results.put(key, {}, token=seeded.token),
        ):
            refused_as_documented(outcome(call), wrong_type=wrong_type)
    else:
        lease = client.acquire(key, ttl=60)
        assert lease is not None and client.inspect(key) is not None
        client.results.put(key, {"k": key}, token=lease.token)
        stored = client.results.get(key)
        assert stored is not None and stored.payload == {"k": key}
        assert client.release(key) == lease.token
    seeded.check()


# -- payloads ---------------------------------------------------------------------------------


@settings(max_examples=examples(40))
@given(payload=hostile_payloads)
@example(payload={"a": "\x00"})
@example(payload={"\ud800": 1})
@example(payload=[float("inf")])
def test_payloads_refused_or_stored_and_read_back(seeded: Seeded, payload: Any) -> None:
    tried("api: payloads")
    client = seeded.client
    if payload_ok(payload):
        lease = client.acquire("writable", ttl=60)
        assert lease is not None
        client.results.put("writable", payload, token=lease.token)
        stored = client.results.get("writable")
        assert stored is not None
        if not has_float(payload):  # jsonb keeps numbers as numeric: 1e300 comes back an int
            assert stored.payload == json.loads(json.dumps(payload))
        client.release("writable")
    else:
        exc = outcome(lambda: client.results.put(SEEDED_KEY, payload, token=seeded.token))
        refused_as_documented(exc, wrong_type=False)
        with psycopg.connect(seeded.dsn) as conn, conn.transaction():
            exc = outcome(
                lambda: tenure.outbox.enqueue(conn, "t", "m", payload, schema=seeded.schema)
            )
        refused_as_documented(exc, wrong_type=False)
    seeded.check()


# -- topics, outbox and inbox keys ------------------------------------------------------------


@settings(max_examples=examples(40))
@given(
    topic=st.one_of(hostile_text, wrong_types, st.just("report.ready")),
    key=st.one_of(hostile_text, wrong_types, st.just("k-ok")),
    consumer=st.one_of(hostile_text, wrong_types, st.just("billing")),
)
@example(topic="a\n", key="k", consumer="c")
@example(topic="ä", key="k", consumer="c")
def test_outbox_and_inbox_names_refused_or_accepted(
    seeded: Seeded, topic: Any, key: Any, consumer: Any
) -> None:
    tried("api: topics, outbox and inbox keys")
    ok = valid_topic(topic) and valid_text(key, 500)
    with psycopg.connect(seeded.dsn) as conn:
        with conn.transaction():
            exc = outcome(lambda: tenure.outbox.enqueue(conn, topic, key, {}, schema=seeded.schema))
            if ok:
                assert exc is None, repr(exc)
            else:
                # Checked in order: the topic first, then the key.
                wrong = not isinstance(topic, str) or (
                    valid_topic(topic) and not isinstance(key, str)
                )
                refused_as_documented(exc, wrong_type=wrong)
        with conn.transaction():
            exc = outcome(lambda: tenure.inbox.claim(conn, consumer, key, schema=seeded.schema))
            if valid_text(consumer, 200) and valid_text(key, 1000, blank_ok=True):
                assert exc is None, repr(exc)
            else:
                refused_as_documented(exc, wrong_type=False)
    if ok:
        assert topic in {m.topic for m in tenure.outbox.messages(seeded.client, topic=topic)}
    seeded.check()


# -- schema names -----------------------------------------------------------------------------


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                psycopg.sql.Identifier(schema)
            )
        )


@settings(max_examples=examples(6))
@given(name=st.one_of(hostile_text, wrong_types))
@example(name="a%b")
@example(name="é" * 31 + "x")  # 63 bytes
@example(name="é" * 32)  # 64 bytes
@example(name="pg_x")
@example(name="")
@example(name="\n")  # a comment of a migration that named {schema} ended at the newline
def test_schema_names_refused_or_usable(dsn: str, name: Any) -> None:
    tried("api: schema names")
    if not valid_schema(name):
        wrong_type = not isinstance(name, str)
        for call in (
            lambda: tenure.connect(dsn, schema=name),
            lambda: tenure.Scheduler(dsn, schema=name),
        ):
            refused_as_documented(outcome(call), wrong_type=wrong_type)
        return
    assert len(tenure.outbox.channel(name).encode()) <= 63
    try:
        with tenure.connect(dsn, schema=name, migrate=True) as client:
            lease = client.acquire("k", ttl=60)
            assert lease is not None
            client.results.put("k", [name], token=lease.token)
            stored = client.results.get("k")
            assert stored is not None and stored.payload == [name]
            with psycopg.connect(dsn) as conn, conn.transaction():
                tenure.fence(conn, "k", lease.token, schema=name)
                assert tenure.outbox.enqueue(conn, "t", "m", {}, schema=name)
                assert tenure.inbox.claim(conn, "c", "m", schema=name)
            assert client.migrate() == []
    finally:
        _drop(dsn, name)


# -- every argument of every entry point, with a value of the wrong kind ----------------------

# (entry point, argument, kind): kind says which values are of the right type.
ARGUMENTS = [
    ("connect", "dsn", "str"),
    ("connect", "schema", "str"),
    ("connect", "pool_size", "int"),
    ("connect", "application_name", "str"),
    ("acquire", "job_key", "str"),
    ("acquire", "ttl", "duration"),
    ("acquire", "safety_margin", "duration"),
    ("lease", "ttl", "duration"),
    ("lease", "wait", "duration"),
    ("put", "token", "int"),
    ("put", "conn", "conn"),
    ("fence", "conn", "conn"),
    ("fence", "job_key", "str"),
    ("fence", "token", "int"),
    ("fence", "schema", "str"),
    ("fence", "idle_timeout", "duration"),
    ("enqueue", "conn", "conn"),
    ("enqueue", "order_key", "str"),
    ("enqueue", "token", "int"),
    ("claim", "conn", "conn"),
    ("claim", "consumer", "str"),
    ("messages", "limit", "int"),
    ("messages", "ids", "any"),
    ("messages", "state", "any"),
    ("purge", "older_than", "duration"),
    ("purge", "ids", "any"),
    ("scheduler", "dsn", "str"),
    ("scheduler", "schema", "str"),
    ("scheduler", "concurrency", "int"),
    ("scheduler", "pool_size", "int"),
    ("job", "misfire", "any"),
    ("job", "on_crash", "any"),
    ("subscribe", "listener", "any"),
]


# Arguments for which None is a meaningful value (a default, "not given").
NONE_OK = {
    ("acquire", "safety_margin"),
    ("lease", "wait"),
    ("fence", "idle_timeout"),
    ("put", "conn"),
    ("enqueue", "order_key"),
    ("enqueue", "token"),
    ("messages", "ids"),
    ("messages", "state"),
    ("purge", "ids"),
    ("scheduler", "dsn"),
}


def _right_kind(kind: str, value: object) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "duration":
        return _is_duration_type(value)
    if kind == "conn":
        return isinstance(value, psycopg.Connection)
    return True  # "any": no type rule to check


def _invoke(
    seeded: Seeded, conn: psycopg.Connection[Any], entry: str, kwargs: dict[str, Any]
) -> None:
    client, schema = seeded.client, seeded.schema
    if entry == "connect":
        args = {"dsn": seeded.dsn, "schema": schema, **kwargs}
        with tenure.connect(**args):
            pass
    elif entry == "acquire":
        args = {"job_key": "scratch", "ttl": 30, **kwargs}
        lease = client.acquire(args.pop("job_key"), **args)
        if lease is not None:
            lease.release()
    elif entry == "lease":
        client.lease("scratch", **{"ttl": 30, **kwargs})
    elif entry == "put":
        c = kwargs.get("conn", conn)
        with conn.transaction(force_rollback=True):
            client.results.put("scratch-put", {}, token=kwargs.get("token", 1), conn=c)
    elif entry == "fence":
        args = {"conn": conn, "job_key": "scratch", "token": 1, "schema": schema, **kwargs}
        with conn.transaction(force_rollback=True):
            tenure.fence(args.pop("conn"), args.pop("job_key"), args.pop("token"), **args)
    elif entry == "enqueue":
        args = {"conn": conn, "schema": schema, "job_key": "scratch", "token": 1, **kwargs}
        with conn.transaction(force_rollback=True):
            tenure.outbox.enqueue(args.pop("conn"), "t", "scratch", {}, **args)
    elif entry == "claim":
        args = {"conn": conn, "consumer": "c", "schema": schema, **kwargs}
        with conn.transaction(force_rollback=True):
            tenure.inbox.claim(args.pop("conn"), args.pop("consumer"), "scratch", **args)
    elif entry == "messages":
        tenure.outbox.messages(client, **kwargs)
    elif entry == "purge":
        tenure.outbox.purge(client, **{"older_than": "1d", **kwargs})
    elif entry == "scheduler":
        tenure.Scheduler(**{"dsn": seeded.dsn, **kwargs})
    elif entry == "job":
        tenure.Scheduler().job("k", every="1m", **kwargs)(lambda ctx: None)
    elif entry == "subscribe":
        tenure.metrics.subscribe(kwargs["listener"])()
    else:  # pragma: no cover - the table above names every entry
        raise AssertionError(entry)


@settings(max_examples=examples(50))
@given(
    target=st.sampled_from(ARGUMENTS),
    value=st.one_of(wrong_types, hostile_text, hostile_durations),
)
@example(target=("fence", "conn", "conn"), value="not a connection")
@example(target=("connect", "dsn", "str"), value=12345)
@example(target=("connect", "pool_size", "int"), value=True)
@example(target=("put", "token", "int"), value=2**64)
@example(target=("messages", "ids", "any"), value=[2**70])
@example(target=("fence", "idle_timeout", "duration"), value="30d")
def test_every_argument_refuses_hostile_values_with_invalid_argument(
    seeded: Seeded, conn: psycopg.Connection[Any], target: tuple[str, str, str], value: Any
) -> None:
    tried("api: every argument, hostile value")
    entry, name, kind = target
    if entry == "connect" and name == "dsn":
        assume(value is not None)  # None means $TENURE_DSN or the embedded server
    exc = outcome(lambda: _invoke(seeded, conn, entry, {name: value}))
    if exc is not None:
        # Valid input may meet a runtime refusal (a busy or stale lease, a refused
        # connection); anything else must be the documented InvalidArgument.
        if isinstance(exc, tenure.LeaseBusy | tenure.StaleTokenError | tenure.DatabaseError):
            assert "\n" not in str(exc), str(exc)
        else:
            right = _right_kind(kind, value) or (value is None and (entry, name) in NONE_OK)
            refused_as_documented(exc, wrong_type=not right)
    seeded.check()


@pytest.mark.parametrize("conn_value", ["not a connection", None, 42])
def test_async_entry_points_refuse_a_sync_connection_or_other_object(
    conn: psycopg.Connection[Any], conn_value: Any
) -> None:
    import asyncio

    for value in (conn_value, conn):
        for coroutine in (
            tenure.fence_async(value, "k", 1),
            tenure.outbox.enqueue_async(value, "t", "k", {}),
            tenure.inbox.claim_async(value, "c", "k"),
        ):
            with pytest.raises(tenure.InvalidArgumentType, match="AsyncConnection"):
                asyncio.run(coroutine)
    with pytest.raises(tenure.InvalidArgumentType, match="dsn"):
        asyncio.run(tenure.connect_async(12345))  # type: ignore[arg-type]


# -- runtime schedules (issue 27) -------------------------------------------------------------


@settings(max_examples=examples(40))
@given(
    key=st.one_of(hostile_text, wrong_types),
    task=st.one_of(hostile_text, wrong_types),
    cron=hostile_crons,
    timezone=st.one_of(st.none(), hostile_zones),
    payload=hostile_payloads,
)
@example(key="k", task="t", cron="0 2 * * *", timezone=None, payload={"a": [1]})
def test_runtime_schedules_refused_in_one_line_or_stored_in_the_callers_transaction(
    seeded: Seeded, key: Any, task: Any, cron: Any, timezone: Any, payload: Any
) -> None:
    """Whatever the key, task, cron, zone and arguments: refused with InvalidArgument (one
    line), or stored in the caller's transaction and read back; rolled back, nothing that
    was stored before changes."""
    tried("api: runtime schedules")
    assume(not (isinstance(key, str) and key in SEEDED_KEYS))
    with psycopg.connect(seeded.dsn) as conn, conn.transaction(force_rollback=True):
        try:
            tenure.add_schedule(
                conn, key, task=task, cron=cron, timezone=timezone, args={"p": payload},
                schema=seeded.schema,
            )  # fmt: skip
        except tenure.InvalidArgument as exc:
            assert "\n" not in str(exc)
        else:
            stored = tenure.get_schedule(conn, key, schema=seeded.schema)
            assert stored is not None and stored.args == json.loads(json.dumps({"p": payload}))
    seeded.check()
