"""The webhook handler against real HTTP servers on loopback: one attempt of a message in
flight at a time (the request is aborted at the deadline, before the next attempt), connection
reuse, TLS with a private CA and a client certificate, and proxies from the environment."""

from __future__ import annotations

import asyncio
import itertools
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure.outbox.relay import Relay
from tenure.outbox.webhook import Webhook
from tests.support.env import tenure_env
from tests.support.outbox import RelayProcess, enqueue, message, wait_for


@dataclass
class Endpoint:
    """A webhook endpoint that records, in its own order, when each request arrived and when
    it ended: answered, or the client gone (it watches the socket while it "works")."""

    hold: Callable[[int], float] = lambda attempt: 0.0
    events: list[tuple[str, int]] = field(default_factory=list)
    peers: list[tuple[str, int]] = field(default_factory=list)
    client_certs: list[Any] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def record(self, event: str, attempt: int) -> None:
        with self.lock:
            self.events.append((event, attempt))


class _EndpointHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so that a client may reuse the connection
    server: Any

    def do_POST(self) -> None:
        endpoint: Endpoint = self.server.endpoint
        self.rfile.read(int(self.headers["Content-Length"]))
        attempt = int(self.headers["X-Tenure-Attempt"])
        endpoint.record("arrived", attempt)
        with endpoint.lock:
            endpoint.peers.append(self.client_address[:2])
            endpoint.paths.append(self.path)
            if isinstance(self.connection, ssl.SSLSocket):
                endpoint.client_certs.append(self.connection.getpeercert())
        until = time.monotonic() + endpoint.hold(attempt)
        while (left := until - time.monotonic()) > 0:
            # "Processing": but notice the client closing the connection.
            readable, _, _ = select.select([self.connection], [], [], left)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                endpoint.record("client gone", attempt)
                self.close_connection = True
                return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
        endpoint.record("answered", attempt)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve(endpoint: Endpoint, context: ssl.SSLContext | None = None) -> Iterator[Endpoint]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndpointHandler)
    server.daemon_threads = True
    server.endpoint = endpoint  # type: ignore[attr-defined]
    scheme = "http"
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    endpoint.url = f"{scheme}://localhost:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield endpoint
    server.shutdown()
    server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    yield from _serve(Endpoint())


async def _deliver(
    dsn: str, schema: str, handlers: dict[str, Any], until: Callable[[], bool], **options: Any
) -> None:
    async with await tenure.connect_async(dsn, schema=schema) as aclient:
        relay = Relay(aclient, handlers, **options)
        task = asyncio.create_task(relay.run())
        deadline = time.monotonic() + 60
        while not until():
            assert time.monotonic() < deadline, "the relay did not finish in time"
            assert not task.done(), task
            await asyncio.sleep(0.02)
        relay.stop()
        await asyncio.wait_for(task, 30)


# -- one attempt in flight ---------------------------------------------------------------------


def test_the_next_attempt_starts_only_after_the_previous_request_was_aborted(
    client: tenure.Client, dsn: str, endpoint: Endpoint
) -> None:
    # The case: a 2.5 s endpoint and a 1 s timeout. The first two attempts time out;
    # the third is answered at once.
    endpoint.hold = lambda attempt: 2.5 if attempt < 3 else 0.0
    s = client.schema
    [msg_id] = enqueue(dsn, s, [("slow", "k", {"n": 1}, None)])
    asyncio.run(
        _deliver(
            dsn,
            s,
            {"slow": Webhook(endpoint.url)},
            lambda: message(dsn, s, msg_id).state == "delivered",
            timeout=1,
            backoff=0.05,
            backoff_max=0.1,
        )
    )
    # In the endpoint's own order: each attempt's connection was closed by the relay (at its
    # deadline, while the endpoint still "worked") before the next attempt arrived.
    assert endpoint.events == [
        ("arrived", 1),
        ("client gone", 1),
        ("arrived", 2),
        ("client gone", 2),
        ("arrived", 3),
        ("answered", 3),
    ]
    done = message(dsn, s, msg_id)
    assert (done.state, done.attempts) == ("delivered", 3)
    # Delivered: the earlier attempts' timeout is no longer shown as the message's error.
    assert done.last_error is None


