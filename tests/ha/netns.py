"""A network namespace for one `fencepost serve` that a test can cut off from the database
with a partition that drops packets (no RST, no ICMP: the server's connections just stop
getting answers), as a real network partition does (SPEC §6 "Nothing hangs on the store").

The namespace is joined to the root namespace by a veth pair in a private /30 of
10.213.0.0/16 picked for it (`host_address` on the root side, `ns_address` inside). It has no
other route: its traffic goes only to the root namespace's end of the pair. PostgreSQL must
listen on `host_address` (PatroniCluster(listen=[ns.host_address], allow=[ns.network])), the
server inside reaches it there, and the test reaches the server at `ns_address`.

`partition()` adds nftables rules inside the namespace (never in the root namespace, whose
firewall this leaves alone) that drop the packets between it and the given database ports;
`heal()` removes them. `close()` deletes the namespace, which deletes both ends of the veth.
Namespaces are named fencepost-ha-<pid>-<hex>; one left behind by a test process that was
killed is deleted by the next `create()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import ServerProcess, missing, track

PREFIX = "fencepost-ha-"
TABLE = "fencepost_partition"
_LOCK = Path("/tmp/fencepost-netns.lock")


def _tool(name: str) -> str | None:
    """A program's path, looked for in /usr/sbin and /sbin too (often not on a PATH)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([_tool("ip") or "ip", *args], capture_output=True, text=True,
                          timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _sweep_stale() -> None:
    """Delete namespaces of ours whose test process is gone."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ", 1)[0]
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if not Path(f"/proc/{pid}").exists():
            _ip("netns", "del", name, check=False)


class NetNamespace:
    """A network namespace with a veth pair to the root namespace. Use as a context manager,
    or `create()` ... `close()`."""

    def __init__(self) -> None:
        if os.geteuid() != 0 or _tool("ip") is None:
            missing("root and iproute2 (ip) for network namespaces")
        nft = _tool("nft")
        if nft is None:
            missing("nft (apt-get install nftables) for network partitions")
        self.nft = nft
        token = os.urandom(3).hex()
        self.name = f"{PREFIX}{os.getpid()}-{token}"
        self.host_if = f"fp{token}h"
        self.ns_if = f"fp{token}n"
        self.host_address = ""
        self.ns_address = ""
        self.network = ""  # e.g. 10.213.7.4/30
        self.partitioned: list[int] = []
        self._created = False

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program inside the namespace (`ip netns exec`
        execs the program in place: no process stands between the caller and it)."""
        return [_tool("ip") or "ip", "netns", "exec", self.name]

    def create(self) -> NetNamespace:
        """Make the namespace and the veth pair, with addresses in a free /30."""
        with open(_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes never pick the same /30
            _sweep_stale()
            done = _ip("netns", "add", self.name, check=False)
            if done.returncode != 0:
                missing(f"network namespaces (ip netns add: {done.stderr.strip()})")
            self._created = True
            try:
                used = _ip("-4", "-o", "addr", "show").stdout
                free = [(a, b) for a in range(256) for b in range(0, 256, 4)
                        if f" 10.213.{a}.{b + 1}/" not in used]
                a, b = random.choice(free)
                self.host_address, self.ns_address = f"10.213.{a}.{b + 1}", f"10.213.{a}.{b + 2}"
                self.network = f"10.213.{a}.{b}/30"
                _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
                _ip("link", "set", self.ns_if, "netns", self.name)
                _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_if)
                _ip("link", "set", self.host_if, "up")
                _ip("-n", self.name, "addr", "add", f"{self.ns_address}/30", "dev", self.ns_if)
                _ip("-n", self.name, "link", "set", self.ns_if, "up")
                _ip("-n", self.name, "link", "set", "lo", "up")
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        """Delete the namespace (and with it both ends of the veth pair)."""
        if self._created:
            _ip("netns", "del", self.name, check=False)
            _ip("link", "del", self.host_if, check=False)  # normally gone with the namespace
            self._created = False

    def __enter__(self) -> NetNamespace:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- running things inside -----------------------------------------------------------------

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace to its end."""
        return subprocess.run([*self.prefix, *argv], capture_output=True, text=True,
                              timeout=timeout)

    def spawn(self, argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
        """Start a command inside the namespace, in a process group of its own, SIGTERMed if
        the test process dies, and tracked by the suite's leak check. The caller stops it."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            [*self.prefix, *argv], preexec_fn=_die_with_parent, start_new_session=True, **popen)
        track(proc, own_group=True)
        return proc

    def server(self, workdir: Path, store: str, **fields: Any) -> NamespacedServer:
        """A `fencepost serve` (support.ServerProcess, not started) that runs inside the
        namespace, listens on `ns_address` and uses `store` (a URL with `host_address`)."""
        return NamespacedServer(workdir, store=store, netns=self, **fields)

    def can_connect(self, host: str, port: int, timeout: float = 2.0) -> bool:
        """Whether a TCP connection from inside the namespace to host:port opens."""
        probe = ("import socket,sys\n"
                 "try:\n"
                 f"    socket.create_connection(({host!r}, {port}), timeout={timeout}).close()\n"
                 "except OSError:\n"
                 "    sys.exit(1)\n")
        return self.run([sys.executable, "-c", probe], timeout=timeout + 10).returncode == 0

    # --- partitions ----------------------------------------------------------------------------

    def partition(self, ports: Iterable[int], drop: bool = True) -> None:
        """Cut the namespace off from `ports` on `host_address` (the database), both ways:
        packets to those ports and from them are dropped silently (`drop=True`: a client sees
        nothing, until its own timeouts), or refused with a TCP reset (`drop=False`). Existing
        connections are cut as well as new ones. Other traffic (the test's requests to the
        server inside) goes on."""
        if self.partitioned:
            self.heal()
        ports = sorted(set(ports))
        assert ports, "no ports to cut off"
        wanted = ", ".join(map(str, ports))
        verdict = "drop" if drop else "reject with tcp reset"
        # With `drop=False` nothing is dropped coming in: the reset the reject makes comes in
        # from the database's address and port, and must reach the local socket.
        incoming = (f"    ip saddr {self.host_address} tcp sport {{ {wanted} }} drop\n"
                    if drop else "")
        rules = (
            f"table inet {TABLE} {{\n"
            "  chain out {\n"
            "    type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {self.host_address} tcp dport {{ {wanted} }} {verdict}\n"
            "  }\n"
            "  chain in {\n"
            "    type filter hook input priority 0; policy accept;\n"
            f"{incoming}"
            "  }\n"
            "}\n"
        )
        done = subprocess.run([*self.prefix, self.nft, "-f", "-"], input=rules,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"nft: {done.stderr}"
        self.partitioned = ports

    def heal(self) -> None:
        """Remove the partition; connections that were cut resume (TCP retransmits)."""
        if self.partitioned:
            done = self.run([self.nft, "delete", "table", "inet", TABLE])
            assert done.returncode == 0, f"nft: {done.stderr}"
            self.partitioned = []

    @contextlib.contextmanager
    def partitioned_from(self, ports: Iterable[int], drop: bool = True) -> Iterator[None]:
        """`partition` for the duration of a with block, healed however it ends."""
        self.partition(ports, drop)
        try:
            yield
        finally:
            self.heal()


@dataclass
class NamespacedServer(ServerProcess):
    """A support.ServerProcess run inside a NetNamespace, listening on its `ns_address`."""

    netns: NetNamespace | None = None

    def __post_init__(self) -> None:
        assert self.netns is not None
        self.command_prefix = [*self.netns.prefix, *self.command_prefix]
        # A later --host wins over the 127.0.0.1 ServerProcess passes first.
        self.extra_args = [*self.extra_args, "--host", self.netns.ns_address]

    @property
    def base_url(self) -> str:
        assert self.netns is not None
        return f"http://{self.netns.ns_address}:{self.port}"
