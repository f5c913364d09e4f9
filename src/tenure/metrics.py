"""A small event-hook layer for monitoring, with an optional Prometheus sink.

tenure emits one :class:`Event` per lease acquire, renewal, loss, release and stale-token
rejection. Anything can subscribe (OpenTelemetry, structlog, a test); the Prometheus sink is
one subscriber, installed with :func:`install_prometheus` when ``prometheus_client`` is
present (``pip install tenure[prometheus]``). Labels are low-cardinality: job and outcome,
never owner or token.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tenure.metrics")

#: Event names and the outcome values each carries.
ACQUIRE = "lease_acquire"  # outcome: acquired | busy | error
RENEW = "lease_renew"  # outcome: renewed | lost | error
LOST = "lease_lost"  # outcome: the reason (refused | deadline | released_elsewhere)
RELEASE = "lease_release"  # value: seconds the lease was held
STALE = "stale_token_rejection"  # outcome: the site (result | fence)
JOB = "job_run"  # outcome: succeeded | failed | lease_lost | ...; value: duration seconds
JOB_LATENESS = "job_lateness"  # scheduler: value: run start minus its slot, database clock (s)


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    job: str
    outcome: str = ""
    value: float | None = None


Listener = Callable[[Event], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` for every event; returns a function that unsubscribes it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(name: str, job: str, outcome: str = "", value: float | None = None) -> None:
    if not _listeners:
        return
    event = Event(name, job, outcome, value)
    for listener in tuple(_listeners):
        try:
            listener(event)
        except Exception:  # a broken sink must never break a lease
            log.exception("metrics listener %r failed on %s", listener, name)


_installed: dict[int, Callable[[], None]] = {}


def install_prometheus(registry: Any = None) -> Callable[[], None]:
    """Export tenure's events as Prometheus metrics in ``registry`` (default: the global one).

    Returns the unsubscribe function. Installing twice into one registry is a no-op.
    """
    try:
        import prometheus_client as prom
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from .errors import ConfigurationError

        raise ConfigurationError(
            "prometheus_client is not installed: pip install 'tenure[prometheus]'"
        ) from exc
    registry = registry if registry is not None else prom.REGISTRY
    if id(registry) in _installed:
        return _installed[id(registry)]
    kw: dict[str, Any] = {"registry": registry}
    acquire = prom.Counter(
        "tenure_lease_acquire", "Lease acquire attempts by outcome", ["job", "outcome"], **kw
    )
    renew = prom.Counter(
        "tenure_lease_renew", "Lease renewals by outcome", ["job", "outcome"], **kw
    )
    lost = prom.Counter("tenure_lease_lost", "Leases lost while held", ["job", "reason"], **kw)
    stale = prom.Counter(
        "tenure_stale_token_rejections",
        "Writes rejected for a stale fencing token: timing assumptions were broken",
        ["job", "site"],
        **kw,
    )
    held = prom.Gauge("tenure_leases_held", "Leases this process holds", ["job"], **kw)
    duration = prom.Histogram(
        "tenure_job_duration_seconds", "Job run duration", ["job", "outcome"], **kw
    )
    runs = prom.Counter("tenure_job_runs", "Job runs by outcome", ["job", "outcome"], **kw)

    def sink(event: Event) -> None:
        if event.name == ACQUIRE:
            acquire.labels(event.job, event.outcome).inc()
            if event.outcome == "acquired":
                held.labels(event.job).inc()
        elif event.name == RENEW:
            renew.labels(event.job, event.outcome).inc()
        elif event.name == LOST:
            lost.labels(event.job, event.outcome).inc()
            held.labels(event.job).dec()
        elif event.name == RELEASE:
            held.labels(event.job).dec()
        elif event.name == STALE:
            stale.labels(event.job, event.outcome).inc()
        elif event.name == JOB:
            runs.labels(event.job, event.outcome).inc()
            if event.value is not None:
                duration.labels(event.job, event.outcome).observe(event.value)

    unsubscribe = subscribe(sink)
    _installed[id(registry)] = unsubscribe
    return unsubscribe
