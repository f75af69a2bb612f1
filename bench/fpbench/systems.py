"""The systems under test, each started by the harness on loopback in a temp dir.

Every system is a context manager: `with system.running(workdir): ...` starts it
and always stops it (and drops what it created). A system that cannot run here
raises `Skipped` with the reason, which the report shows.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from fpbench import procs, tools
from fpbench.resp import Resp

ROOT = Path(__file__).resolve().parents[2]
BENCH_KEY = "fp_bench_bootstrap_admin_key_0123456789abcdef"
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


# Workloads (e) and (f) measure how fencepost's store carries parked waiters
# and held locks; the peers' recipes for either differ too much to compare.
FENCEPOST_ONLY = "measured for fencepost only (its own parked waiters and held locks)"


class Skipped(Exception):
    """This system cannot run on this machine; the message says why."""


def venv_python() -> str:
    candidate = ROOT / ".venv" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def http_json(method: str, url: str, body: object = None, headers: dict[str, str] | None = None,
              timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@dataclass
class System:
    """Base: a name, how it is loaded (HTTP via wrk, or Redis via redisload)."""

    name: str
    protocol: str = "http"  # "http" (wrk) or "redis" (redisload)
    version: str = ""
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    notes: list[str] = field(default_factory=list)
    install: bool = True  # may install a missing peer from Debian's packages (root only)

    def supports(self, workload: str) -> str | None:
        """None when this system runs the workload, else why not (shown as n/a)."""
        return None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU used so far by the system's server processes."""
        return procs.cpu_seconds(self.proc.pid) if self.proc else 0.0

    def loader_env(self, workload: str, connections: int, nonce: str) -> dict[str, str]:
        """Environment for the workload's script (and any set-up it needs first)."""
        return {}

    @contextlib.contextmanager
    def running(self, workdir: Path) -> Iterator[System]:
        raise NotImplementedError


@dataclass
class Fencepost(System):
    """`fencepost serve` on SQLite (a file in the temp dir) or on a fresh PostgreSQL database."""

    store: str = "sqlite"  # or "postgresql"
    workers: int = 1  # `serve --workers`
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL
    db_name: str = ""
    store_url: str = ""
    extra_args: list[str] = field(default_factory=list)  # more `fencepost serve` options
    command_prefix: list[str] = field(default_factory=list)  # e.g. taskset -c 0

    @contextlib.contextmanager
    def running(self, workdir: Path) -> Iterator[System]:
        python = venv_python()
        self.version = fencepost_version(python)
        if self.store == "postgresql":
            self._create_database()
        else:
            self.store_url = f"sqlite:///{workdir / 'fencepost.db'}"
        try:
            self.port = procs.free_port()
            self.proc = procs.start(
                [*self.command_prefix, python, "-m", "fencepost", "serve",
                 "--store", self.store_url,
                 "--host", "127.0.0.1", "--port", str(self.port),
                 "--access-log", str(workdir / "access.log"), "--workers", str(self.workers),
                 # Workload (e) parks 10,000 waiting connections.
                 "--max-connections", "12000", *self.extra_args],
                workdir / "server.log", env={"FENCEPOST_BOOTSTRAP_KEY": BENCH_KEY}, cwd=workdir)
            try:
                self._wait_healthy(workdir / "server.log")
                yield self
            finally:
                procs.stop(self.proc)
        finally:
            if self.store == "postgresql":
                self._drop_database()

    def _wait_healthy(self, log: Path) -> None:
        assert self.proc is not None
        try:
            procs.wait_port(self.port, self.proc, timeout=30)
            # With workers, one may listen before the others: "serving on" says all do.
            deadline = time.monotonic() + 30
            while b"serving on" not in log.read_bytes():
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"no 'serving on' line: {procs.tail(log)}")
                time.sleep(0.05)
            status, _ = http_json("GET", f"{self.base_url}/healthz")
        except (RuntimeError, OSError) as exc:
            raise RuntimeError(f"fencepost did not start: {exc}") from exc
        if status != 200:
            raise RuntimeError(f"fencepost /healthz answered {status}")

    def _admin(self) -> Any:
        import psycopg

        try:
            return psycopg.connect(self.pg_admin_url, autocommit=True, connect_timeout=3)
        except psycopg.OperationalError as exc:
            raise Skipped(f"PostgreSQL not reachable at {self.pg_admin_url}") from exc

    def _create_database(self) -> None:
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise Skipped("psycopg not installed (run from .venv)") from exc
        self.db_name = f"fencepost_bench_{uuid.uuid4().hex[:12]}"
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{self.db_name}"')
            row = admin.execute("SHOW server_version").fetchone()
            self.version += f", on PostgreSQL {row[0] if row else '?'}"
            # Without autovacuum the locks table's dead rows pile up while a
            # workload runs, and each later cell pays more for them.
            (autovacuum,) = admin.execute("SHOW autovacuum").fetchone() or ("?",)
            note = f"PostgreSQL autovacuum {autovacuum}"
            if note not in self.notes:
                self.notes.append(note)
        base = self.pg_admin_url.rsplit("/", 1)[0]
        self.store_url = f"{base}/{self.db_name}"

    def _drop_database(self) -> None:
        if self.db_name:
            with self._admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            self.db_name = ""

    def cpu_seconds(self) -> float:
        total = procs.tree_cpu_seconds(self.proc.pid) if self.proc else 0.0
        if self.store == "postgresql" and self.db_name:
            # The store's work happens in the PostgreSQL backends serving this database.
            with self._admin() as admin:
                pids = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                     (self.db_name,)).fetchall()
            total += sum(procs.cpu_seconds(pid) for (pid,) in pids)
        return total

    def loader_env(self, workload: str, connections: int, nonce: str) -> dict[str, str]:
        env = {"FENCEPOST_API_KEY": BENCH_KEY}
        if workload == "d":
            pool = f"bench-{nonce}"
            status, body = http_json(
                "PUT", f"{self.base_url}/v1/pools/{pool}",
                {"limit": connections, "queue_size": 0, "term_ms": 30000},
                {"Authorization": f"Bearer {BENCH_KEY}"})
            if status not in (200, 201):
                raise RuntimeError(f"could not create pool: {status} {body}")
            env["BENCH_POOL"] = pool
        return env


