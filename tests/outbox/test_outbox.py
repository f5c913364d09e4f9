"""The outbox: a message exists if and only if its (fenced) transaction commits (invariant 5),
one message per (topic, key), bad payloads refused before any SQL, operator functions."""

from __future__ import annotations

import asyncio
import json
import time

import psycopg
import pytest
from psycopg import sql

import tenure
from tenure import outbox
from tests.support.env import run_tenure, tenure_env

Conn = psycopg.Connection[tuple[object, ...]]


def _rows(client: tenure.Client) -> list[tuple[object, ...]]:
    with client.connection() as c:
        return c.execute(
            sql.SQL(
                "SELECT topic, key, payload, job_key, token, state FROM {}.outbox ORDER BY id"
            ).format(sql.Identifier(client.schema))
        ).fetchall()


def test_enqueue_commits_with_the_transaction_and_dedupes_on_topic_and_key(
    client: tenure.Client, conn: Conn
) -> None:
    s = client.schema
    with conn.transaction():
        assert outbox.enqueue(conn, "mail", "job:1", {"to": "a@example.com"}, schema=s) is True
        # Same business key again (a retried job): one message, the first payload kept.
        assert outbox.enqueue(conn, "mail", "job:1", {"to": "b@example.com"}, schema=s) is False
        # Same key on another topic is another message.
        assert outbox.enqueue(conn, "sms", "job:1", ["x"], schema=s) is True
    with conn.transaction():
        assert outbox.enqueue(conn, "mail", "job:1", {"to": "c@example.com"}, schema=s) is False
    assert _rows(client) == [
        ("mail", "job:1", {"to": "a@example.com"}, None, None, "pending"),
        ("sms", "job:1", ["x"], None, None, "pending"),
    ]
    assert outbox.counts(client) == {"pending": 2, "delivered": 0, "dead": 0}


def test_rolled_back_transaction_leaves_no_message(client: tenure.Client, conn: Conn) -> None:
    with pytest.raises(RuntimeError), conn.transaction():
        assert outbox.enqueue(conn, "mail", "k", {"n": 1}, schema=client.schema)
        raise RuntimeError("business write failed")
    assert _rows(client) == []
    # The key is free again: the rolled-back message never deduplicates a later one.
    with conn.transaction():
        assert outbox.enqueue(conn, "mail", "k", {"n": 2}, schema=client.schema) is True
    assert [r[2] for r in _rows(client)] == [{"n": 2}]


@pytest.mark.parametrize("fence_first", [True, False])
def test_stale_tokens_fenced_transaction_leaves_no_message(
    client: tenure.Client, conn: Conn, fence_first: bool
) -> None:
    s = client.schema
    old = client.acquire("report", ttl=0.2)
    assert old is not None
    time.sleep(0.3)
    new = client.acquire("report", ttl=30)
    assert new is not None and new.token == old.token + 1

    with pytest.raises(tenure.StaleTokenError), conn.transaction():
        if fence_first:
            tenure.fence(conn, "report", old.token, schema=s)
        outbox.enqueue(
            conn,
            "mail",
            "report:slot-1",
            {"by": old.token},
            schema=s,
            job_key="report",
            token=old.token,
        )
        tenure.fence(conn, "report", old.token, schema=s)
    assert _rows(client) == []

    # The successor's fenced transaction commits its message, recording its token.
    with conn.transaction():
        tenure.fence(conn, "report", new.token, schema=s)
        assert outbox.enqueue(
            conn,
            "mail",
            "report:slot-1",
            {"by": new.token},
            schema=s,
            job_key="report",
            token=new.token,
        )
    assert _rows(client) == [
        ("mail", "report:slot-1", {"by": new.token}, "report", new.token, "pending")
    ]


