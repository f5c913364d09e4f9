"""Patroni faults with ``synchronous_mode``, under load: Patroni promotes only its
synchronous standby, so on top of the asynchronous module's checks no acknowledged write
may be lost. See docs/topologies/patroni.md. ``-m ha`` runs the HA tests alone.
"""

from __future__ import annotations

import pytest

from .cluster import PatroniCluster
from .faults import ALL, run_fault

SYNCHRONOUS = True
pytestmark = [pytest.mark.ha, pytest.mark.slow, pytest.mark.timeout(240)]

CI_FAULTS = ["switchover"]
FAULTS = ["kill9", "switchover", "failover", "partition"] if ALL else CI_FAULTS


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_under_load(cluster: PatroniCluster, fault: str) -> None:
    run_fault(cluster, fault)
