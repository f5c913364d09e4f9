"""Patroni faults with asynchronous replication (Patroni's default), under load.

The timeline floor in every token keeps tokens unique across a promotion even when the
last commits are lost: the ``lagging`` fault loses them on purpose (its standbys get no WAL
for 2 s before the leader dies), and must lose some. See docs/topologies/patroni.md.
``-m ha`` runs the HA tests alone.
"""

from __future__ import annotations

import pytest

from .cluster import PatroniCluster
from .faults import ALL, EVERY, run_fault
from .standby import check_standby

SYNCHRONOUS = False
CLIENT_PROXIES = True  # the clients reach each member through proxies: "clientcut"
pytestmark = [pytest.mark.ha, pytest.mark.slow, pytest.mark.timeout(240)]

CI_FAULTS = ["lagging", "partition", "clientcut", "clientcut@multihost"]
FAULTS = [*EVERY, "clientcut", "clientcut@multihost"] if ALL else CI_FAULTS


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_under_load(cluster: PatroniCluster, fault: str) -> None:
    run_fault(cluster, fault)


def test_read_only_views_work_on_a_standby_and_writes_say_why_not(
    cluster: PatroniCluster,
) -> None:
    check_standby(cluster)
