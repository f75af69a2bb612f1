"""SQLite's processes on one machine: a replica is alive exactly while its
process holds its name, and wake-ups reach the other replicas whole, while
anything else sent to a name is ignored."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from fencepost.store import local_peers
from fencepost.store.base import Freed, lock_freed, pool_freed
from fencepost.store.local_peers import LocalPeers, decode, encode

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="abstract names are Linux's")

# A process that holds a replica's name until it is killed.
HOLDER = """
import socket, sys, time
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(b"\\0fencepost-replica/" + sys.argv[1].encode())
print("bound", flush=True)
time.sleep(60)
"""


def test_a_replica_is_alive_while_its_process_holds_the_name() -> None:
    replica = "feedc0de00000001"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, replica], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"bound\n"
        assert local_peers._is_alive(replica)
        assert local_peers._is_alive(replica)  # asking does not take the name
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert not local_peers._is_alive(replica)
    finally:
        holder.kill()
        holder.wait(10)


def test_events_cross_in_datagrams_whole() -> None:
    events = [lock_freed("p", f"key-{i}") for i in range(150)] + [pool_freed("p", "api")]
    datagrams = encode(events)
    assert len(datagrams) == 3  # 64 events per datagram
    assert [e for d in datagrams for e in decode(d)] == events


@pytest.mark.parametrize("datagram", [
    b"", b"not json", b"{}", b"[1, 2]", b"[[1, 2]]", b'"text"', b"\xff\xfe", b"null",
    json.dumps([["lock", "p"]]).encode(),
])
def test_anything_else_sent_to_a_name_is_no_event(datagram: bytes) -> None:
    assert decode(datagram) == []


async def test_a_peer_hears_wake_ups_and_not_garbage() -> None:
    loop = asyncio.get_running_loop()
    heard: list[Freed] = []
    a, b = LocalPeers(), LocalPeers()
    a.bind(loop, heard.extend)
    b.bind(loop, lambda events: None)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stranger:
            stranger.sendto(b"garbage", local_peers._address(a.replica))
        b.send([a.replica, "0000000000000000"], [lock_freed("p", "k")])  # one peer is gone
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.01)
        assert heard == [lock_freed("p", "k")]
    finally:
        a.unbind()
        b.unbind()
    assert not local_peers._is_alive(a.replica)


SENDER = """
import json, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    sock.sendto(json.dumps([["lock", "p", sys.argv[2], False]]).encode(),
                b"\\0fencepost-replica/" + sys.argv[1].encode())
"""


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="sending as another user needs root")
async def test_wake_ups_from_another_user_are_ignored() -> None:
    """An abstract name has no permissions: any local user can send to it."""
    loop = asyncio.get_running_loop()
    heard: list[Freed] = []
    peers = LocalPeers()
    peers.bind(loop, heard.extend)
    try:
        for key, uid in (("from-nobody", 65534), ("from-us", os.getuid())):
            # The system's Python: the user may not reach the venv's. Only the
            # standard library is needed.
            subprocess.run(["/usr/bin/python3", "-c", SENDER, peers.replica, key], check=True,
                           user=uid, cwd="/", timeout=30)
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert heard == [lock_freed("p", "from-us")]
    finally:
        peers.unbind()
