"""A small event-hook layer for monitoring, with an optional Prometheus sink.

tenure emits one :class:`Event` per lease acquire, renewal, loss, release and stale-token
rejection. Anything can subscribe (OpenTelemetry, structlog, a test); the Prometheus sink is
one subscriber, installed with :func:`install_prometheus` when ``prometheus_client`` is
present (``pip install tenure[prometheus]``). Labels are low-cardinality: ``job_key`` and
outcome (``topic`` for the outbox), never owner or token. The label is ``job_key``, not
``job``: ``job`` is Prometheus' target label, which would overwrite it at scrape time (stored
as ``exported_job`` under the default ``honor_labels: false``). :attr:`Event.job` keeps its
name: it is the event's job key, not a label.

Several processes (gunicorn, a pre-fork server): set ``PROMETHEUS_MULTIPROC_DIR`` to an
empty directory before the processes start, as prometheus_client documents; each process
calls :func:`install_prometheus` and one endpoint exposes them all
(:func:`tenure.observability.exporter.exposition_registry`). ``tenure_leases_held`` is then
summed over the live processes; call ``prometheus_client.multiprocess.mark_process_dead(pid)``
when a process exits (gunicorn's ``child_exit`` hook).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .errors import InvalidArgumentType

log = logging.getLogger("tenure.metrics")

#: Event names and the outcome values each carries.
ACQUIRE = "lease_acquire"  # outcome: acquired | busy | error
RENEW = "lease_renew"  # outcome: renewed | lost | error
LOST = "lease_lost"  # outcome: the reason (refused | deadline)
RELEASE = "lease_release"  # value: seconds the lease was held
STALE = "stale_token_rejection"  # outcome: the site (result | fence)
JOB = "job_run"  # outcome: succeeded | failed | lease_lost | ...; value: duration seconds
JOB_LATENESS = "job_lateness"  # scheduler: value: run start minus its slot, database clock (s)
OUTBOX_DELIVERY = "outbox_delivery"  # job = topic; outcome: delivered | retry | dead | lost_claim
SATURATED = "worker_saturated"  # job = app name; outcome: saturated | ok; value: 1.0 | 0.0
LOOP_LAG = "worker_loop_lag"  # job = app name; value: longest loop block of the last minute (s)

#: Label values created at zero as soon as a process acquires a job, so that the first
#: renewal failure, lost lease or stale rejection shows as an increase (Prometheus'
#: increase() cannot see the first increment of a series that appears already at 1).
_RENEW_OUTCOMES = ("renewed", "lost", "error")
_LOST_REASONS = ("refused", "deadline")
_STALE_SITES = ("result", "fence")

#: Buckets (seconds). Job runs: from milliseconds to an hour. Lateness: a healthy worker
#: starts a slot within milliseconds; seconds mean a busy or stalled worker, minutes a
#: missing one.
_INF = float("inf")
DURATION_BUCKETS: tuple[float, ...] = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    *(30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, _INF),
)
LATENESS_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    *(10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, _INF),
)
DELIVERY_BUCKETS: tuple[float, ...] = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, _INF),
)


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    job: str  # the job key (the topic for OUTBOX_DELIVERY): label job_key (topic) in Prometheus
    outcome: str = ""
    value: float | None = None


Listener = Callable[[Event], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` for every event; returns a function that unsubscribes it."""
    if not callable(listener):
        raise InvalidArgumentType(
            f"listener must be callable (it receives an Event), got {listener!r}"
        )
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


class _Export:
    """tenure's metrics in one Prometheus registry. Kept for good, with the registry: the
    registry's id is the key, and a registry freed while its entry stayed let a new one,
    given the same id, be taken for installed (so it counted nothing)."""

    def __init__(self, registry: Any, sink: Listener) -> None:
        self.registry = registry
        self.sink = sink
        self.remove: Callable[[], None] | None = None

    def subscribe(self) -> Callable[[], None]:
        if self.remove is None:
            self.remove = subscribe(self.sink)
        return self.unsubscribe

    def unsubscribe(self) -> None:
        remove, self.remove = self.remove, None
        if remove is not None:
            remove()


_installed: dict[int, _Export] = {}


#: What became of one delivery attempt of an outbox message.
DeliveryOutcome = Literal["delivered", "retry", "dead", "lost_claim"]


def delivery(topic: str, outcome: DeliveryOutcome, seconds: float) -> None:
    """One outbox delivery attempt of ``topic`` ended (the relay's metric): counted by
    outcome, its duration observed (``tenure_outbox_delivery_*`` in Prometheus)."""
    emit(OUTBOX_DELIVERY, topic, outcome, seconds)


