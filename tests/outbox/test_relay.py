"""The relay: at-least-once delivery that a consumer using the inbox applies exactly once
(invariant 6), against a real PostgreSQL, a real HTTP server on loopback and real relay
processes (`python -m tenure relay`) killed with real signals."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure import outbox
from tenure.outbox import Message
from tenure.outbox.relay import Relay
from tests.support.env import run_tenure, tenure_env
from tests.support.outbox import (
    Consumer,
    RelayProcess,
    Reply,
    Request,
    counts,
    effects,
    enqueue,
    make_effects_table,
    message,
    query,
    wait_for,
)

# -- real relay processes ---------------------------------------------------------------------

KILL_HANDLERS = """
import os, pathlib, time

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

import tenure

DSN = os.environ["TENURE_DSN"]
SCHEMA = os.environ["TENURE_SCHEMA"]
MARKS = pathlib.Path(os.environ["OUTBOX_TEST_MARKS"])


def mail(message):
    with psycopg.connect(DSN) as conn, conn.transaction():
        first = tenure.inbox.claim(conn, "mailer", message.idempotency_key, schema=SCHEMA)
        if first:
            conn.execute(
                sql.SQL("INSERT INTO {}.effects VALUES (%s, %s)").format(sql.Identifier(SCHEMA)),
                (message.idempotency_key, Jsonb(message.payload)),
            )
    with open(MARKS / "deliveries", "a") as f:
        f.write(f"{message.id} {message.attempts} {first}\\n")
    if message.attempts == 1:
        # Applied and committed. Hang, so that the test kills the relay after the handler
        # ran and before the relay could record the delivery.
        (MARKS / "applied").touch()
        time.sleep(60)


