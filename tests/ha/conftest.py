"""The HA tests' cluster: one three-member Patroni cluster (etcd, HAProxy) per test module,
started by the module's first test and killed after its last, failing or not.

A module sets ``SYNCHRONOUS = True`` for Patroni's ``synchronous_mode``, and
``ETCD_MEMBERS = 3`` for a three-member etcd (one by default), ``CLIENT_PROXIES = True`` for
the clients to reach the members through proxies that can cut one off the clients. Skipped, with the
reason, when patroni, etcd or haproxy is missing (``scripts/test`` installs them as root).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import PatroniCluster, missing_tools


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    why = missing_tools()
    if why is not None:
        pytest.skip(why)
    with PatroniCluster(
        synchronous=getattr(request.module, "SYNCHRONOUS", False),
        etcd_members=getattr(request.module, "ETCD_MEMBERS", 1),
        client_proxies=getattr(request.module, "CLIENT_PROXIES", False),
    ) as c:
        yield c
