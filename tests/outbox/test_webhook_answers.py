"""What the relay does with a webhook's answer (issue 31): which HTTP statuses are final (the
message is dead at once) and which are retried, and that an answer's body is kept and shown
without the passwords it may quote, in the stored error, `tenure outbox list` and the log."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

import tenure
from tenure.outbox.webhook import Webhook
from tests.outbox.test_relay import _run_relay
from tests.support.env import run_tenure, tenure_env
from tests.support.outbox import Consumer, Reply, counts, enqueue, message

#: A body an endpoint may well answer with: its own error, quoting a connection string.
LEAKY = "db error: password=hunter2 at postgresql://app:s3cr3t@db.internal/x"


FINAL = [400, 401, 403, 404, 405, 409, 410, 413, 415, 422]
RETRIED = [408, 425, 429, 500, 502, 503]


def test_a_final_4xx_is_dead_at_once_and_408_425_429_and_5xx_are_retried(
    client: tenure.Client, dsn: str, consumer: Consumer
) -> None:
    """Before the fix a 400 was retried like a 500, max_attempts times."""
    schema = client.schema
    consumer.behaviour = lambda req, n: Reply(status=int(req.payload["status"]), apply=False)
    enqueue(dsn, schema, [("hook", str(s), {"status": s}, None) for s in FINAL + RETRIED])

    def settled() -> bool:
        # Every final one dead, every retried one tried again (max_attempts is far away).
        retried = {r.key.rsplit(":", 1)[1] for r in consumer.requests if r.attempt >= 2}
        return counts(dsn, schema)["dead"] >= len(FINAL) and retried >= set(map(str, RETRIED))

    asyncio.run(
        _run_relay(
            dsn,
            schema,
            {"hook": Webhook(consumer.url)},
            settled,
            max_attempts=100,
            backoff=0.2,
            backoff_max=0.5,
        )
    )
    rows = {m.key: m for m in tenure.outbox.messages(client, state="all")}
    for status in FINAL:
        m = rows[str(status)]
        assert (m.state, m.attempts) == ("dead", 1), (status, m)
        assert m.last_error is not None and f"HTTP {status}" in m.last_error, m.last_error
        assert "not retried" in m.last_error, m.last_error
    for status in RETRIED:
        m = rows[str(status)]
        assert m.state != "dead" and m.attempts >= 2, (status, m)


def test_an_answer_quoting_passwords_is_shown_redacted_everywhere(
    client: tenure.Client, dsn: str, consumer: Consumer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the fix `tenure outbox list` printed the body's password=... as stored, while
    the relay's log hid it."""
    schema = client.schema
    consumer.behaviour = lambda req, n: Reply(status=500, apply=False, body=LEAKY)
    (msg_id,) = enqueue(dsn, schema, [("hook", "k", {}, None)])
    with caplog.at_level(logging.WARNING, logger="tenure"):
        asyncio.run(
            _run_relay(
                dsn,
                schema,
                {"hook": Webhook(consumer.url)},
                lambda: counts(dsn, schema)["dead"] == 1,
                max_attempts=1,
            )
        )
    stored = message(dsn, schema, msg_id).last_error
    assert stored is not None and "HTTP 500" in stored and "db error" in stored, stored
    env = tenure_env(dsn, schema)
    table = run_tenure(["outbox", "list", "--state", "dead"], env)
    listed = run_tenure(["outbox", "list", "--state", "dead", "--json"], env)
    assert table.returncode == 0 and listed.returncode == 0, (table.stderr, listed.stderr)
    (row,) = json.loads(listed.stdout)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for shown in (stored, table.stdout, row["last_error"], logged):
        assert "hunter2" not in shown and "s3cr3t" not in shown, shown
        assert "password=***" in shown, shown
