"""Fixtures of the highly available PostgreSQL tests: a Patroni cluster (cluster.py) per test
module, shared by its tests and put back together before each one, and a network namespace
(netns.py) for a server that a test cuts off from the database.

Every test here is marked `ha` and runs in the normal suite (under CI=true a missing tool
fails it, support.missing). Starting the cluster takes 3-5 s; a failover about `ttl` (10 s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import PatroniCluster, patroni_cluster
from netns import NetNamespace


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ha: a test on a highly available PostgreSQL (Patroni, etcd); runs in the"
                   " normal suite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.ha)


@pytest.fixture(scope="module")
def ha_cluster_shared() -> Iterator[PatroniCluster]:
    """One cluster for the whole test module (loopback only)."""
    with patroni_cluster() as cluster:
        yield cluster


@pytest.fixture
def ha_cluster(ha_cluster_shared: PatroniCluster) -> PatroniCluster:
    """The module's cluster, whole again: three members, a leader, two streaming replicas,
    nothing paused or delayed, asynchronous replication."""
    ha_cluster_shared.reset()
    return ha_cluster_shared


@pytest.fixture(scope="module")
def ha_netns() -> Iterator[NetNamespace]:
    """A network namespace joined to the root namespace by a veth pair."""
    with NetNamespace() as ns:
        yield ns


@pytest.fixture(scope="module")
def ha_netns_cluster_shared(ha_netns: NetNamespace) -> Iterator[PatroniCluster]:
    """A cluster whose members also listen on the namespace's host-side address and trust
    its /30, so a server inside the namespace reaches them there (cluster.url(host=...))."""
    with patroni_cluster(listen=[ha_netns.host_address], allow=[ha_netns.network]) as cluster:
        yield cluster


@pytest.fixture
def ha_netns_cluster(ha_netns_cluster_shared: PatroniCluster, ha_netns: NetNamespace
                     ) -> tuple[PatroniCluster, NetNamespace]:
    """(cluster, namespace), the cluster whole again and no partition in place."""
    ha_netns.heal()
    ha_netns_cluster_shared.reset()
    return ha_netns_cluster_shared, ha_netns
