"""One outbox message as the database saw it, the states it goes through, and its
Idempotency-Key (the header a consumer deduplicates on)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Literal

from ..db.rows import row_of
from ..errors import InvalidArgument

State = Literal["pending", "delivered", "dead"]
STATES: tuple[State, ...] = ("pending", "delivered", "dead")


@row_of("outbox_claim", "outbox_list")  # built by position: Message(*row)
@dataclass(frozen=True, slots=True)
class Message:
    """One outbox message as the database saw it (times are database times).

    ``attempts`` counts claims by relays, including the one delivering it now (a handler sees
    1 on the first delivery). ``token`` and ``job_key`` say which fenced execution enqueued
    it, when the caller passed them.
    """

    id: int
    topic: str
    key: str
    payload: Any
    order_key: str | None
    job_key: str | None
    token: int | None
    state: State
    attempts: int
    created_at: dt.datetime
    available_at: dt.datetime
    last_error: str | None
    last_attempt_at: dt.datetime | None
    delivered_at: dt.datetime | None
    claimed_until: dt.datetime | None
    #: The W3C trace context current when it was enqueued (with OpenTelemetry), else None.
    traceparent: str | None = None

    @property
    def idempotency_key(self) -> str:
        """What a consumer deduplicates on, exactly the webhook's ``Idempotency-Key`` header:
        see :func:`idempotency_key`."""
        return idempotency_key(self.topic, self.key)


@dataclass(frozen=True, slots=True)
class UnhandledTopic:
    """Pending messages of a topic that no live relay has a handler for: they wait (never
    claimed, never parked) until a relay with one starts. ``oldest_age`` in seconds."""

    topic: str
    pending: int
    oldest_age: float


# -- the Idempotency-Key ------------------------------------------------------------------------

_TOPIC = re.compile(r"^[\w.:/-]+$")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def encode_part(text: str, also: str) -> str:
    out = []
    for ch in text:
        if "!" <= ch <= "~" and ch != "%" and ch not in also:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


def _decode(text: str, header: str) -> str:
    # Every "%" starts an escape of two hex digits (a literal "%" is sent as "%25").
    if text.count("%") != len(_ESCAPE.findall(text)):
        raise InvalidArgument(
            f"malformed Idempotency-Key {header!r}: a '%' not followed by two hex digits"
        )
    try:
        data = bytearray()
        for i, part in enumerate(_ESCAPE.split(text)):
            data += bytes([int(part, 16)]) if i % 2 else part.encode("ascii")
        return data.decode("utf-8")
    except (UnicodeError, ValueError):
        raise InvalidArgument(
            f"malformed Idempotency-Key {header!r}: not percent-encoded UTF-8"
        ) from None


def idempotency_key(topic: str, key: str) -> str:
    """The ``Idempotency-Key`` of message ``(topic, key)``: ``TOPIC:KEY``, each part
    percent-encoded as UTF-8 where it is not visible ASCII (``%`` itself becomes ``%25``), and
    every ``:`` of the topic as ``%3A``. The first ``:`` therefore always separates the two
    parts, so two different messages never share a key (topic ``a:b`` key ``c`` gives
    ``a%3Ab:c``; topic ``a`` key ``b:c`` gives ``a:b:c``). A topic without ``:`` and a key of
    visible ASCII without ``%`` read as plain ``topic:key``. The value is visible ASCII only,
    a valid header value that no key can break."""
    return f"{encode_part(topic, ':')}:{encode_part(key, '')}"


def parse_idempotency_key(header: str) -> tuple[str, str]:
    """``(topic, key)`` from an ``Idempotency-Key`` made by :func:`idempotency_key`; raises
    :class:`~tenure.InvalidArgument` for anything else (escapes may be in either case)."""
    if not isinstance(header, str) or not all("!" <= ch <= "~" for ch in header):
        raise InvalidArgument(
            f"malformed Idempotency-Key {header!r}: expected visible ASCII, TOPIC:KEY"
        )
    topic_part, sep, key_part = header.partition(":")
    if not sep or not topic_part or not key_part:
        raise InvalidArgument(f"malformed Idempotency-Key {header!r}: expected TOPIC:KEY")
    topic, key = _decode(topic_part, header), _decode(key_part, header)
    if not _TOPIC.match(topic):
        raise InvalidArgument(f"malformed Idempotency-Key {header!r}: {topic!r} is not a topic")
    return topic, key
