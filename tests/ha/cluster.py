"""A real highly available PostgreSQL for the tests of SPEC §6 "Highly available PostgreSQL"
and §7.9-7.10: one etcd (Debian's etcd-server, v3 API) and three Patroni members (Debian's
`patroni`, PostgreSQL 15), each with its own REST API port, PostgreSQL port and data folder,
all on free loopback ports under one temporary folder, run as the `postgres` OS user.

Timing: `ttl` 10 s, `loop_wait` 1 s, `retry_timeout` 3 s (Patroni wants
loop_wait + 2 * retry_timeout <= ttl). A leader that dies keeps the leader key until its etcd
lease runs out, so a failover after `kill_leader` takes about `ttl` seconds (measured 9.5-10.6
s on an idle machine; 12.5 s after `pause` of the leader).

`maximum_lag_on_failover` is 1 GiB, so that a standby that is behind may still be promoted
(the point of `delay_replication`), and `use_pg_rewind` with data checksums lets a member that
was killed, or that went further than the new leader, come back as a replica.

Members are named m1, m2, m3. Nothing here touches the machine's own PostgreSQL or Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from support import free_port, missing, track

# The newest PostgreSQL server Debian installed (15 on bookworm, the version Patroni 3.0.2
# knows); every member runs it.
_SERVERS = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                  key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
PG_BIN = _SERVERS[-1].parent if _SERVERS else Path("/usr/lib/postgresql/15/bin")
NAMES = ("m1", "m2", "m3")


@dataclass(frozen=True)
class Member:
    """One member as Patroni's GET /cluster reports it."""

    name: str
    role: str  # "leader", "replica" or "sync_standby"
    state: str  # "running", "starting", "stopped", "crashed", ...
    pg_port: int
    api_port: int
    timeline: int | None = None
    lag: int | str | None = None  # bytes behind the leader's last reported position


def _die_with_parent() -> None:
    """SIGTERM the process when the test process dies (set after the change of user, so it
    stays set): Patroni then stops its PostgreSQL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when there is none (a zombie counts as dead)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    return _proc_stat(pid) is not None


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None and stat[1] == pid:
                found.append(int(entry))
    return found


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_dead(pids: Iterable[int], timeout: float) -> list[int]:
    """The pids still alive after waiting up to `timeout` seconds for all to end."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if _alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