def test_enqueue_refuses_autocommit_outside_a_transaction(client: tenure.Client, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as auto:
        with pytest.raises(tenure.InvalidArgument, match="inside your transaction"):
            outbox.enqueue(auto, "mail", "k", {}, schema=client.schema)
        assert _rows(client) == []
        # An explicit transaction block on an autocommit connection is fine.
        with auto.transaction():
            assert outbox.enqueue(auto, "mail", "k", {}, schema=client.schema)
    assert len(_rows(client)) == 1


@pytest.mark.parametrize(
    "payload", [{"when": object()}, {1, 2}, float("nan"), {"nested": [b"bytes"]}]
)
def test_non_json_payload_is_refused_before_any_sql(
    client: tenure.Client, conn: Conn, payload: object
) -> None:
    with conn.transaction():
        with pytest.raises(tenure.InvalidArgument, match="not JSON-serialisable"):
            outbox.enqueue(conn, "mail", "k", payload, schema=client.schema)
        # Nothing was sent: the transaction is intact and usable.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert outbox.enqueue(conn, "mail", "k", {"ok": True}, schema=client.schema)
    assert [r[2] for r in _rows(client)] == [{"ok": True}]


@pytest.mark.parametrize(
    ("topic", "key", "kwargs", "match"),
    [
        ("", "k", {}, "topic"),
        ("a=b", "k", {}, "topic"),
        ("has space", "k", {}, "topic"),
        ("t", "", {}, "key"),
        ("t", "x" * 501, {}, "limit"),
        ("t", "k", {"job_key": "j"}, "together"),
        ("t", "k", {"token": 3}, "together"),
        ("t", "k", {"job_key": "j", "token": 0}, "positive"),
        ("t", "k", {"order_key": ""}, "order_key"),
    ],
)
def test_bad_arguments_are_refused(
    client: tenure.Client, conn: Conn, topic: str, key: str, kwargs: dict[str, object], match: str
) -> None:
    with conn.transaction(), pytest.raises(tenure.InvalidArgument, match=match):
        outbox.enqueue(conn, topic, key, {}, schema=client.schema, **kwargs)  # type: ignore[arg-type]
    assert _rows(client) == []


def test_notification_is_sent_only_when_the_transaction_commits(
    client: tenure.Client, conn: Conn, dsn: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(outbox.channel(client.schema))))
        with pytest.raises(RuntimeError), conn.transaction():
            outbox.enqueue(conn, "mail", "rolled-back", {}, schema=client.schema)
            raise RuntimeError
        with conn.transaction():
            outbox.enqueue(conn, "mail", "committed", {}, schema=client.schema)
            assert list(listener.notifies(timeout=0.3)) == []  # not before the commit
        got = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in got] == ["mail"]
        assert list(listener.notifies(timeout=0.3)) == []  # the rolled-back one never comes


def test_async_enqueue_in_a_fenced_transaction(client: tenure.Client, dsn: str) -> None:
    s = client.schema

    async def scenario() -> list[bool]:
        async with await tenure.connect_async(dsn, schema=s) as aclient:
            lease = await aclient.acquire("job", ttl=30)
            assert lease is not None
            async with await psycopg.AsyncConnection.connect(dsn) as aconn:
                async with aconn.transaction():
                    await tenure.fence_async(aconn, "job", lease.token, schema=s)
                    first = await outbox.enqueue_async(
                        aconn,
                        "hook",
                        "job:1",
                        {"a": 1},
                        schema=s,
                        job_key="job",
                        token=lease.token,
                    )
                    again = await outbox.enqueue_async(aconn, "hook", "job:1", {}, schema=s)
                with pytest.raises(RuntimeError):
                    async with aconn.transaction():
                        await outbox.enqueue_async(aconn, "hook", "job:2", {}, schema=s)
                        raise RuntimeError
                await aconn.set_autocommit(True)
                with pytest.raises(tenure.InvalidArgument, match="inside your transaction"):
                    await outbox.enqueue_async(aconn, "hook", "job:3", {}, schema=s)
            return [first, again]

    assert asyncio.run(scenario()) == [True, False]
    assert _rows(client) == [("hook", "job:1", {"a": 1}, "job", 1, "pending")]


