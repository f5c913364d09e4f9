"""Patroni faults with ``synchronous_mode``, under load: Patroni promotes only its
synchronous standby, so on top of the asynchronous module's checks no acknowledged write
may be lost. This module's etcd has three members (the asynchronous module's has one), and
``etcd-kill9`` kills the etcd leader together with the primary. See
docs/topologies/patroni.md. ``-m ha`` runs the HA tests alone.
"""

from __future__ import annotations

import pytest

from .cluster import PatroniCluster
from .faults import ALL, EVERY, run_fault, verify_with_patroni_faults

SYNCHRONOUS = True
ETCD_MEMBERS = 3
pytestmark = [pytest.mark.ha, pytest.mark.slow, pytest.mark.timeout(240)]

CI_FAULTS = ["lagging", "failover@multihost", "etcd-kill9"]
FAULTS = [*EVERY, "etcd-kill9"] if ALL else CI_FAULTS


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_under_load(cluster: PatroniCluster, fault: str) -> None:
    run_fault(cluster, fault)


def test_verify_checker_under_switchovers_and_crashes(cluster: PatroniCluster) -> None:
    """tenure verify's own workload (library leases with fence() and results.put, the
    scheduler's claim path) and checker, its server restarts made Patroni switchovers and
    postmaster kills: with synchronous mode every invariant holds, acknowledged takeovers
    included (``acquire-lost``)."""
    result = verify_with_patroni_faults(cluster, seconds=15)
    text = result.text()
    print(text)
    assert result.violations == (), text
    assert result.crashes == (), text
    assert result.faults.get("restart", 0) >= 1, result.faults
    ops = result.ops
    assert ops["acquire"].get("ok", 0) >= 20 and ops["claim"].get("ok", 0) >= 1, ops
