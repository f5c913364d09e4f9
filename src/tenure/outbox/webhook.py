"""The built-in webhook handler of the outbox relay: ``POST`` a message's payload as JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

from ..errors import InvalidArgument, TenureError
from ..validation import Duration, parse_duration
from .message import Message


class DeliveryFailed(TenureError):
    """A handler's delivery failed (e.g. the webhook answered with a non-2xx status)."""


def _header_value(text: str) -> str:
    """Visible ASCII passes unchanged; anything else (spaces, control characters, non-ASCII)
    is percent-encoded as UTF-8, so a key can never inject a header line and the encoding is
    the same on every retry."""
    out = []
    for ch in text:
        if "!" <= ch <= "~" and ch != "%":
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


class Webhook:
    """Built-in handler: ``POST`` the payload as JSON to ``url``.

    Headers: ``Idempotency-Key: <topic>:<key>`` (the business key; non-visible characters
    percent-encoded), ``Content-Type: application/json``, ``X-Tenure-Topic``,
    ``X-Tenure-Message-Id`` and ``X-Tenure-Attempt``, plus ``headers``. A 2xx answer is a
    delivery; anything else, a connection error or the timeout is a failed attempt.
    ``timeout`` (optional) caps each call below the relay's ``timeout``. Redirects are not
    followed. Standard library only (asyncio streams), so a timeout really abandons the call.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: Duration | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(
                f"webhook URL must be http:// or https:// with a host, got {url!r}"
            )
        try:
            port = parts.port
        except ValueError:
            raise InvalidArgument(f"webhook URL {url!r} has an invalid port") from None
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._https else 80)
        self._hostport = parts.netloc.rsplit("@", 1)[-1]
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # For errors and logs: never the credentials or the query string.
        self.safe_url = f"{parts.scheme}://{self._hostport}{parts.path or '/'}"
        self.timeout = None if timeout is None else parse_duration(timeout, what="timeout")
        extra = dict(headers or {})
        for name, value in extra.items():
            if any(c in f"{name}{value}" for c in "\r\n\x00") or not name.strip():
                raise InvalidArgument(f"invalid webhook header {name!r}: {value!r}")
        self._extra = extra

    def __repr__(self) -> str:
        return f"Webhook({self.safe_url!r})"

    async def __call__(self, message: Message) -> None:
        body = json.dumps(message.payload, separators=(",", ":")).encode()
        headers = {
            "Host": self._hostport,
            "User-Agent": "tenure-relay",
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            "Idempotency-Key": _header_value(message.idempotency_key),
            "X-Tenure-Topic": message.topic,
            "X-Tenure-Message-Id": str(message.id),
            "X-Tenure-Attempt": str(message.attempts),
            "Connection": "close",
            **self._extra,
        }
        if self.timeout is None:
            status, reason, snippet = await self._post(headers, body)
        else:
            try:
                async with asyncio.timeout(self.timeout):
                    status, reason, snippet = await self._post(headers, body)
            except TimeoutError:
                raise DeliveryFailed(
                    f"POST {self.safe_url}: no answer within {self.timeout:g}s"
                ) from None
        if not 200 <= status < 300:
            raise DeliveryFailed(
                f"POST {self.safe_url} answered HTTP {status} {reason}"
                + (f": {snippet}" if snippet else "")
            )

    async def _post(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str, str]:
        context = ssl.create_default_context() if self._https else None
        try:
            reader, writer = await asyncio.open_connection(self._host, self._port, ssl=context)
        except OSError as exc:
            raise DeliveryFailed(f"POST {self.safe_url}: cannot connect ({exc})") from None
        try:
            head = f"POST {self._target} HTTP/1.1\r\n" + "".join(
                f"{name}: {value}\r\n" for name, value in headers.items()
            )
            writer.write(head.encode("latin-1") + b"\r\n" + body)
            await writer.drain()
            status_line = await reader.readline()
            fields = status_line.decode("latin-1").split(" ", 2)
            if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
                raise DeliveryFailed(
                    f"POST {self.safe_url}: not an HTTP answer ({status_line[:80]!r})"
                )
            status = int(fields[1])
            reason = fields[2].strip() if len(fields) > 2 else ""
            if 200 <= status < 300:
                return status, reason, ""
            return status, reason, await _body_snippet(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            raise DeliveryFailed(f"POST {self.safe_url}: {type(exc).__name__}: {exc}") from None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _body_snippet(reader: asyncio.StreamReader, limit: int = 300) -> str:
    """The start of an error answer's body, for the message's last_error."""
    length: int | None = None
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = int(value.strip())
        elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if chunked:
        size = (await reader.readline()).split(b";")[0].strip()
        length = int(size, 16) if size else 0
    data = await reader.read(min(limit, length) if length is not None else limit)
    return " ".join(data.decode("utf-8", "replace").split())[:limit]


def webhook(
    url: str, *, timeout: Duration | None = None, headers: Mapping[str, str] | None = None
) -> Webhook:
    """A :class:`Webhook` handler for ``url``."""
    return Webhook(url, timeout=timeout, headers=headers)