def test_a_claim_must_outlive_the_call_by_a_margin(client: tenure.Client, dsn: str) -> None:
    async def scenario() -> None:
        async with await tenure.connect_async(dsn, schema=client.schema) as aclient:
            # A claim 0.2 s longer than the call: the request could still be in flight when
            # the claim runs out and another relay starts the next attempt.
            with pytest.raises(tenure.InvalidArgument, match="visibility"):
                Relay(aclient, {"t": lambda m: None}, timeout=1, visibility=1.2)
            with pytest.raises(tenure.InvalidArgument, match="visibility"):
                Relay(aclient, {"t": lambda m: None}, timeout=100, visibility=105)
            ok = Relay(aclient, {"t": lambda m: None}, timeout=1, visibility=2)
            assert ok.settings.claim_ttl == 2
            assert Relay(aclient, {"t": lambda m: None}, timeout=10).settings.claim_ttl == 20

    asyncio.run(scenario())


# -- the HTTP client ---------------------------------------------------------------------------


def test_deliveries_reuse_one_connection(
    client: tenure.Client, dsn: str, endpoint: Endpoint
) -> None:
    s = client.schema
    ids = enqueue(dsn, s, [("t", f"k{i}", {"i": i}, None) for i in range(8)])
    asyncio.run(
        _deliver(
            dsn,
            s,
            {"t": Webhook(endpoint.url)},
            lambda: all(message(dsn, s, i).state == "delivered" for i in ids),
            concurrency=1,
        )
    )
    assert len(endpoint.peers) == 8
    assert len(set(endpoint.peers)) == 1, f"a connection per delivery: {endpoint.peers}"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A private CA, a server certificate for localhost and a client certificate."""
    days = ("-days", "2")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-subj", "/CN=tenure test CA", *days, cwd=tmp_path)  # fmt: skip
    (tmp_path / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN=tenure test {name}", cwd=tmp_path)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", *days, *ext, cwd=tmp_path)  # fmt: skip
    return tmp_path


@pytest.fixture
def tls_endpoint(pki: Path) -> Iterator[Endpoint]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.pem"))
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED  # a client certificate signed by the CA
    yield from _serve(Endpoint(), context)


def test_tls_with_a_private_ca_and_a_client_certificate(
    client: tenure.Client, dsn: str, tls_endpoint: Endpoint, pki: Path
) -> None:
    s = client.schema
    good, anonymous = enqueue(dsn, s, [("mtls", "k1", {}, None), ("anon", "k2", {}, None)])
    hook = Webhook(
        tls_endpoint.url,
        ca_bundle=pki / "ca.pem",
        client_cert=pki / "client.pem",
        client_key=pki / "client.key",
    )
    no_cert = Webhook(tls_endpoint.url, ca_bundle=pki / "ca.pem")
    asyncio.run(
        _deliver(
            dsn,
            s,
            {"mtls": hook, "anon": no_cert},
            lambda: (
                message(dsn, s, good).state == "delivered"
                and message(dsn, s, anonymous).last_error is not None
            ),
            max_attempts=1,
        )
    )
    [cert] = tls_endpoint.client_certs
    assert cert["subject"] == ((("commonName", "tenure test client"),),)
    refused = message(dsn, s, anonymous)
    assert refused.state == "dead"
    assert refused.last_error is not None and "POST https://localhost" in refused.last_error


def test_the_relay_command_takes_tls_options_and_honours_the_environments_proxy(
    client: tenure.Client,
    dsn: str,
    tls_endpoint: Endpoint,
    endpoint: Endpoint,
    pki: Path,
    tmp_path: Path,
) -> None:
    s = client.schema
    env = tenure_env(dsn, s)
    env["TENURE_RELAY_CA_BUNDLE"] = str(pki / "ca.pem")  # the env twin of --ca-bundle
    # A proxy from the environment, as on a host that may only reach the outside through one:
    # the "proxy" is the plain endpoint, which sees the absolute URL of a host that does not
    # exist. TLS (--ca-bundle, --client-cert) applies to the HTTPS endpoint, proxy or not.
    env["HTTP_PROXY"] = endpoint.url.removesuffix("/hook")
    env["NO_PROXY"] = "localhost"
    proxied, secure = enqueue(dsn, s, [("proxied", "k1", {}, None), ("secure", "k2", {}, None)])
    relay = RelayProcess(
        [
            *("--webhook", "proxied=http://tenure-outbox-test.invalid/hook"),
            *("--webhook", f"secure={tls_endpoint.url}"),
            *("--client-cert", str(pki / "client.pem"), "--client-key", str(pki / "client.key")),
            *("--poll", "0.5s"),
        ],
        env,
        tmp_path / "relay.log",
        tmp_path,
    )
    try:
        relay.wait_ready()
        wait_for(
            lambda: all(message(dsn, s, i).state == "delivered" for i in (proxied, secure)),
            30,
            "both deliveries",
        )
        assert endpoint.paths == ["http://tenure-outbox-test.invalid/hook"]
        assert len(tls_endpoint.client_certs) == 1
        assert relay.stop() == 0
    finally:
        if relay.proc.poll() is None:
            relay.proc.kill()
            relay.proc.wait(timeout=10)
        if relay.proc.stdout is not None:
            relay.proc.stdout.close()


def test_tls_options_are_checked_up_front(tmp_path: Path) -> None:
    with pytest.raises(tenure.InvalidArgument, match="https"):
        Webhook("http://localhost/hook", ca_bundle=tmp_path / "ca.pem")
    with pytest.raises(tenure.ConfigurationError, match="ca_bundle"):
        Webhook("https://localhost/hook", ca_bundle=tmp_path / "missing.pem")
    with pytest.raises(tenure.InvalidArgument, match="client_key"):
        Webhook("https://localhost/hook", client_key=tmp_path / "client.key")


def test_a_synchronous_handler_that_overruns_keeps_its_claim_until_it_returns(
    client: tenure.Client, dsn: str
) -> None:
    # A thread cannot be interrupted: at the timeout the relay must not let another attempt
    # start (here, or on a second relay) while the first one still runs.
    s = client.schema
    [msg_id] = enqueue(dsn, s, [("sync", "k", {}, None)])
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()

    def handler(m: Any) -> None:
        with lock:
            calls.append(("start", m.attempts))
        if m.attempts == 1:
            time.sleep(2.5)  # past the timeout (0.3 s) and past the claim (1.5 s)
        with lock:
            calls.append(("end", m.attempts))

    async def scenario() -> None:
        async with await tenure.connect_async(dsn, schema=s) as aclient:
            options: dict[str, Any] = {"timeout": 0.3, "visibility": 1.5, "backoff": 0.05}
            relays = [Relay(aclient, {"sync": handler}, **options) for _ in range(2)]
            tasks = [asyncio.create_task(r.run()) for r in relays]
            deadline = time.monotonic() + 30
            while message(dsn, s, msg_id).state != "delivered":
                assert time.monotonic() < deadline, calls
                assert not any(t.done() for t in tasks), tasks
                await asyncio.sleep(0.05)
            for r in relays:
                r.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)

    asyncio.run(scenario())
    # Never two calls at once: every start follows the previous call's end.
    assert calls[0] == ("start", 1)
    for before, after in itertools.pairwise(calls):
        assert before[0] != after[0], f"two attempts in flight at once: {calls}"
    done = message(dsn, s, msg_id)
    assert done.state == "delivered" and done.last_error is None
