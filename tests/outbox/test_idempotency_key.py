"""The Idempotency-Key: one header per (topic, key), never the same for two messages, and a
consumer claims it as it arrives with ``tenure.inbox.claim_header``."""

from __future__ import annotations

import asyncio
import itertools

import psycopg
import pytest

import tenure
from tenure.outbox import Message, idempotency_key, parse_idempotency_key
from tenure.outbox.relay import Relay
from tenure.outbox.webhook import webhook
from tests.support.outbox import Consumer, effects, enqueue, message

Conn = psycopg.Connection[tuple[object, ...]]

# Topics and keys that a naive "topic:key" or a careless encoding would confuse.
TOPICS = ["a", "a:b", "a3Ab", "a.b/c-d_e", "é", "a:", ":", "x:y:z"]
KEYS = ["c", "b:c", ":", "%", "%3A", "k y", "é/ü", "tab\there", "new\nline", "%25", "ä:%:ö", "~!"]


def test_the_header_is_different_for_every_topic_and_key() -> None:
    # The example: topic `a:b` key `c` and topic `a` key `b:c` sent `a:b:c` twice.
    assert idempotency_key("a:b", "c") != idempotency_key("a", "b:c")
    pairs = list(itertools.product(TOPICS, KEYS))
    headers = [idempotency_key(t, k) for t, k in pairs]
    assert len(set(headers)) == len(pairs)
    for (topic, key), header in zip(pairs, headers, strict=True):
        # Visible ASCII only (a valid header value) and exactly one separator.
        assert all("!" <= ch <= "~" for ch in header), header
        assert parse_idempotency_key(header) == (topic, key)
    # The common case reads as before: `topic:key` when neither needs escaping.
    assert idempotency_key("report.ready", "nightly-report:2026-11-30") == (
        "report.ready:nightly-report:2026-11-30"
    )


@pytest.mark.parametrize(
    "header", ["", "no-separator", ":key", "topic:", "t%zz:k", "t:%4", "bad topic:k", "t:k\r\n"]
)
def test_a_malformed_header_is_refused(header: str) -> None:
    with pytest.raises(tenure.InvalidArgument, match="Idempotency-Key"):
        parse_idempotency_key(header)


def test_claim_header_claims_each_message_once(client: tenure.Client, conn: Conn) -> None:
    s = client.schema
    first = idempotency_key("a:b", "c")
    other = idempotency_key("a", "b:c")
    with conn.transaction():
        assert tenure.inbox.claim_header(conn, "billing", first, schema=s) is True
    with conn.transaction():
        assert tenure.inbox.claim_header(conn, "billing", other, schema=s) is True
    with conn.transaction():  # the same header again, escapes in lower case (a proxy's doing)
        assert tenure.inbox.claim_header(conn, "billing", first.lower(), schema=s) is False
    # A key so long that its header exceeds the inbox's key column: still claimable, once.
    long_key = "ü" * 500
    header = idempotency_key("t", long_key)
    assert len(header) > 1000
    with conn.transaction():
        assert tenure.inbox.claim_header(conn, "billing", header, schema=s) is True
    with conn.transaction():
        assert tenure.inbox.claim_header(conn, "billing", header, schema=s) is False
    with pytest.raises(tenure.InvalidArgument, match="Idempotency-Key"), conn.transaction():
        tenure.inbox.claim_header(conn, "billing", "not a tenure key", schema=s)


def test_webhook_sends_distinct_headers_and_the_consumer_applies_both(
    client: tenure.Client, dsn: str, consumer: Consumer
) -> None:
    s = client.schema
    ids = enqueue(dsn, s, [("a:b", "c", {"n": 1}, None), ("a", "b:c", {"n": 2}, None)])
    seen: list[str] = []

    async def scenario() -> None:
        hook = webhook(consumer.url)
        async with await tenure.connect_async(dsn, schema=s) as aclient:
            relay = Relay(aclient, {"a:b": hook, "a": hook})
            try:
                assert await relay.run_once() == 2
            finally:
                await relay.aclose()
        seen.extend(r.key for r in consumer.requests)

    asyncio.run(scenario())
    msgs: list[Message] = [message(dsn, s, i) for i in ids]
    assert sorted(seen) == sorted(m.idempotency_key for m in msgs)
    assert len(set(seen)) == 2
    assert effects(dsn, s) == sorted(seen)  # both applied: neither mistaken for the other