def fencepost_version(python: str) -> str:
    version = tools.output([python, "-c", "import fencepost; print(fencepost.__version__)"])
    commit = tools.output(["git", "-C", str(ROOT), "describe", "--always", "--dirty"])
    return f"{version} ({commit})" if commit else version


@dataclass
class Etcd(System):
    """A single etcd node, loaded through its HTTP/JSON gateway."""

    api: str = "/v3"

    def supports(self, workload: str) -> str | None:
        if workload == "d":
            return "etcd has no counting semaphore primitive (its recipe is several round trips)"
        if workload in ("e", "f"):
            return FENCEPOST_ONLY
        return None

    @contextlib.contextmanager
    def running(self, workdir: Path) -> Iterator[System]:
        binary = tools.ensure("etcd", install=self.install)
        if binary is None:
            raise Skipped("not installed (Debian package etcd-server)")
        self.port, peer = procs.free_port(), procs.free_port()
        client_url, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
        self.proc = procs.start(
            [binary, "--name", "bench", "--data-dir", str(workdir / "etcd"),
             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"bench={peer_url}", "--log-level", "warn"],
            workdir / "etcd.log")
        try:
            procs.wait_port(self.port, self.proc)
            _, info = http_json("GET", f"{client_url}/version")
            self.version = str(info.get("etcdserver", "?"))
            self.api = gateway_prefix(self.version)
            self.notes.append(f"gateway {self.api}")
            status, _ = http_json("POST", f"{client_url}{self.api}/kv/range",
                                  {"key": "aGVhbHRo"})
            if status != 200:
                raise RuntimeError(f"etcd gateway answered {status}")
            yield self
        finally:
            procs.stop(self.proc)

    def loader_env(self, workload: str, connections: int, nonce: str) -> dict[str, str]:
        return {"ETCD_API": self.api}


def gateway_prefix(version: str) -> str:
    """etcd's JSON gateway moved: v3alpha (<= 3.2), v3beta (3.3), v3 (>= 3.4)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return "/v3"
    if (major, minor) >= (3, 4):
        return "/v3"
    return "/v3beta" if (major, minor) == (3, 3) else "/v3alpha"


# Lock scripts as a Redis user would write them (the Redlock single-instance recipe).
REDIS_SCRIPTS = {
    "del": "if redis.call('GET', KEYS[1]) == ARGV[1] then "
           "return redis.call('DEL', KEYS[1]) else return 0 end",
    "pexpire": "if redis.call('GET', KEYS[1]) == ARGV[1] then "
               "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end",
    # A timed counting semaphore: members are slots, scores their deadlines.
    "sem_acquire": "local t = redis.call('TIME') "
                   "local now = t[1] * 1000 + math.floor(t[2] / 1000) "
                   "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) "
                   "if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then "
                   "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1]) return 1 end "
                   "return 0",
    "sem_release": "return redis.call('ZREM', KEYS[1], ARGV[1])",
}


@dataclass
class Redis(System):
    """redis-server with an append-only file fsynced every second."""

    protocol: str = "redis"
    shas: dict[str, str] = field(default_factory=dict)

    def supports(self, workload: str) -> str | None:
        return FENCEPOST_ONLY if workload in ("e", "f") else None

    @contextlib.contextmanager
    def running(self, workdir: Path) -> Iterator[System]:
        binary = tools.ensure("redis-server", install=self.install)
        if binary is None:
            raise Skipped("not installed (Debian package redis-server)")
        self.port = procs.free_port()
        self.proc = procs.start(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(workdir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--protected-mode", "yes", "--logfile", str(workdir / "redis.log")],
            workdir / "redis.out")
        try:
            procs.wait_port(self.port, self.proc)
            with Resp(self.port) as redis:
                info = str(redis.call("INFO", "server"))
                self.version = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                                     if line.startswith("redis_version:")), "?")
                self.shas = {name: str(redis.call("SCRIPT", "LOAD", body))
                             for name, body in REDIS_SCRIPTS.items()}
            self.notes.append("appendonly yes, appendfsync everysec")
            yield self
        finally:
            procs.stop(self.proc)


def fencepost_name(store: str, workers: int) -> str:
    """`fencepost-sqlite`, or with several workers `fencepost-sqlite-w4`."""
    return f"fencepost-{store}" + (f"-w{workers}" if workers > 1 else "")


def make_systems(names: list[str], pg_admin_url: str, install: bool,
                 workers: list[int] | None = None) -> list[System]:
    """The systems to measure; fencepost once per count in `workers` (default [1])."""
    made: list[System] = []
    for name in names:
        if name == "fencepost-sqlite":
            made += [Fencepost(fencepost_name("sqlite", n), store="sqlite", workers=n)
                     for n in workers or [1]]
        elif name == "fencepost-postgresql":
            made += [Fencepost(fencepost_name("postgresql", n), store="postgresql", workers=n,
                               pg_admin_url=pg_admin_url) for n in workers or [1]]
        elif name == "etcd":
            made.append(Etcd(name, install=install))
        elif name == "redis":
            made.append(Redis(name, install=install))
        else:
            raise ValueError(f"unknown system {name!r}")
    return made
