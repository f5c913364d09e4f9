"""The built-in webhook handler of the outbox relay: ``POST`` a message's payload as JSON.

HTTP goes through httpx: one connection pool per relay (:class:`HttpSession`, shared by the
relay's webhooks and closed when the relay stops), so consecutive deliveries to one endpoint
reuse a kept-alive connection instead of a new TCP and TLS handshake each; connect, read and
total timeouts; TLS with the system's (or ``SSL_CERT_FILE``'s) CAs, a CA bundle of yours and
a client certificate; proxies from the environment (``HTTP_PROXY``, ``HTTPS_PROXY``,
``ALL_PROXY``, ``NO_PROXY``), as curl and most HTTP clients honour them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import getproxies

import httpx

from .. import tracing
from ..db.dsn import redact
from ..errors import ConfigurationError, InvalidArgument, TenureError
from ..validation import Duration, parse_duration
from .message import Message, encode_part

#: Default connect timeout (the total is the relay's --timeout).
CONNECT_TIMEOUT = 5.0
#: The start of an error answer's body kept in the message's last_error.
SNIPPET = 300
#: Larger answers are not read to the end (their connection is not reused).
MAX_ANSWER = 1 << 20


#: The 4xx answers that ask to try again later: 408 Request Timeout, 425 Too Early, 429 Too
#: Many Requests. Every other 4xx says the request itself is refused, which a retry of the
#: same message will not change: it is final.
RETRIED_4XX = frozenset({408, 425, 429})


class DeliveryFailed(TenureError):
    """A handler's delivery failed (e.g. the webhook answered with a non-2xx status).

    ``final=True``: retrying cannot help (the endpoint refused this message): the relay parks
    it as dead at once instead of after ``max_attempts``. A handler of yours may raise it so
    too."""

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


def _file(path: str | os.PathLike[str] | None, what: str) -> str | None:
    if path is None:
        return None
    text = os.fspath(path)
    if not Path(text).is_file():
        raise ConfigurationError(f"{what} {text!r} is not a readable file")
    return text


def environment_proxies() -> dict[str, str | None]:
    """httpx mount patterns for the environment's proxies (None: that host goes direct).

    The reading httpx does for its default transport (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``; ``NO_PROXY`` as curl reads it), written here because httpx keeps it in a
    private module that any release may change.
    """
    found = getproxies()
    mounts: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        if found.get(scheme):
            url = found[scheme]
            mounts[f"{scheme}://"] = url if "://" in url else f"http://{url}"
    for host in (h.strip() for h in found.get("no", "").split(",")):
        if host == "*":
            return {}
        if not host:
            continue
        if "://" in host:
            mounts[host] = None
            continue
        try:
            address = ipaddress.ip_address(host.split("/")[0])
        except ValueError:
            address = None
        if address is not None and address.version == 6:
            mounts[f"all://[{host}]"] = None
        elif address is not None or host.lower() == "localhost":
            mounts[f"all://{host}"] = None
        else:
            # ".example.com" and "example.com" both cover subdomains; the latter also itself.
            mounts[f"all://*{host}"] = None
    return mounts


class HttpSession:
    """What the webhooks of one relay share: TLS settings and one httpx connection pool.

    ``ca_bundle``: PEM file of the CAs to trust instead of the default ones; ``client_cert``
    (and ``client_key``, if the key is not in the same file): a client certificate for
    endpoints that require one. ``trust_env``: proxies and ``SSL_CERT_FILE`` from the
    environment (default True). The pool is created on first use, in the running event loop,
    and closed by :meth:`aclose` (the relay calls it when it stops).
    """

    def __init__(
        self,
        *,
        ca_bundle: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
        connect_timeout: Duration = CONNECT_TIMEOUT,
        trust_env: bool = True,
    ) -> None:
        if client_key is not None and client_cert is None:
            raise InvalidArgument("client_key needs client_cert (the certificate it belongs to)")
        self.ca_bundle = _file(ca_bundle, "ca_bundle")
        self.client_cert = _file(client_cert, "client_cert")
        self.client_key = _file(client_key, "client_key")
        self.connect_timeout = parse_duration(connect_timeout, what="connect_timeout")
        if self.connect_timeout <= 0:
            raise InvalidArgument(f"connect_timeout must be positive, got {connect_timeout!r}")
        self.trust_env = trust_env
        self.tls = self.ca_bundle is not None or self.client_cert is not None
        self._verify = self._context()
        self._client: httpx.AsyncClient | None = None

    def _context(self) -> ssl.SSLContext:
        # Built now, so a bad bundle or certificate fails at start-up, not on the first POST.
        try:
            if self.ca_bundle is not None:
                context = ssl.create_default_context(cafile=self.ca_bundle)
            else:
                context = httpx.create_ssl_context(trust_env=self.trust_env)
            if self.client_cert is not None:
                context.load_cert_chain(self.client_cert, self.client_key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigurationError(
                f"cannot load the webhook TLS files (ca_bundle={self.ca_bundle}, "
                f"client_cert={self.client_cert}, client_key={self.client_key}): {exc}"
            ) from None
        return context

    def client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(
                transport=self._transport(),
                mounts=self._proxies(),
                verify=self._verify,
                trust_env=self.trust_env,
                follow_redirects=False,
                # read/write/pool are bounded by each call's own timeout (Webhook.__call__).
                timeout=httpx.Timeout(None, connect=self.connect_timeout),
                headers={"User-Agent": "tenure-relay"},
            )
        return self._client

    def _transport(self, proxy: str | None = None) -> httpx.AsyncHTTPTransport:
        return httpx.AsyncHTTPTransport(
            verify=self._verify,
            trust_env=self.trust_env,
            proxy=proxy,
            # A request goes out as two writes (head, then body): without TCP_NODELAY the
            # body waits for the peer's delayed ACK of the head, several ms per delivery.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )

    def _proxies(self) -> dict[str, httpx.AsyncBaseTransport | None]:
        # httpx reads proxies from the environment only for its own default transport; ours
        # (TCP_NODELAY) needs them mounted explicitly, with httpx's own reading of
        # HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY (None: that host goes direct).
        if not self.trust_env:
            return {}
        return {
            pattern: None if proxy is None else self._transport(proxy)
            for pattern, proxy in environment_proxies().items()
        }

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


class Webhook:
    """Built-in handler: ``POST`` the payload as JSON to ``url``.

    Headers: ``Idempotency-Key`` (``message.idempotency_key``: ``TOPIC:KEY``, each part
    percent-encoded, see :func:`tenure.outbox.idempotency_key`; claim it as it arrives with
    :func:`tenure.inbox.claim_header`), ``Content-Type: application/json``,
    ``X-Tenure-Topic`` (percent-encoded like the key's topic part), ``X-Tenure-Message-Id``
    and ``X-Tenure-Attempt``, plus ``headers``. A 2xx answer is a delivery; anything else, a
    connection error or a timeout is a failed attempt, retried with backoff, except a 4xx
    other than 408, 425 and 429 (:data:`RETRIED_4XX`): the endpoint refused the request
    itself, so the failure is final and the message dead at once. Redirects are not followed.

    ``timeout`` (optional) caps each call (connect, send, wait, read) below the relay's
    ``timeout``, ``read_timeout`` the wait for each part of the answer. The relay cancels the
    call at its deadline: the request is aborted and its connection closed, so tenure never
    has two attempts of one message in flight. The endpoint may still be working on an
    aborted request (an HTTP server does not always notice that its client left): dedupe
    with the inbox.

    ``session``: the :class:`HttpSession` (TLS, connection pool) to use; without one, the
    webhook makes its own from ``ca_bundle``, ``client_cert``, ``client_key`` and
    ``connect_timeout``.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: Duration | None = None,
        read_timeout: Duration | None = None,
        headers: Mapping[str, str] | None = None,
        session: HttpSession | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
        connect_timeout: Duration = CONNECT_TIMEOUT,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(
                f"webhook URL must be http:// or https:// with a host, got {url!r}"
            )
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError:
            raise InvalidArgument(f"webhook URL {url!r} has an invalid port") from None
        own_tls = ca_bundle is not None or client_cert is not None or client_key is not None
        if own_tls and parts.scheme != "https":
            raise InvalidArgument(
                f"TLS options (ca_bundle, client_cert, client_key) need an https:// URL, got "
                f"{parts.scheme}://"
            )
        if session is not None and own_tls:
            raise InvalidArgument("pass TLS options to the session or to the webhook, not both")
        self.url = url
        hostport = parts.netloc.rsplit("@", 1)[-1]
        # For errors and logs: never the credentials or the query string.
        self.safe_url = f"{parts.scheme}://{hostport}{parts.path or '/'}"
        self.timeout = None if timeout is None else _positive(timeout, "timeout")
        self.read_timeout = None if read_timeout is None else _positive(read_timeout, "read")
        extra = dict(headers or {})
        for name, value in extra.items():
            if any(c in f"{name}{value}" for c in "\r\n\x00") or not name.strip():
                raise InvalidArgument(f"invalid webhook header {name!r}: {value!r}")
        self._extra = extra
        self._session = session or HttpSession(
            ca_bundle=ca_bundle,
            client_cert=client_cert,
            client_key=client_key,
            connect_timeout=connect_timeout,
        )

    def __repr__(self) -> str:
        return f"Webhook({self.safe_url!r})"

    async def aclose(self) -> None:
        """Close the connection pool (the relay does, when it stops)."""
        await self._session.aclose()

    async def __call__(self, message: Message) -> None:
        body = json.dumps(message.payload, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": message.idempotency_key,
            "X-Tenure-Topic": encode_part(message.topic, ""),
            "X-Tenure-Message-Id": str(message.id),
            "X-Tenure-Attempt": str(message.attempts),
            **self._extra,
        }
        # W3C trace context: the relay's delivery span (a child of the enqueuing span), or the
        # stored context as is where the relay records no spans.
        tracing.inject(headers, fallback=message.traceparent)
        try:
            if self.timeout is None:
                status, reason, snippet = await self._post(headers, body)
            else:
                async with asyncio.timeout(self.timeout):
                    status, reason, snippet = await self._post(headers, body)
        except TimeoutError:
            raise DeliveryFailed(
                f"POST {self.safe_url}: no answer within {self.timeout:g}s"
            ) from None
        if not 200 <= status < 300:
            final = 400 <= status < 500 and status not in RETRIED_4XX
            raise DeliveryFailed(
                f"POST {self.safe_url} answered HTTP {status} {reason}"
                + (f": {snippet}" if snippet else "")
                + ("; a 4xx other than 408, 425 and 429 is final: not retried" if final else ""),
                final=final,
            )

    async def _post(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str, str]:
        client = self._session.client()
        extensions = {}
        if self.read_timeout is not None:
            extensions["timeout"] = {
                "connect": self._session.connect_timeout,
                "read": self.read_timeout,
                "write": self.read_timeout,
                "pool": None,
            }
        try:
            request = client.build_request(
                "POST", self.url, headers=headers, content=body, extensions=extensions
            )
            response = await client.send(request, stream=True)
            try:
                # Read the answer (a connection is reused only once its answer was read),
                # up to a limit: past it, the connection is closed instead.
                ok = 200 <= response.status_code < 300
                data = b""
                async for chunk in response.aiter_bytes():
                    data += chunk if not ok else b""
                    if len(data) >= SNIPPET or response.num_bytes_downloaded > MAX_ANSWER:
                        break
                # Stored, listed and logged: without the secrets an error page may quote.
                text = redact(" ".join(data.decode("utf-8", "replace").split())[:SNIPPET])
                return response.status_code, response.reason_phrase, text
            finally:
                await response.aclose()
        except (httpx.HTTPError, OSError) as exc:
            # OSError: a TLS alert that arrives after the handshake (TLS 1.3 reports a missing
            # client certificate on the first read) passes through httpx as ssl.SSLError.
            raise DeliveryFailed(f"POST {self.safe_url}: {_describe(exc)}") from None


def _describe(exc: Exception) -> str:
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"


def _positive(value: Duration, what: str) -> float:
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise InvalidArgument(f"{what} must be positive, got {value!r}")
    return seconds


def webhook(
    url: str,
    *,
    timeout: Duration | None = None,
    headers: Mapping[str, str] | None = None,
    session: HttpSession | None = None,
) -> Webhook:
    """A :class:`Webhook` handler for ``url``."""
    return Webhook(url, timeout=timeout, headers=headers, session=session)