def install_prometheus(registry: Any = None) -> Callable[[], None]:
    """Export tenure's events as Prometheus metrics in ``registry`` (default: the global one).

    Returns the unsubscribe function. Installing twice into one registry is a no-op; after
    unsubscribing, installing again exports into the same metrics again.
    """
    try:
        import prometheus_client as prom
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from .errors import ConfigurationError

        raise ConfigurationError(
            "prometheus_client is not installed: pip install 'tenure[prometheus]'"
        ) from exc
    registry = registry if registry is not None else prom.REGISTRY
    with _lock:
        export = _installed.get(id(registry))
    if export is not None:  # installed before (and maybe uninstalled since): export again
        return export.subscribe()
    kw: dict[str, Any] = {"registry": registry}
    acquire = prom.Counter(
        "tenure_lease_acquire", "Lease acquire attempts by outcome", ["job_key", "outcome"], **kw
    )
    renew = prom.Counter(
        "tenure_lease_renew", "Lease renewals by outcome", ["job_key", "outcome"], **kw
    )
    lost = prom.Counter("tenure_lease_lost", "Leases lost while held", ["job_key", "reason"], **kw)
    stale = prom.Counter(
        "tenure_stale_token_rejections",
        "Writes rejected for a stale fencing token: timing assumptions were broken",
        ["job_key", "site"],
        **kw,
    )
    # livesum: in multiprocess mode, the sum over live processes (a dead one holds nothing).
    held = prom.Gauge(
        "tenure_leases_held",
        "Leases this process holds",
        ["job_key"],
        multiprocess_mode="livesum",
        **kw,
    )
    duration = prom.Histogram(
        "tenure_job_duration_seconds",
        "Job run duration",
        ["job_key", "outcome"],
        buckets=DURATION_BUCKETS,
        **kw,
    )
    runs = prom.Counter("tenure_job_runs", "Job runs by outcome", ["job_key", "outcome"], **kw)
    lateness = prom.Histogram(
        "tenure_schedule_lateness_seconds",
        "How late a scheduled run started after its slot (database clock)",
        ["job_key"],
        buckets=LATENESS_BUCKETS,
        **kw,
    )
    # livemax: in multiprocess mode, 1 if any live worker process of the app is saturated.
    saturated = prom.Gauge(
        "tenure_worker_saturated",
        "1 while a scheduler worker cannot keep up (slots skipped or started over 1s late)",
        ["app"],
        multiprocess_mode="livemax",
        **kw,
    )
    # livemax: in multiprocess mode, the worst of the app's live worker processes.
    loop_lag = prom.Gauge(
        "tenure_worker_loop_lag_seconds",
        "Longest a scheduler worker's event loop was blocked in the last minute (a job "
        "doing sync work inside async def)",
        ["app"],
        multiprocess_mode="livemax",
        **kw,
    )
    deliveries = prom.Counter(
        "tenure_outbox_delivery_attempts",
        "Outbox delivery attempts by outcome (delivered, retry, dead, lost_claim)",
        ["topic", "outcome"],
        **kw,
    )
    delivery_time = prom.Histogram(
        "tenure_outbox_delivery_duration_seconds",
        "Outbox handler call duration, any outcome",
        ["topic"],
        buckets=DELIVERY_BUCKETS,
        **kw,
    )

    def sink(event: Event) -> None:
        if event.name == ACQUIRE:
            acquire.labels(event.job, event.outcome).inc()
            if event.outcome == "acquired":
                held.labels(event.job).inc()
                for outcome in _RENEW_OUTCOMES:
                    renew.labels(event.job, outcome)
                for reason in _LOST_REASONS:
                    lost.labels(event.job, reason)
                for site in _STALE_SITES:
                    stale.labels(event.job, site)
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
        elif event.name == JOB_LATENESS:
            if event.value is not None:
                # A run claimed a hair before its slot by the database clock counts as on time.
                lateness.labels(event.job).observe(max(0.0, event.value))
        elif event.name == SATURATED:
            saturated.labels(event.job).set(event.value or 0.0)
        elif event.name == LOOP_LAG:
            loop_lag.labels(event.job).set(event.value or 0.0)
        elif event.name == OUTBOX_DELIVERY:
            deliveries.labels(event.job, event.outcome).inc()
            if event.value is not None:
                delivery_time.labels(event.job).observe(event.value)

    export = _Export(registry, sink)
    with _lock:
        _installed[id(registry)] = export
    return export.subscribe()