HANDLERS = {"mail": mail}
"""


@pytest.mark.slow
def test_relay_killed_after_handler_ran_redelivers_and_consumer_applies_once(
    client: tenure.Client, dsn: str, tmp_path: Path, relays: Callable[..., RelayProcess]
) -> None:
    s = client.schema
    make_effects_table(dsn, s)
    (tmp_path / "kill_handlers.py").write_text(KILL_HANDLERS)
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ("--handlers", "kill_handlers:HANDLERS", "--timeout", "5s", "--visibility", "6s")
    args += ("--poll", "0.5s")
    first = relays(*args, OUTBOX_TEST_MARKS=str(marks))
    [msg_id] = enqueue(dsn, s, [("mail", "invoice-7", {"amount": 42}, None)])

    wait_for((marks / "applied").exists, 30, "the handler to apply the message")
    first.stop(signal.SIGKILL)
    stuck = message(dsn, s, msg_id)
    assert (stuck.state, stuck.attempts, stuck.delivered_at) == ("pending", 1, None)
    assert stuck.claimed_until is not None  # still claimed by the dead relay
    assert effects(dsn, s) == ["mail:invoice-7"]

    second = relays(*args, OUTBOX_TEST_MARKS=str(marks))
    wait_for(lambda: message(dsn, s, msg_id).state == "delivered", 30, "the redelivery")
    done = message(dsn, s, msg_id)
    assert done.attempts == 2
    assert (marks / "deliveries").read_text().splitlines() == [
        f"{msg_id} 1 True",  # applied, then the relay was killed before recording it
        f"{msg_id} 2 False",  # delivered again after the claim ran out; the inbox skipped it
    ]
    assert effects(dsn, s) == ["mail:invoice-7"]
    assert second.stop() == 0


@pytest.mark.slow
def test_webhook_answering_after_the_timeout_is_retried_with_the_same_key_and_applied_once(
    client: tenure.Client, dsn: str, consumer: Consumer, relays: Callable[..., RelayProcess]
) -> None:
    s = client.schema

    def behaviour(req: Request, seen: int) -> Reply:
        # The first call is applied, but the answer comes after the relay's timeout.
        return Reply(delay=2.5 if seen == 0 else 0.0)

    consumer.behaviour = behaviour
    relay = relays(
        "--webhook",
        f"pay={consumer.url}",
        "--timeout",
        "1s",
        "--visibility",
        "2s",
        "--backoff",
        "0.1s",
        "--poll",
        "1s",
    )
    # A key with a space and a non-ASCII letter: percent-encoded, identically on every try.
    [msg_id] = enqueue(dsn, s, [("pay", "invoice 7/é", {"amount": 42}, None)])
    wait_for(lambda: message(dsn, s, msg_id).state == "delivered", 30, "the delivery")

    done = message(dsn, s, msg_id)
    requests = consumer.by_key()
    assert list(requests) == ["pay:invoice%207/%C3%A9"]
    tries = requests["pay:invoice%207/%C3%A9"]
    assert len(tries) >= 2 and done.attempts >= 2
    # Consecutive attempts. On a loaded machine the relay's first attempt can time out
    # before its request reaches this consumer (seen twice in full CI runs): then the first
    # request seen is attempt 2, and it is the one applied.
    first = tries[0].attempt
    assert first <= 2 and [r.attempt for r in tries] == list(range(first, first + len(tries)))
    assert [r.applied for r in tries] == [True] + [False] * (len(tries) - 1)
    assert all(r.payload == {"amount": 42} for r in tries)
    assert done.last_error is None  # delivered: the timeouts before are not its error
    assert effects(dsn, s) == ["pay:invoice%207/%C3%A9"]
    assert relay.stop() == 0


@pytest.mark.slow
def test_two_relays_never_deliver_one_message_concurrently_and_keep_key_order(
    client: tenure.Client, dsn: str, consumer: Consumer, relays: Callable[..., RelayProcess]
) -> None:
    s = client.schema
    consumer.behaviour = lambda req, n: Reply(delay=0.02)
    args = ["--webhook", f"t={consumer.url}", "--concurrency", "4", "--poll", "0.5s"]
    args += ["--timeout", "2s", "--visibility", "3s"]
    procs = [relays(*args), relays(*args)]
    n = 120
    items = [("t", f"m{i:03}", {"i": i}, f"acct{i % 4}" if i % 2 == 0 else None) for i in range(n)]
    ids: list[int] = []
    for batch in range(0, n, 20):
        ids += enqueue(dsn, s, items[batch : batch + 20])
    try:
        wait_for(lambda: counts(dsn, s)["delivered"] == n, 60, f"{n} deliveries")
    finally:  # an overlap is the more telling failure: check it first
        requests = consumer.by_key()
        for key, tries in requests.items():
            tries.sort(key=lambda r: r.start)
            for before, after in itertools.pairwise(tries):
                assert before.end <= after.start, f"{key} was delivered twice at the same time"
    assert sorted(requests) == [f"t:m{i:03}" for i in range(n)]
    assert effects(dsn, s) == sorted(requests)  # each applied exactly once
    # Per-key order across both relays: each account's messages arrived in enqueue order.
    for acct in range(4):
        keys = [f"t:m{i:03}" for i in range(n) if i % 2 == 0 and i % 4 == acct]
        firsts = [min(r.start for r in requests[k]) for k in keys]
        assert firsts == sorted(firsts), f"acct{acct} delivered out of order"
    delivered_by = query(dsn, f'SELECT count(DISTINCT delivered_by) FROM "{s}".outbox')
    assert delivered_by == [(2,)], "both relays should have delivered some messages"
    assert [p.stop() for p in procs] == [0, 0]


@pytest.mark.slow
def test_dead_after_max_attempts_listed_and_redriven_unknown_topic_waits(
    client: tenure.Client, dsn: str, consumer: Consumer, relays: Callable[..., RelayProcess]
) -> None:
    s = client.schema
    failing = threading.Event()
    failing.set()
    consumer.behaviour = lambda req, n: (
        Reply(status=500, apply=False, body="boom: ledger closed") if failing.is_set() else Reply()
    )
    relay = relays(
        "--webhook",
        f"flaky={consumer.url}",
        "--max-attempts",
        "3",
        "--backoff",
        "0.05s",
        "--backoff-max",
        "0.2s",
        "--poll",
        "0.5s",
    )
    flaky, orphan = enqueue(
        dsn, s, [("flaky", "k1", {"n": 1}, None), ("nohandler", "k2", {"n": 2}, None)]
    )
    wait_for(lambda: counts(dsn, s)["dead"] == 1, 30, "the failing message to be parked")

    env = tenure_env(dsn, s)
    listed = run_tenure(["outbox", "list", "--state", "dead", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows[flaky]["attempts"] == 3
    assert (
        "HTTP 500" in rows[flaky]["last_error"]
        and "boom: ledger closed" in rows[flaky]["last_error"]
    )
    assert orphan not in rows  # no relay handles its topic: it waits, never claimed
    waiting = message(dsn, s, orphan)
    assert (waiting.state, waiting.attempts, waiting.last_error) == ("pending", 0, None)
    assert [r.attempt for r in consumer.requests] == [1, 2, 3]

    failing.clear()
    redriven = run_tenure(["outbox", "retry", "--id", str(flaky)], env)
    assert redriven.returncode == 0, redriven.stderr
    wait_for(lambda: message(dsn, s, flaky).state == "delivered", 30, "the re-driven delivery")
    assert effects(dsn, s) == ["flaky:k1"]
    assert message(dsn, s, orphan).state == "pending"  # waiting for a relay, not lost
    assert relay.stop() == 0
    assert relay.proc.stdout is not None
    assert "stopped (1 delivered)" in relay.proc.stdout.read()


def test_relay_command_refuses_bad_configuration(client: tenure.Client, dsn: str) -> None:
    env = tenure_env(dsn, client.schema)
    none = run_tenure(["relay"], env)
    assert none.returncode == 2 and "no handlers" in none.stderr
    bad = run_tenure(["relay", "--webhook", "t:http://x"], env)
    assert bad.returncode == 2 and "TOPIC=URL" in bad.stderr
    tight = run_tenure(
        ["relay", "--webhook", "t=http://x/", "--timeout", "5s", "--visibility", "5s"], env
    )
    assert tight.returncode == 2 and "visibility" in tight.stderr
    missing = run_tenure(["relay", "--handlers", "no_such_module_xyz:H"], env)
    assert missing.returncode == 1 and "cannot import handler module" in missing.stderr
    unmigrated = run_tenure(
        ["relay", "--webhook", "t=http://x/"], tenure_env(dsn, client.schema + "_never")
    )
    assert unmigrated.returncode == 1 and "run `tenure migrate`" in unmigrated.stderr
    assert "delivering" not in unmigrated.stdout


# -- the relay in-process (Python API) ----------------------------------------------------------


async def _run_relay(
    dsn: str,
    schema: str,
    handlers: dict[str, Any],
    until: Callable[[], bool],
    **options: Any,
) -> None:
    async with await tenure.connect_async(dsn, schema=schema) as aclient:
        relay = Relay(aclient, handlers, **options)
        task = asyncio.create_task(relay.run())
        deadline = time.monotonic() + 30
        while not until():
            assert time.monotonic() < deadline, "relay did not finish in time"
            assert not task.done(), task
            await asyncio.sleep(0.02)
        relay.stop()
        await asyncio.wait_for(task, 30)


def test_per_key_order_holds_while_an_older_message_backs_off(
    client: tenure.Client, dsn: str
) -> None:
    s = client.schema
    ids = enqueue(
        dsn,
        s,
        [
            ("t", "a1", 1, "A"),
            ("t", "a2", 2, "A"),
            ("t", "b1", 3, "B"),
            ("t", "a3", 4, "A"),
            ("t", "b2", 5, "B"),
            ("t", "c1", 6, None),
        ],
    )
    events: list[tuple[str, str]] = []

    async def handler(m: Message) -> None:
        events.append(("start", m.key))
        if m.key == "a1" and m.attempts == 1:
            raise RuntimeError("first attempt fails")
        await asyncio.sleep(0.01)
        events.append(("done", m.key))

    asyncio.run(
        _run_relay(
            dsn,
            s,
            {"t": handler},
            lambda: sum(e[0] == "done" for e in events) == len(ids),
            backoff=0.3,
            concurrency=4,
        )
    )
    done = [k for e, k in events if e == "done"]
    assert [k for k in done if k.startswith("a")] == ["a1", "a2", "a3"]
    assert [k for k in done if k.startswith("b")] == ["b1", "b2"]
    # Nothing of key A started before a1 was delivered; other keys did not wait for it.
    a1_done = events.index(("done", "a1"))
    assert events.index(("start", "a2")) > a1_done
    assert events.index(("done", "b1")) < a1_done and events.index(("done", "c1")) < a1_done
    assert [message(dsn, s, i).attempts for i in ids] == [2, 1, 1, 1, 1, 1]


def test_dead_message_holds_back_its_key_until_redriven(client: tenure.Client, dsn: str) -> None:
    s = client.schema
    x1, x2, y1 = enqueue(dsn, s, [("t", "x1", 1, "X"), ("t", "x2", 2, "X"), ("t", "y1", 3, "Y")])
    broken = True
    delivered: list[str] = []

    async def handler(m: Message) -> None:
        if m.key == "x1" and broken:
            raise RuntimeError("downstream refuses x1")
        delivered.append(m.key)

    async def until(predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        while not predicate():
            assert time.monotonic() < deadline, delivered
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        nonlocal broken
        async with await tenure.connect_async(dsn, schema=s) as aclient:
            # poll=30: only a notification can wake this relay in time.
            relay = Relay(aclient, {"t": handler}, max_attempts=1, poll=30)
            task = asyncio.create_task(relay.run())
            await until(lambda: "y1" in delivered)
            await until(lambda: message(dsn, s, x1).state == "dead")
            await asyncio.sleep(0.5)
            assert delivered == ["y1"]  # x2 waits behind its dead predecessor
            assert (message(dsn, s, x2).state, message(dsn, s, x2).attempts) == ("pending", 0)
            broken = False
            assert await outbox.retry_async(aclient, ids=[x1]) == [x1]
            await until(lambda: len(delivered) == 3)
            relay.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    assert delivered == ["y1", "x1", "x2"]
    assert [message(dsn, s, i).state for i in (x1, x2, y1)] == ["delivered"] * 3


def test_failures_back_off_record_attempts_and_errors_and_time_out(
    client: tenure.Client, dsn: str
) -> None:
    s = client.schema
    flaky, slow = enqueue(dsn, s, [("flaky", "f", {}, None), ("slow", "s", {}, None)])
    starts: list[float] = []

    async def flaky_handler(m: Message) -> None:
        starts.append(time.monotonic())
        if m.attempts < 3:
            raise RuntimeError(f"failure {m.attempts}")

    async def slow_handler(m: Message) -> None:
        await asyncio.sleep(10)

    def finished() -> bool:
        c = counts(dsn, s)
        return c["delivered"] == 1 and c["dead"] == 1

    asyncio.run(
        _run_relay(
            dsn,
            s,
            {"flaky": flaky_handler, "slow": slow_handler},
            finished,
            backoff=0.2,
            max_attempts=3,
            timeout=0.3,
            visibility=2,
        )
    )
    ok = message(dsn, s, flaky)
    assert (ok.state, ok.attempts, ok.last_error) == ("delivered", 3, None)
    # Exponential backoff with jitter: at least half of 0.2 s, then half of 0.4 s.
    assert starts[1] - starts[0] >= 0.1 and starts[2] - starts[1] >= 0.2
    dead = message(dsn, s, slow)
    assert (dead.state, dead.attempts) == ("dead", 3)
    assert dead.last_error is not None and dead.last_error.startswith("timed out after 0.3")


def test_relay_refuses_a_claim_shorter_than_the_call(client: tenure.Client, dsn: str) -> None:
    async def scenario() -> None:
        async with await tenure.connect_async(dsn, schema=client.schema) as aclient:
            with pytest.raises(tenure.InvalidArgument, match="visibility"):
                Relay(aclient, {"t": lambda m: None}, timeout=10, visibility=10)
            with pytest.raises(tenure.InvalidArgument, match="topic"):
                Relay(aclient, {"bad topic": lambda m: None})
            with pytest.raises(tenure.InvalidArgument, match="concurrency"):
                Relay(aclient, {"t": lambda m: None}, concurrency=0)

    asyncio.run(scenario())


def _listeners(dsn: str, channel: str) -> list[int]:
    """The relay backends whose last statement was the LISTEN on ``channel`` (this test's
    schema only: other tests' relays on the same server are left alone)."""
    rows = query(
        dsn,
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'tenure-relay' "
        "AND query LIKE %s",
        (f"LISTEN %{channel}%",),
    )
    return [int(r[0]) for r in rows]


def test_a_relay_listens_again_after_its_backend_is_terminated(
    client: tenure.Client, dsn: str
) -> None:
    """pg_terminate_backend on the relay's listening connection (a restart or failover does
    the same): the notifier reconnects, and the next commit wakes the relay, whose poll
    (an hour) could not."""
    s = client.schema
    channel = outbox.channel(s)
    delivered: list[str] = []

    async def handler(m: Message) -> None:
        delivered.append(m.key)

    async def scenario() -> None:
        async with await tenure.connect_async(dsn, schema=s) as aclient:
            relay = Relay(aclient, {"t": handler}, poll=3600)
            ready = asyncio.Event()
            task = asyncio.create_task(relay.run(ready=ready.set))
            try:
                async with asyncio.timeout(30):  # a guard against a hang, not a measurement
                    await ready.wait()
                    first = await asyncio.to_thread(
                        wait_for, lambda: _listeners(dsn, channel), 20, "the relay to listen"
                    )
                    query(dsn, "SELECT pg_terminate_backend(%s)", (first[0],))
                    await asyncio.to_thread(
                        wait_for,
                        lambda: [p for p in _listeners(dsn, channel) if p not in first],
                        20,
                        "the relay to listen again",
                    )
                    await asyncio.to_thread(enqueue, dsn, s, [("t", "after", {}, None)])
                    while delivered != ["after"]:
                        await asyncio.sleep(0.02)
            finally:
                relay.stop()
                await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    assert delivered == ["after"]
