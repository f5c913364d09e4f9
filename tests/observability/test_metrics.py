"""Monitoring hooks and the optional Prometheus sink, driven by real lease operations."""

from __future__ import annotations

import time

import prometheus_client
import pytest

import tenure
from tenure import metrics


def _value(registry: prometheus_client.CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_prometheus_counts_acquire_busy_renew_lost_and_stale(client: tenure.Client) -> None:
    registry = prometheus_client.CollectorRegistry()
    unsubscribe = metrics.install_prometheus(registry)
    try:
        first = client.acquire("job", ttl=0.2)
        assert first is not None
        assert client.acquire("job", ttl=0.2) is None
        first.renew()
        time.sleep(0.25)
        second = client.acquire("job", ttl=5)
        assert second is not None
        with pytest.raises(tenure.LeaseLost):
            first.renew()
        client.results.put("job", 1, token=second.token)
        with pytest.raises(tenure.StaleTokenError):
            client.results.put("job", 0, token=first.token)
    finally:
        unsubscribe()
    job = {"job_key": "job"}
    assert _value(registry, "tenure_lease_acquire_total", **job, outcome="acquired") == 2
    assert _value(registry, "tenure_lease_acquire_total", **job, outcome="busy") == 1
    assert _value(registry, "tenure_lease_renew_total", **job, outcome="renewed") == 1
    assert _value(registry, "tenure_lease_lost_total", **job, reason="deadline") == 1
    assert _value(registry, "tenure_stale_token_rejections_total", **job, site="result") == 1
    assert _value(registry, "tenure_leases_held", **job) == 1  # second still held


def test_a_failing_listener_never_breaks_a_lease(
    client: tenure.Client, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: metrics.Event) -> None:
        raise RuntimeError("sink down")

    unsubscribe = metrics.subscribe(broken)
    try:
        lease = client.acquire("job", ttl=5)
    finally:
        unsubscribe()
    assert lease is not None
    assert "metrics listener" in caplog.text


def test_events_carry_no_owner_or_token(client: tenure.Client) -> None:
    events: list[metrics.Event] = []
    unsubscribe = metrics.subscribe(events.append)
    try:
        lease = client.acquire("job", ttl=5)
        assert lease is not None
        lease.renew()
        lease.release()
    finally:
        unsubscribe()
    assert [(e.name, e.outcome) for e in events] == [
        ("lease_acquire", "acquired"),
        ("lease_renew", "renewed"),
        ("lease_release", ""),
    ]
    assert all(str(lease.owner) not in repr(e) for e in events)


def test_a_registry_uninstalled_and_installed_again_counts_afresh(client: tenure.Client) -> None:
    """Uninstalling left the registry's id marked as installed: installing again (into it,
    or into a new registry that got a freed one's id, as registries freed at once do)
    returned the old, unsubscribed function and counted nothing."""
    registry = prometheus_client.CollectorRegistry()
    metrics.install_prometheus(registry)()  # installed, then uninstalled at once
    uninstall = metrics.install_prometheus(registry)
    try:
        lease = client.acquire("j", ttl=5)
        assert lease is not None
        lease.release()
    finally:
        uninstall()
        uninstall()  # twice is harmless
    assert _value(registry, "tenure_lease_acquire_total", job_key="j", outcome="acquired") == 1
    assert client.acquire("j", ttl=5) is not None  # not counted: uninstalled
    again = metrics.install_prometheus(registry)
    try:
        assert client.acquire("k", ttl=5) is not None
    finally:
        again()
    assert _value(registry, "tenure_lease_acquire_total", job_key="j", outcome="acquired") == 1
    assert _value(registry, "tenure_lease_acquire_total", job_key="k", outcome="acquired") == 1
