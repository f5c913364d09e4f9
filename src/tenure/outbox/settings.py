"""A relay's options, in one frozen value: :class:`RelaySettings`.

``tenure relay`` builds it from its flags, :func:`tenure.outbox.relay.serve` and
:class:`~tenure.outbox.relay.Relay` take it (or its fields as keyword arguments), and every
part of the relay reads it; each option is spelled here only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from ..db.retention import DEFAULT_INBOX_RETENTION, DEFAULT_RETENTION, Retention
from ..errors import InvalidArgument
from ..validation import Duration, parse_duration
from ._async.store import check_topic


def claim_margin(timeout: float) -> float:
    """How much longer than a call its claim must last: for clock-rate drift between the
    relay and the database, aborting the call at its deadline and recording the outcome."""
    return max(1.0, timeout / 10)


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """How a relay claims and delivers (durations in seconds; ``"10s"``, ``"5m"`` or a
    timedelta are accepted too and stored as seconds).

    * ``concurrency``: handler calls in flight at once;
    * ``timeout``: per handler call; ``visibility``: how long a claim lasts (``None``:
      ``1.5 * timeout + 5s``, see :attr:`claim_ttl`; at least ``timeout`` +
      :func:`claim_margin`), i.e. how soon a dead relay's messages are retried by others;
    * ``max_attempts``: attempts before a message is parked as dead;
    * ``backoff`` / ``backoff_max``: the retry delay doubles from ``backoff`` up to
      ``backoff_max``, with jitter;
    * ``poll``: longest sleep without a notification;
    * ``topics``: claim only these topics, each of which needs a handler (``None``: every
      topic the relay has a handler for). Messages of other topics are left for the relays
      that handle them;
    * ``retention`` / ``inbox_retention``: while it runs, the relay prunes delivered
      messages older than ``retention`` and inbox claims older than ``inbox_retention`` (at
      least 1d) every few minutes, in short batches (see docs/retention.md); ``None``: it
      does not prune.

    Raises :class:`~tenure.InvalidArgument` for a value out of range.
    """

    concurrency: int = 4
    timeout: float = 10.0
    visibility: float | None = None
    max_attempts: int = 10
    backoff: float = 1.0
    backoff_max: float = 300.0
    poll: float = 5.0
    topics: tuple[str, ...] | None = None
    retention: float | None = parse_duration(DEFAULT_RETENTION)
    inbox_retention: float = parse_duration(DEFAULT_INBOX_RETENTION)

    def __post_init__(self) -> None:
        for name in ("concurrency", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")
        for name in ("timeout", "backoff", "backoff_max", "poll"):
            self._set(name, _positive(getattr(self, name), name))
        if self.visibility is not None:
            self._set("visibility", _positive(self.visibility, "visibility"))
        self._set("backoff_max", max(self.backoff, self.backoff_max))
        if self.claim_ttl < self.timeout + self.margin:
            raise InvalidArgument(
                f"visibility ({self.claim_ttl:g}s) must exceed the handler timeout "
                f"({self.timeout:g}s) by at least {self.margin:g}s: a claim must outlast the "
                "call it covers, or a second relay could deliver the message concurrently; "
                f"raise visibility to {self.timeout + self.margin:g}s or more"
            )
        if self.topics is not None:
            given: Iterable[str] = self.topics
            self._set("topics", tuple(sorted({check_topic(t) for t in given})))
        if self.retention is None:
            self._set("inbox_retention", _seconds(self.inbox_retention))
        else:
            checked = Retention.of(self.retention, self.inbox_retention)
            self._set("retention", checked.history)
            self._set("inbox_retention", checked.inbox)

    @classmethod
    def of(cls, options: dict[str, Any]) -> RelaySettings:
        """From keyword options (``Relay(client, handlers, **options)``), naming any that is
        not a relay option."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidArgument(
                f"unknown relay option(s) {', '.join(unknown)}; the options are "
                f"{', '.join(sorted(known))}"
            )
        return cls(**options)

    @property
    def claim_ttl(self) -> float:
        """How long a claim lasts, in seconds: ``visibility``, or its default."""
        return self.timeout * 1.5 + 5.0 if self.visibility is None else self.visibility

    @property
    def margin(self) -> float:
        """How much earlier than its claim's end a call is cut off (:func:`claim_margin`)."""
        return claim_margin(self.timeout)

    @property
    def pruning(self) -> Retention | None:
        """What the relay prunes while it runs; ``None``: nothing."""
        if self.retention is None:
            return None
        return Retention(self.retention, self.inbox_retention)

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # normalising in __post_init__ of a frozen value


def _positive(value: Duration, what: str) -> float:
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise InvalidArgument(f"{what} must be positive, got {value!r}")
    return seconds


def _seconds(value: Duration) -> float:
    return parse_duration(value, what="inbox_retention")
