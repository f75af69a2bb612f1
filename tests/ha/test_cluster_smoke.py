"""The Patroni cluster the HA tests stand on (cluster.py) does what they rely on: it starts
with a leader and two streaming replicas, a leader killed with kill -9 is replaced within a
bound, and the killed member comes back as a replica. And the network namespace (netns.py):
a server inside reaches the cluster, and a partition drops the packets, then heals."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from cluster import PatroniCluster
from netns import NetNamespace

# Starting the cluster (3-5 s) counts towards the first test's timeout.
pytestmark = pytest.mark.timeout(240)

FAILOVER_BOUND_S = 25  # ttl 10 s + loop_wait + promotion, with room for a loaded machine


def test_starts_with_a_leader_and_two_streaming_replicas(ha_cluster: PatroniCluster) -> None:
    lead = ha_cluster.leader()
    assert lead is not None
    assert ha_cluster.is_primary(lead.name)
    others = sorted(set(ha_cluster.nodes) - {lead.name})
    assert ha_cluster.streaming_replicas() == others
    roles = {m.name: m.role for m in ha_cluster.members()}
    assert roles == {lead.name: "leader", **{n: "replica" for n in others}}
    for name in others:
        assert not ha_cluster.is_primary(name)
    # Both URL forms name every member.
    ports = ",".join(str(p) for p in ha_cluster.pg_ports)
    assert ha_cluster.url_params().endswith(
        f"?host=127.0.0.1,127.0.0.1,127.0.0.1&port={ports}&target_session_attrs=read-write")
    assert ha_cluster.url().count("127.0.0.1:") == 3


def test_kill_leader_fails_over_and_the_member_comes_back(ha_cluster: PatroniCluster) -> None:
    ha_cluster.query(ha_cluster.wait_leader().name,
                     "CREATE TABLE IF NOT EXISTS smoke (n int)")
    killed_at = time.monotonic()
    dead = ha_cluster.kill_leader()
    new = ha_cluster.wait_leader(exclude=[dead], timeout=60)
    took = time.monotonic() - killed_at
    print(f"\nfailover: {dead} killed, {new.name} leads after {took:.1f} s")
    assert took < FAILOVER_BOUND_S, f"failover took {took:.1f} s"
    ha_cluster.query(new.name, "INSERT INTO smoke VALUES (1)")  # it takes writes

    started = time.monotonic()
    ha_cluster.restart_member(dead)
    print(f"{dead} streams again after {time.monotonic() - started:.1f} s")
    roles = {m.name: m.role for m in ha_cluster.members()}
    assert roles[dead] == "replica" and roles[new.name] == "leader", roles
    assert not ha_cluster.is_primary(dead)
    assert sorted(ha_cluster.streaming_replicas()) == sorted(set(ha_cluster.nodes) - {new.name})


def test_a_server_in_a_namespace_reaches_the_cluster_and_a_partition_drops(
        ha_netns_cluster: tuple[PatroniCluster, NetNamespace], tmp_path: Path) -> None:
    cluster, ns = ha_netns_cluster
    lead = cluster.wait_leader()
    assert ns.can_connect(ns.host_address, lead.pg_port)
    # The namespace's loopback is its own: only the veth leads out, to the root namespace.
    assert not ns.can_connect("127.0.0.1", lead.pg_port, timeout=1)

    server = ns.server(tmp_path / "server", store=cluster.member_url(lead.name, ns.host_address))
    try:
        server.start()
        assert httpx.get(f"{server.base_url}/readyz", timeout=10).status_code == 200

        with ns.partitioned_from(cluster.pg_ports):
            started = time.monotonic()
            assert not ns.can_connect(ns.host_address, lead.pg_port, timeout=2)
            # Dropped, not refused: the attempt got no answer until its own timeout.
            assert time.monotonic() - started >= 1.8
            # The test still reaches the server inside.
            assert httpx.get(f"{server.base_url}/livez", timeout=10).status_code == 200
        assert ns.can_connect(ns.host_address, lead.pg_port)

        ns.partition(cluster.pg_ports, drop=False)
        started = time.monotonic()
        assert not ns.can_connect(ns.host_address, lead.pg_port, timeout=5)
        assert time.monotonic() - started < 4  # refused at once (TCP reset)
        ns.heal()
        assert ns.can_connect(ns.host_address, lead.pg_port)
    finally:
        ns.heal()
        server.stop()
