"""OpenTelemetry (issue 29): a span per scheduled run with the body's own spans under it, a span
per outbox delivery in the trace of the run that enqueued the message, and the webhook's
``traceparent``. Recorded with the SDK's in-memory exporter; real PostgreSQL, real HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import tenure
from tenure.db.channels import channel
from tenure.outbox.relay import Relay
from tenure.outbox.webhook import Webhook
from tenure.scheduler import jobs as ops
from tests.support.outbox import enqueue, message
from tests.support.scheduler_apps import NEVER
from tests.support.scheduler_support import InProcessWorker, prepare, wait_for

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk (dev extra)")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # A process has one global tracer provider: set it once (this file's tests run in one
    # process), empty the exporter for each test.
    if not isinstance(trace.get_tracer_provider(), sdk.TracerProvider):
        provider = sdk.TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def finished(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_run_is_a_span_and_the_bodys_spans_nest_under_it(
    dsn: str, schema: str, spans: InMemorySpanExporter
) -> None:
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)
    tracer = trace.get_tracer("the-app")

    @app.job("sync/report", cron=NEVER)
    def report(ctx: tenure.JobContext) -> None:
        with tracer.start_as_current_span("render report"):
            pass

    @app.job("async/report", cron=NEVER)
    async def areport(ctx: tenure.JobContext) -> None:
        with tracer.start_as_current_span("render async report"):
            await asyncio.sleep(0)

    @app.job("broken", cron=NEVER)
    def broken(ctx: tenure.JobContext) -> None:
        raise ValueError("no data")

    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        for key in ("sync/report", "async/report", "broken"):
            ops.trigger(client, key, channel=channel("jobs", schema))
        wait_for(
            lambda: len(finished(spans, "tenure.run")) == 3, timeout=20, what="three run spans"
        )
    runs = {s.attributes["tenure.job_key"]: s for s in finished(spans, "tenure.run")}
    for key, child_name in (
        ("sync/report", "render report"),
        ("async/report", "render async report"),
    ):
        run = runs[key]
        assert run.attributes["tenure.outcome"] == "succeeded"
        assert run.attributes["tenure.kind"] == "manual"
        assert run.attributes["tenure.attempt"] == 1
        assert (
            isinstance(run.attributes["tenure.token"], int) and run.attributes["tenure.token"] > 0
        )
        assert run.attributes["tenure.slot"] and run.attributes["tenure.lateness_s"] >= 0
        assert run.status.is_ok
        [child] = finished(spans, child_name)
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
    failed = runs["broken"]
    assert failed.attributes["tenure.outcome"] == "failed"
    assert not failed.status.is_ok and "no data" in (failed.status.description or "")


class _Hook(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_delivery_joins_the_trace_of_the_span_that_enqueued_it(
    client: tenure.Client, dsn: str, spans: InMemorySpanExporter
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.seen = []  # type: ignore[attr-defined]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    tracer = trace.get_tracer("the-app")
    try:
        with tracer.start_as_current_span("close the month") as enqueuing:
            [msg_id] = enqueue(dsn, client.schema, [("invoices", "2026-11", {"total": 42}, None)])
        stored = message(dsn, client.schema, msg_id)
        assert stored.traceparent is not None
        trace_id = format(enqueuing.get_span_context().trace_id, "032x")
        assert stored.traceparent.split("-")[1] == trace_id

        async def deliver() -> None:
            async with await tenure.connect_async(dsn, schema=client.schema) as aclient:
                relay = Relay(aclient, {"invoices": Webhook(url)})
                task = asyncio.create_task(relay.run())
                deadline = time.monotonic() + 30
                while message(dsn, client.schema, stored.id).state != "delivered":
                    assert time.monotonic() < deadline and not task.done()
                    await asyncio.sleep(0.05)
                relay.stop()
                await asyncio.wait_for(task, 30)

        asyncio.run(deliver())
    finally:
        server.shutdown()
        server.server_close()
    [delivery] = finished(spans, "tenure.outbox.deliver")
    assert delivery.context.trace_id == enqueuing.get_span_context().trace_id
    assert delivery.parent is not None
    assert delivery.parent.span_id == enqueuing.get_span_context().span_id
    assert delivery.attributes["tenure.topic"] == "invoices"
    assert delivery.attributes["tenure.outcome"] == "delivered"
    [headers] = server.seen  # type: ignore[attr-defined]
    sent = {k.lower(): v for k, v in headers.items()}["traceparent"]
    # The receiver continues the delivery's span, in the same trace.
    assert sent.split("-")[1] == trace_id
    assert sent.split("-")[2] == format(delivery.context.span_id, "016x")


def test_without_a_tracer_provider_nothing_is_stored_or_sent(client: tenure.Client) -> None:
    # A fresh process: the API is installed, no provider set, so tenure records nothing.
    import subprocess
    import sys

    code = (
        "from tenure import tracing\n"
        "assert not tracing.enabled()\n"
        "assert tracing.traceparent() is None\n"
        "with tracing.span('x', {'a': 1}) as s: s.outcome('failed', 'e')\n"
        "h = {}\n"
        "tracing.inject(h, fallback='00-' + '1' * 32 + '-' + '2' * 16 + '-01')\n"
        "assert h == {'traceparent': '00-' + '1' * 32 + '-' + '2' * 16 + '-01'}, h\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