@dataclass
class _Node:
    name: str
    folder: Path
    pg_port: int
    api_port: int
    tags: dict[str, bool] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    paused: list[int] = field(default_factory=list)  # pids this helper has SIGSTOPped

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def config_path(self) -> Path:
        return self.folder / "patroni.yml"

    @property
    def log_path(self) -> Path:
        return self.folder / "patroni.log"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster(self) -> int | None:
        """The pid of this member's running postmaster (postmaster.pid, checked in /proc)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return None
        return pid if str(self.data).encode() in cmdline and _alive(pid) else None

    def postgres_pids(self) -> list[int]:
        """The postmaster and all its children (backends, walsenders, walreceiver, ...)."""
        master = self.postmaster()
        return [] if master is None else [master, *_children(master)]

    def patroni_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class PatroniCluster:
    """etcd plus three Patroni members under `root` (a folder the `postgres` user can enter).

    `listen` are extra addresses (besides 127.0.0.1) every PostgreSQL listens on, and
    `allow` extra networks pg_hba trusts: the host side of a network namespace
    (tests/ha/netns.py), whose address must exist before `start`."""

    def __init__(self, root: Path, listen: Iterable[str] = (), allow: Iterable[str] = (),
                 ttl: int = 10, loop_wait: int = 1, retry_timeout: int = 3) -> None:
        for tool in ("patroni", "etcd"):
            if shutil.which(tool) is None:
                missing(f"{tool} (apt-get install patroni etcd-server)")
        if not (PG_BIN / "postgres").exists():
            missing("PostgreSQL server binaries in /usr/lib/postgresql/*/bin (postgresql-15)")
        if os.geteuid() != 0:
            missing("root (to run Patroni and PostgreSQL as the postgres user)")
        assert loop_wait + 2 * retry_timeout <= ttl, "Patroni: loop_wait + 2*retry_timeout <= ttl"
        self.root = root
        self.listen = ["127.0.0.1", *listen]
        self.allow = list(allow)
        self.ttl, self.loop_wait, self.retry_timeout = ttl, loop_wait, retry_timeout
        self.scope = f"fp-{os.getpid()}-{os.urandom(3).hex()}"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = {name: _Node(name, root / name, free_port(), free_port()) for name in NAMES}
        self._delayed: dict[str, tuple[str, int]] = {}  # member -> (leader, walsender pid)

    # --- starting and stopping -----------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> PatroniCluster:
        """Start etcd, then the three members; return once there is a leader that accepts
        writes and two replicas stream from it. Stops everything if that does not happen."""
        try:
            self._start_etcd()
            for node in self.nodes.values():
                self._spawn(node)
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> None:
        folder = self.root / "etcd"
        folder.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self.etcd = subprocess.Popen(
            ["etcd", "--name", "e1", "--data-dir", str(folder / "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"e1={peer}", "--initial-cluster-state", "new",
             "--initial-cluster-token", self.scope],
            stdout=subprocess.DEVNULL, stderr=open(folder / "etcd.log", "ab"),
            preexec_fn=_die_with_parent, start_new_session=True,
        )
        track(self.etcd, own_group=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.etcd.poll() is None, (folder / "etcd.log").read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{client}/health", timeout=1).json().get("health") == "true":
                    return
            time.sleep(0.1)
        raise AssertionError("etcd did not become healthy: "
                             + (folder / "etcd.log").read_text()[-3000:])

    def _config(self, node: _Node) -> dict[str, Any]:
        hba = ["local all all trust", "host all all 127.0.0.1/32 trust",
               "host replication all 127.0.0.1/32 trust"]
        for network in self.allow:
            hba += [f"host all all {network} trust", f"host replication all {network} trust"]
        return {
            "scope": self.scope,
            "namespace": "/fencepost-ha/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}",
                        "connect_address": f"127.0.0.1:{node.api_port}"},
            "etcd3": {"host": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl, "loop_wait": self.loop_wait,
                    "retry_timeout": self.retry_timeout,
                    "maximum_lag_on_failover": 1 << 30,
                    "synchronous_mode": False,
                    "postgresql": {
                        "use_pg_rewind": True, "use_slots": True,
                        "parameters": {"wal_level": "replica", "hot_standby": "on",
                                       "wal_log_hints": "on", "max_wal_senders": 10,
                                       "max_replication_slots": 10, "wal_keep_size": "256MB",
                                       "max_connections": 100},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "data-checksums"],
            },
            "postgresql": {
                "listen": f"{','.join(self.listen)}:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(PG_BIN),
                "pgpass": str(node.folder / "pgpass"),
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "parameters": {"unix_socket_directories": str(node.folder),
                               "logging_collector": "on",
                               "log_directory": str(node.folder / "pglog"),
                               "log_filename": "postgresql.log"},
                "pg_hba": hba,
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
                "basebackup": [{"checkpoint": "fast"}],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False,
                     "nosync": False, **node.tags},
        }

    def _write_config(self, node: _Node) -> None:
        # JSON is YAML: no YAML library needed on this side.
        node.config_path.write_text(json.dumps(self._config(node), indent=1))
        shutil.chown(node.config_path, "postgres")

    def _spawn(self, node: _Node) -> None:
        node.folder.mkdir(parents=True, exist_ok=True)
        node.folder.chmod(0o700)
        shutil.chown(node.folder, "postgres", "postgres")
        self._write_config(node)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(node.folder),
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        node.proc = subprocess.Popen(
            ["patroni", str(node.config_path)], cwd=node.folder, env=env,
            stdout=subprocess.DEVNULL, stderr=open(node.log_path, "ab"),
            user="postgres", group="postgres", extra_groups=[],
            preexec_fn=_die_with_parent, start_new_session=True,
        )
        track(node.proc, own_group=True)
        node.paused.clear()

    def _resume_everything(self) -> None:
        """SIGCONT whatever a test paused or delayed: a stopped process neither stops
        nor streams."""
        for node in self.nodes.values():
            if node.paused:
                self.resume(node.name)
        for name in list(self._delayed):
            self.resume_replication(name)

    def stop(self) -> None:
        """Stop every member (Patroni stops its PostgreSQL), then etcd; whatever does not stop
        in time is killed. Safe to call more than once and after a failed start."""
        self._resume_everything()
        for node in self.nodes.values():
            if node.patroni_alive():
                assert node.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._kill_node(node)
            if node.postmaster() is not None:  # Patroni died before stopping it
                self._kill_node(node)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if node.proc is not None:
                    os.killpg(node.proc.pid, signal.SIGKILL)  # anything Patroni left in its group
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(timeout=10)

    def __enter__(self) -> PatroniCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what the cluster says -----------------------------------------------------------------

    @property
    def pg_ports(self) -> list[int]:
        return [node.pg_port for node in self.nodes.values()]

    def url(self, host: str = "127.0.0.1", database: str = "postgres",
            first: str | None = None) -> str:
        """postgresql://postgres@H:P1,H:P2,H:P3/db?target_session_attrs=read-write, member
        `first` (if given) named first: libpq tries the hosts in order."""
        ports = self.pg_ports
        if first is not None:
            ports = [self.nodes[first].pg_port, *(p for p in ports
                                                   if p != self.nodes[first].pg_port)]
        hosts = ",".join(f"{host}:{port}" for port in ports)
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def url_params(self, host: str = "127.0.0.1", database: str = "postgres") -> str:
        """postgresql://postgres@/db?host=H,H,H&port=P1,P2,P3&target_session_attrs=read-write"""
        hosts = ",".join(host for _ in self.pg_ports)
        ports = ",".join(str(port) for port in self.pg_ports)
        return (f"postgresql://postgres@/{database}?host={hosts}&port={ports}"
                "&target_session_attrs=read-write")

    def member_url(self, name: str, host: str = "127.0.0.1", database: str = "postgres") -> str:
        """A single-host URL of one member (whatever its role)."""
        return f"postgresql://postgres@{host}:{self.nodes[name].pg_port}/{database}"

    def _api_order(self) -> list[_Node]:
        """Members to ask, those that can answer first."""
        return sorted(self.nodes.values(),
                      key=lambda n: (not n.patroni_alive(), bool(n.paused)))

    def cluster_state(self) -> dict[str, Any] | None:
        """GET /cluster from the first member that answers (the DCS's view), None if none."""
        for node in self._api_order():
            if not node.patroni_alive() or node.paused:
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = httpx.get(f"{node.api}/cluster", timeout=2)
                if resp.status_code == 200:
                    return dict(resp.json())
        return None

    def members(self) -> list[Member]:
        """Every member the DCS lists (a dead member stays listed until its key expires)."""
        state = self.cluster_state() or {"members": []}
        found = []
        for m in state["members"]:
            node = self.nodes[m["name"]]
            found.append(Member(m["name"], m["role"], m.get("state", ""), node.pg_port,
                                node.api_port, m.get("timeline"), m.get("lag")))
        return found

    def leader(self) -> Member | None:
        """The member holding the leader key (from GET /cluster), None when there is none."""
        return next((m for m in self.members() if m.role == "leader"), None)

    def is_primary(self, name: str) -> bool:
        """Whether that member's PostgreSQL answers and is out of recovery (takes writes)."""
        with contextlib.suppress(psycopg.Error, OSError):
            return not self.query(name, "SELECT pg_is_in_recovery()")[0][0]
        return False

    def wait_leader(self, exclude: Iterable[str] = (), timeout: float = 60.0) -> Member:
        """The leader once there is one not in `exclude` whose PostgreSQL takes writes; fails
        after `timeout` seconds."""
        excluded = set(exclude)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lead = self.leader()
            if lead is not None and lead.name not in excluded and self.is_primary(lead.name):
                return lead
            time.sleep(0.1)
        raise AssertionError(f"no leader outside {sorted(excluded)} within {timeout} s: "
                             f"{self.cluster_state()}")

    def query(self, name: str, sql: str, *params: Any, timeout: float = 3.0
              ) -> list[tuple[Any, ...]]:
        """Run one statement on one member as postgres (autocommit); its rows."""
        with psycopg.connect(host="127.0.0.1", port=self.nodes[name].pg_port, user="postgres",
                             dbname="postgres", autocommit=True,
                             connect_timeout=max(1, int(timeout))) as conn:
            cur = conn.execute(sql, params or None)
            return list(cur.fetchall()) if cur.description else []

    def replication(self) -> dict[str, tuple[str, str]]:
        """On the current leader: member name -> (state, sync_state) of its walsenders."""
        lead = self.leader()
        if lead is None:
            return {}
        with contextlib.suppress(psycopg.Error, OSError):
            rows = self.query(lead.name, "SELECT application_name, state, sync_state"
                                         " FROM pg_stat_replication")
            return {r[0]: (r[1], r[2]) for r in rows}
        return {}

    def streaming_replicas(self) -> list[str]:
        """The members that are replicas streaming WAL from the leader right now: in the
        leader's pg_stat_replication as `streaming`, with their own walreceiver streaming and
        Patroni reporting them `running` (while Patroni clones a member, pg_basebackup's
        walsender shows as `streaming` under that member's name too)."""
        return sorted(self._receivers())

    def _receivers(self) -> dict[str, int]:
        """streaming_replicas, each with the pid of its walreceiver."""
        lead = self.leader()
        if lead is None:
            return {}
        states = {m.name: m.state for m in self.members()}
        try:
            [(walfile,)] = self.query(lead.name, "SELECT pg_walfile_name(pg_current_wal_lsn())")
        except (psycopg.Error, OSError):
            return {}
        timeline = int(walfile[:8], 16)  # the leader's current timeline
        found = {}
        for name, (state, _) in self.replication().items():
            if state != "streaming" or states.get(name) != "running":
                continue
            with contextlib.suppress(psycopg.Error, OSError):
                rows = self.query(name, "SELECT pid, status, received_tli"
                                        " FROM pg_stat_wal_receiver")
                if rows and rows[0][1:] == ("streaming", timeline):
                    found[name] = int(rows[0][0])
        return found

    def wait_healthy(self, timeout: float = 90.0) -> Member:
        """Wait until a leader takes writes and every live member streams from it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                assert node.proc is None or node.proc.poll() is None or node.postmaster(), (
                    f"patroni {node.name} exited: {node.log_path.read_text()[-3000:]}")
            lead = self.leader()
            if lead is not None and self.is_primary(lead.name):
                expected = sorted(n for n, node in self.nodes.items()
                                  if n != lead.name and node.patroni_alive())
                if self.streaming_replicas() == expected:
                    return lead
            time.sleep(0.2)
        raise AssertionError(f"cluster not healthy within {timeout} s: {self.cluster_state()} "
                             f"streaming: {self.replication()}")

    # --- failures ------------------------------------------------------------------------------

    def _kill_node(self, node: _Node) -> None:
        """SIGKILL Patroni (its whole process group) and the postmaster with every child,
        at once, as a machine that loses power."""
        pids = node.postgres_pids()
        if node.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, signal.SIGKILL)
        _signal(pids, signal.SIGKILL)
        if node.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)
        left = _wait_dead(pids, 10)
        assert not left, f"{node.name}: processes {left} survived SIGKILL"
        node.paused.clear()

    def kill_member(self, name: str) -> None:
        """kill -9 of that member's Patroni and PostgreSQL (postmaster and children)."""
        self._kill_node(self.nodes[name])
        for delayed, (leader, _) in list(self._delayed.items()):
            if name in (delayed, leader):
                del self._delayed[delayed]

    def kill_leader(self) -> str:
        """kill -9 the current leader's Patroni and PostgreSQL; returns its name."""
        lead = self.leader()
        assert lead is not None, f"no leader to kill: {self.cluster_state()}"
        self.kill_member(lead.name)
        return lead.name

    def restart_member(self, name: str, timeout: float = 90.0) -> None:
        """Start a killed (or stopped) member's Patroni again, and wait until it streams from
        the leader as a replica (Patroni rewinds it, or clones it again, when it went further
        than the new leader)."""
        node = self.nodes[name]
        assert not node.patroni_alive(), f"{name} is running"
        assert node.postmaster() is None, f"{name}'s PostgreSQL is still running"
        self._spawn(node)
        deadline = time.monotonic() + timeout
        since: tuple[int, float] | None = None  # (walreceiver pid, first seen streaming)
        while time.monotonic() < deadline:
            assert node.proc is not None and node.proc.poll() is None, (
                f"patroni {name} exited: {node.log_path.read_text()[-3000:]}")
            pid = self._receivers().get(name)
            if pid is None:
                since = None
            elif since is None or since[0] != pid:
                since = (pid, time.monotonic())
            elif time.monotonic() - since[1] >= 2:
                # Streaming for 2 s with the same walreceiver: not a start that Patroni is
                # about to stop for a pg_rewind.
                return
            time.sleep(0.2)
        raise AssertionError(f"{name} did not come back as a streaming replica within "
                             f"{timeout} s: {self.cluster_state()} {self.replication()}")

    def pause(self, name: str, patroni: bool = True) -> None:
        """SIGSTOP that member's PostgreSQL (the postmaster and all its children) and, by
        default, its Patroni too: a machine that freezes (VM paused, long stall) freezes both.
        Its connections stay open and unanswered: a client waits, it gets no error. A paused
        leader keeps its key for `ttl` seconds; paused longer, another member is promoted
        and, on `resume`, the old leader's Patroni finds it lost the key and demotes it.
        With `patroni=False` only PostgreSQL stops: Patroni's own queries then hang too, so
        the leader key also lapses after `ttl` seconds."""
        node = self.nodes[name]
        assert not node.paused, f"{name} is already paused"
        pids: list[int] = []
        if patroni and node.patroni_alive():
            assert node.proc is not None
            pids.append(node.proc.pid)
            pids += _children(node.proc.pid)  # pg_rewind, pg_basebackup, ... if any
        _signal(pids, signal.SIGSTOP)
        master = node.postmaster()
        assert master is not None, f"{name} has no running PostgreSQL"
        # The postmaster first, so that it starts no child we would miss, then its children.
        _signal([master], signal.SIGSTOP)
        kids = _children(master)
        _signal(kids, signal.SIGSTOP)
        node.paused = [*pids, master, *kids]

    def resume(self, name: str) -> None:
        """SIGCONT what `pause` stopped (PostgreSQL first, then Patroni)."""
        node = self.nodes[name]
        _signal(reversed(node.paused), signal.SIGCONT)
        node.paused = []

    # --- replication ---------------------------------------------------------------------------

    def set_synchronous(self, on: bool, timeout: float = 30.0) -> str | None:
        """Turn Patroni's `synchronous_mode` on or off (PATCH /config) and wait until the
        leader reports a synchronous standby (on) or none (off). Returns the sync standby."""
        body = {"synchronous_mode": on}
        for node in self._api_order():
            with contextlib.suppress(httpx.HTTPError):
                resp = httpx.patch(f"{node.api}/config", json=body, timeout=5)
                if resp.status_code == 200:
                    break
        else:
            raise AssertionError("no member took PATCH /config")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sync = [n for n, (state, mode) in self.replication().items()
                    if mode == "sync" and state == "streaming"]
            roles = {m.name: m.role for m in self.members()}
            if on and sync and roles.get(sync[0]) == "sync_standby":
                return sync[0]
            if not on and not sync and "sync_standby" not in roles.values():
                return None
            time.sleep(0.1)
        raise AssertionError(f"synchronous_mode={on} not in effect within {timeout} s: "
                             f"{self.replication()} {self.cluster_state()}")

    def sync_standby(self) -> str | None:
        """The member the leader waits for on commit, if any."""
        return next((n for n, (_, mode) in self.replication().items() if mode == "sync"), None)

    def allow_failover(self, name: str, allowed: bool, timeout: float = 15.0) -> None:
        """Set that member's `nofailover` tag (config file + POST /reload): a member not allowed
        is never promoted, nor does the election wait for it. With the other replica not
        allowed, `kill_leader` promotes the one left, however far behind it is."""
        node = self.nodes[name]
        node.tags["nofailover"] = not allowed
        self._write_config(node)
        resp = httpx.post(f"{node.api}/reload", timeout=5)
        assert resp.status_code == 202, resp.text
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                tags = httpx.get(f"{node.api}/patroni", timeout=2).json().get("tags", {})
                members = {m["name"]: m for m in (self.cluster_state() or {}).get("members", [])}
                seen = members.get(name, {}).get("tags", {})
                if bool(tags.get("nofailover")) != allowed and \
                        bool(seen.get("nofailover")) != allowed:
                    return
            time.sleep(0.1)
        raise AssertionError(f"{name}: nofailover={not allowed} not in effect within {timeout} s")

    def delay_replication(self, name: str) -> None:
        """Make replica `name` fall behind: SIGSTOP the walsender that feeds it on the leader.

        How the lag is made, and why it is real: the leader's walsender for that member (its
        row in pg_stat_replication, found by application_name) stops, so new WAL never leaves
        the leader; the standby has on disk only what it received before. Commits on the
        leader go on (asynchronous replication: nobody waits for that standby). If the leader
        is then killed (`kill_leader`, which also kills the stopped walsender) and this member
        promoted, the changes made meanwhile are not in the new primary: a standby that was
        behind got promoted, as in a real asynchronous failover.

        Pausing replay (`pg_wal_replay_pause()`) or `recovery_min_apply_delay` would not do:
        the WAL still arrives, and a promotion replays everything received before it opens
        for writes, so nothing would be lost. Stopping the standby's walreceiver instead would
        leave WAL in its socket buffer, and a promotion would wait for that stopped process.

        The standby's `wal_receiver_timeout` (60 s) ends a stalled connection and reconnects:
        keep the delay shorter than that. With synchronous_mode and this member the sync
        standby, commits wait: use it with asynchronous replication."""
        lead = self.leader()
        assert lead is not None and lead.name != name, f"{name} is not a replica"
        rows = self.query(lead.name, "SELECT pid FROM pg_stat_replication"
                                     " WHERE application_name = %s AND state = 'streaming'", name)
        assert rows, f"{lead.name} streams nothing to {name}: {self.replication()}"
        pid = int(rows[0][0])
        os.kill(pid, signal.SIGSTOP)
        self._delayed[name] = (lead.name, pid)

    def resume_replication(self, name: str) -> None:
        """SIGCONT the walsender `delay_replication` stopped (if its leader still lives)."""
        entry = self._delayed.pop(name, None)
        if entry is not None:
            _signal([entry[1]], signal.SIGCONT)

    def lag_bytes(self, name: str) -> int:
        """How many bytes of WAL the leader has written that member `name` has not received."""
        lead = self.leader()
        assert lead is not None
        [(received,)] = self.query(name, "SELECT pg_last_wal_receive_lsn()")
        [(lag,)] = self.query(lead.name, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                              str(received))
        return int(lag)

    # --- between tests -------------------------------------------------------------------------

    def reset(self, timeout: float = 120.0) -> Member:
        """Bring the cluster back to three members after what a test did: resume what is
        paused or delayed, allow every member to fail over, restart killed members, turn
        synchronous mode off. Returns the leader."""
        self._resume_everything()
        for node in self.nodes.values():
            if not node.patroni_alive():
                if node.postmaster() is not None:
                    self._kill_node(node)
                node.tags.pop("nofailover", None)
                self._spawn(node)
        self.wait_leader(timeout=timeout)
        for node in self.nodes.values():
            if node.tags.get("nofailover"):
                self.allow_failover(node.name, True)
        if (self.cluster_state() or {}).get("members") and self._sync_mode():
            self.set_synchronous(False)
        return self.wait_healthy(timeout)

    def _sync_mode(self) -> bool:
        for node in self._api_order():
            with contextlib.suppress(httpx.HTTPError, ValueError):
                return bool(httpx.get(f"{node.api}/config", timeout=2).json()
                            .get("synchronous_mode"))
        return False

    def logs(self, name: str, chars: int = 4000) -> str:
        """The tail of a member's Patroni log and PostgreSQL log, for failure messages."""
        node = self.nodes[name]
        pg_log = node.folder / "pglog" / "postgresql.log"
        parts = [node.log_path.read_text()[-chars:] if node.log_path.exists() else ""]
        with contextlib.suppress(OSError):
            parts.append(pg_log.read_text()[-chars:])
        return "\n".join(parts)


@contextlib.contextmanager
def patroni_cluster(listen: Iterable[str] = (), allow: Iterable[str] = (),
                    **timing: int) -> Iterator[PatroniCluster]:
    """A started PatroniCluster in a temporary folder (not pytest's tmp_path: that is private
    to root, and the members run as postgres), stopped and removed on leaving. A start that
    fails is tried again, up to START_ATTEMPTS times, in a new folder on new ports: the
    ports are chosen free, and another test process may take one before a member binds it."""
    for attempt in range(1, START_ATTEMPTS + 1):
        root = Path(tempfile.mkdtemp(prefix="fencepost-ha-"))
        root.chmod(0o755)
        cluster = PatroniCluster(root, listen=listen, allow=allow, **timing)
        try:
            cluster.start()
        except AssertionError:
            shutil.rmtree(root, ignore_errors=True)
            if attempt == START_ATTEMPTS:
                raise
            continue
        break
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


START_ATTEMPTS = 3
