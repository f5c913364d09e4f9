"""OpenTelemetry spans, optional: ``pip install tenure[otel]`` (the API only; the application
installs and configures the SDK and its exporter, as OpenTelemetry intends for libraries).

Without ``opentelemetry`` importable, or before the application sets a tracer provider, every
function here is a no-op costing a global read or two.
With it, tenure makes three kinds of span, named and attributed so that a trace viewer shows
what a fencing token did:

* ``tenure.run`` around a scheduled job body (``tenure.job_key``, ``tenure.token``,
  ``tenure.slot``, ``tenure.kind``, ``tenure.attempt``, ``tenure.lateness_s`` and at its end
  ``tenure.outcome``), current while the body runs, so the body's own spans nest under it
  (an async body's task and a sync body's thread both inherit the context);
* ``tenure.exec`` around a ``tenure exec`` run (key, token, the command's exit status);
* ``tenure.outbox.deliver`` around one delivery attempt by the relay, a child of the span
  that was current when the message was enqueued: its W3C ``traceparent`` is stored with the
  message (migration 15) and the webhook sends the delivery's own context as ``traceparent``,
  so the receiver's spans join the trace of the run that enqueued the message.

A span's status is ERROR for a failed body, a lost lease and a refused write; "busy" and
"already done" are not errors.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, MutableMapping
from typing import Any

#: Outcomes that mark a span as an error (the rest, succeeded and cancelled, are fine).
ERROR_OUTCOMES = frozenset({"failed", "lease_lost", "stale_rejected", "abandoned"})

_api: Any = None  # the opentelemetry modules once imported, False when absent
_TRACER = "tenure"


def _otel() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import context, propagate, trace
        except ImportError:
            _api = False
        else:
            _api = (trace, propagate, context)
    return _api


_provider_set = False  # once set, the global tracer provider cannot change


def enabled() -> bool:
    """Whether spans would be recorded: the OpenTelemetry API is importable and the
    application has set a tracer provider (until it does, the API's is a proxy to nothing,
    and tenure's hot paths skip even the no-op spans). A worker asks per run: once a
    provider is set the answer is remembered (OpenTelemetry sets the global one once), as
    the API reads the environment each time it is asked."""
    global _provider_set
    if _provider_set:
        return True
    api = _otel()
    if not api:
        return False
    provider = api[0].get_tracer_provider()
    _provider_set = not isinstance(
        provider, (api[0].ProxyTracerProvider, api[0].NoOpTracerProvider)
    )
    return _provider_set


class Span:
    """What tenure's code may do with one of its spans; a no-op without OpenTelemetry."""

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, name: str, value: Any) -> None:
        if self._span is not None and value is not None:
            self._span.set_attribute(name, _attribute(value))

    def outcome(self, outcome: str, error: str | None = None) -> None:
        """The run's end: ``tenure.outcome``, and an ERROR status for a failure."""
        if self._span is None:
            return
        self._span.set_attribute("tenure.outcome", outcome)
        if outcome in ERROR_OUTCOMES:
            trace = _otel()[0]
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, error or outcome))


_NOOP = Span()


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any], *, parent: str | None = None) -> Iterator[Span]:
    """A span named ``name``, current inside the block. ``parent``: a W3C ``traceparent``
    to continue (an outbox message's), else the current context's span is the parent."""
    if not enabled():
        yield _NOOP
        return
    trace, propagate, _context = _otel()
    parent_context = propagate.extract({"traceparent": parent}) if parent else None
    tracer = trace.get_tracer(_TRACER)
    attrs = {k: _attribute(v) for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(
        name, context=parent_context, attributes=attrs, record_exception=False
    ) as current:
        yield Span(current)


def run_span(
    job_key: str, token: int, slot: dt.datetime, kind: str, attempt: int, lateness: float | None
) -> contextlib.AbstractContextManager[Span]:
    """The ``tenure.run`` span of one scheduled run."""
    return span(
        "tenure.run",
        {
            "tenure.job_key": job_key,
            "tenure.token": token,
            "tenure.slot": slot.isoformat(),
            "tenure.kind": kind,
            "tenure.attempt": attempt,
            "tenure.lateness_s": lateness,
        },
    )


def traceparent() -> str | None:
    """The current span's W3C ``traceparent``, to store with an outbox message; None without
    OpenTelemetry or outside any span."""
    if not enabled():
        return None
    carrier: dict[str, str] = {}
    _otel()[1].inject(carrier)
    return carrier.get("traceparent")


def inject(headers: MutableMapping[str, str], fallback: str | None = None) -> None:
    """Put the current context's ``traceparent`` (and ``tracestate``) into ``headers``; without
    a current span, ``fallback`` (the message's stored one) so the receiver still joins the
    enqueuing trace."""
    if enabled():
        _otel()[1].inject(headers)
    if fallback and "traceparent" not in headers:
        headers["traceparent"] = fallback


def _attribute(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    return str(value)
