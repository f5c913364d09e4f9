"""Relays with different handler sets: each claims only the topics it handles, a message no
relay handles waits (counted and logged), and is delivered once a relay for it starts.
Real relay processes, a real HTTP consumer on loopback, a real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import tenure
from tenure import outbox
from tests.support.env import run_tenure, tenure_env
from tests.support.outbox import (
    Consumer,
    RelayProcess,
    counts,
    effects,
    enqueue,
    message,
    query,
    wait_for,
)


@pytest.mark.slow
def test_relays_with_different_handlers_never_park_each_others_messages(
    client: tenure.Client, dsn: str, consumer: Consumer, relays: Callable[..., RelayProcess]
) -> None:
    s = client.schema
    fast = ("--poll", "0.5s", "--backoff", "0.1s")
    reports = relays("--webhook", f"report.ready={consumer.url}", *fast)
    injections = relays("--webhook", f"inj={consumer.url}", *fast)
    r1, i1, orphan, r2, i2 = enqueue(
        dsn,
        s,
        [
            ("report.ready", "r1", {"n": 1}, None),
            ("inj", "i1", {"n": 2}, None),
            ("nobody.handles", "o1", {"n": 3}, None),
            ("report.ready", "r2", {"n": 4}, None),
            ("inj", "i2", {"n": 5}, None),
        ],
    )
    wait_for(lambda: counts(dsn, s)["delivered"] == 4, 30, "the four handled messages")
    assert counts(dsn, s) == {"pending": 1, "delivered": 4, "dead": 0}
    # Each topic went to the relay that handles it, and only there.
    by = query(
        dsn, f'SELECT DISTINCT topic, delivered_by FROM "{s}".outbox WHERE delivered_by IS NOT NULL'
    )
    assert sorted(t for t, _ in by) == ["inj", "report.ready"]
    assert len({r for _, r in by}) == 2
    for msg_id in (r1, r2, i1, i2):
        done = message(dsn, s, msg_id)
        assert (done.attempts, done.last_error) == (1, None), done
    waiting = message(dsn, s, orphan)
    # Never claimed: no attempt counted, no error recorded, not dead.
    assert (waiting.state, waiting.attempts, waiting.last_error) == ("pending", 0, None)

    # Counted: the library, `tenure outbox list` (text and JSON) and the relays' log.
    [unhandled] = outbox.unhandled(client)
    assert (unhandled.topic, unhandled.pending) == ("nobody.handles", 1)
    assert unhandled.oldest_age >= 0
    env = tenure_env(dsn, s)
    listed = run_tenure(["outbox", "list"], env)
    assert listed.returncode == 0, listed.stderr
    assert "no relay handles topic 'nobody.handles': 1 message(s) waiting, oldest" in listed.stdout
    as_json = run_tenure(["outbox", "list", "--json"], env)
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)
    assert (row["id"], row["state"], row["no_relay"]) == (orphan, "pending", True)
    wait_for(
        lambda: "no relay handles topic 'nobody.handles'" in reports.log.read_text(),
        30,
        "the relay's warning about the unhandled topic",
    )

    # A relay that handles it starts: the message is delivered, on its first attempt.
    late = relays("--webhook", f"nobody.handles={consumer.url}", *fast)
    wait_for(lambda: message(dsn, s, orphan).state == "delivered", 30, "the late delivery")
    assert message(dsn, s, orphan).attempts == 1
    assert outbox.unhandled(client) == []
    assert sorted(r.topic for r in consumer.requests) == [
        "inj",
        "inj",
        "nobody.handles",
        "report.ready",
        "report.ready",
    ]
    assert len(effects(dsn, s)) == 5
    assert [p.stop() for p in (reports, injections, late)] == [0, 0, 0]


def test_a_topic_filter_outside_the_handlers_is_refused(client: tenure.Client, dsn: str) -> None:
    env = tenure_env(dsn, client.schema)
    refused = run_tenure(["relay", "--webhook", "a=http://127.0.0.1:9/", "--topic", "b"], env)
    assert refused.returncode == 2, refused.stderr  # bad usage: the options contradict
    assert "--topic 'b' has no handler" in refused.stderr