def _set_state(client: tenure.Client, ids: list[int], state: str, **cols: object) -> None:
    sets = [sql.SQL("state = {}").format(sql.Literal(state))] + [
        sql.SQL("{} = {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in cols.items()
    ]
    with client.connection() as c:
        c.execute(
            sql.SQL("UPDATE {}.outbox SET {} WHERE id = ANY(%s)").format(
                sql.Identifier(client.schema), sql.SQL(", ").join(sets)
            ),
            (ids,),
        )


def test_operator_functions_list_retry_and_purge(client: tenure.Client, conn: Conn) -> None:
    with conn.transaction():
        for i in range(4):
            outbox.enqueue(conn, "t" if i < 3 else "u", f"k{i}", {"i": i}, schema=client.schema)
    ids = [m.id for m in outbox.messages(client, state="all")]
    _set_state(client, ids[:2], "dead", attempts=5, last_error="boom")
    _set_state(client, ids[2:3], "delivered", delivered_at="2000-01-01T00:00:00Z")

    assert [m.id for m in outbox.messages(client)] == [ids[0], ids[1], ids[3]]
    dead = outbox.messages(client, state="dead")
    assert [(m.state, m.attempts, m.last_error) for m in dead] == [("dead", 5, "boom")] * 2
    assert [m.id for m in outbox.messages(client, state=["delivered", "pending"], topic="u")] == [
        ids[3]
    ]
    assert outbox.counts(client) == {"pending": 1, "delivered": 1, "dead": 2}
    with pytest.raises(tenure.InvalidArgument):
        outbox.messages(client, state="lost")

    assert outbox.retry(client, ids=[ids[0], ids[3]]) == [ids[0]]  # only dead ones re-drive
    again = outbox.messages(client, ids=[ids[0]])[0]
    assert (again.state, again.attempts, again.last_error) == ("pending", 0, "boom")

    with pytest.raises(tenure.InvalidArgument, match="never deleted"):
        outbox.purge(client, older_than=0, state="pending")
    assert outbox.purge(client, older_than="1h", state="dead") == 0  # too recent
    assert outbox.purge(client, older_than="1d") == 1  # the delivered one, from 2000
    assert outbox.purge(client, older_than=0, state="dead", ids=[ids[1]]) == 1
    assert outbox.counts(client) == {"pending": 2, "delivered": 0, "dead": 0}


def test_cli_outbox_list_retry_purge(client: tenure.Client, conn: Conn, dsn: str) -> None:
    with conn.transaction():
        outbox.enqueue(conn, "hook", "a", {}, schema=client.schema)
        outbox.enqueue(conn, "hook", "b", {}, schema=client.schema)
    a, b = (m.id for m in outbox.messages(client))
    _set_state(client, [a], "dead", attempts=3, last_error="HTTP 500")
    env = tenure_env(dsn, client.schema)

    listed = run_tenure(["outbox", "list", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows[a]["state"] == "dead" and rows[a]["last_error"] == "HTTP 500"
    assert rows[b]["state"] == "pending" and rows[b]["next_attempt_in"] == 0

    table = run_tenure(["outbox", "list", "--state", "dead"], env)
    assert table.returncode == 0 and "HTTP 500" in table.stdout and "1 dead" in table.stdout

    refused = run_tenure(["outbox", "retry"], env)
    assert refused.returncode == 2 and "--id N, --topic T or --all" in refused.stderr
    redriven = run_tenure(["outbox", "retry", "--id", str(a)], env)
    assert redriven.returncode == 0 and f"re-drove 1 message(s): {a}" in redriven.stdout
    assert outbox.counts(client)["dead"] == 0

    purged = run_tenure(["outbox", "purge", "--older-than", "0s"], env)
    assert purged.returncode == 0 and "purged 0 delivered" in purged.stdout
