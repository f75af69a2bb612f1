"""Helpers for tests that talk to a real `fencepost serve` process over HTTP."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

BOOTSTRAP_KEY = "fp_test_bootstrap_admin_key_0123456789abcdef"


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM the server when the test process dies, so a killed
    test run leaves no servers behind."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# Every process the tests start that must not outlive the test run (servers,
# mostly); tests/conftest.py fails the session if any is still alive at its end.
# Each with whether it leads a process group of its own.
_STARTED: list[tuple[subprocess.Popen[Any], bool]] = []


def track(proc: subprocess.Popen[Any], own_group: bool = False) -> subprocess.Popen[Any]:
    """Remember `proc` (started with `start_new_session=True` when `own_group`)
    for the end-of-session leak check; returns it."""
    _STARTED.append((proc, own_group))
    return proc


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftover_processes() -> list[str]:
    """The tracked processes still running, and process groups of tracked
    processes started in a group of their own that still have a member (a
    wrapper's child left behind, for example)."""
    left = []
    for proc, own_group in _STARTED:
        if proc.poll() is None:
            left.append(f"pid {proc.pid}: {' '.join(map(str, proc.args))}")
        elif own_group and _group_alive(proc.pid):
            left.append(f"process group {proc.pid} of: {' '.join(map(str, proc.args))}")
    return left


def kill_leftovers() -> None:
    """SIGKILL what `leftover_processes` reports, so a failed check leaves no litter."""
    for proc, own_group in _STARTED:
        if own_group and _group_alive(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def poll(what: str, attempt: Callable[[], Any], within_s: float, every_s: float = 0.05) -> Any:
    """The first truthy result of `attempt`, or fail once `within_s` has passed."""
    deadline = time.monotonic() + within_s
    while True:
        result = attempt()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        time.sleep(every_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def new_token() -> str:
    return str(uuid.uuid4())


def unique_name(prefix: str = "lock") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def lock_headers(token: str | None = None, request_id: str | None = None) -> dict[str, str]:
    return {
        "X-Lock-Token": token or new_token(),
        "X-Request-Id": request_id or str(uuid.uuid4()),
    }


@dataclass
class ServerProcess:
    """One `fencepost serve` child process on its own SQLite file and port."""

    workdir: Path
    port: int = field(default_factory=free_port)
    admin_key: str = BOOTSTRAP_KEY
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    store: str | None = None  # a PostgreSQL URL; the default is a SQLite file in workdir
    command_prefix: list[str] = field(default_factory=list)  # e.g. faketime
    extra_args: list[str] = field(default_factory=list)  # more `fencepost serve` options
    workers: int = 1  # `--workers`: serving processes behind the port
    _stderr_mark: int = 0  # where this life's standard error starts

    @property
    def db_path(self) -> Path:
        return self.workdir / "fencepost.db"

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.db_path}"

    @property
    def access_log(self) -> Path:
        return self.workdir / "access.log"

    @property
    def stdout_path(self) -> Path:
        return self.workdir / "server.out"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "server.err"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["FENCEPOST_BOOTSTRAP_KEY"] = self.admin_key
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 20.0) -> "ServerProcess":
        self.spawn()
        try:
            return self.wait_ready(timeout)
        except BaseException:
            self.stop()  # never leave a server that did not come up running
            raise

    def spawn(self) -> None:
        """Start the process without waiting. Call from the main thread: the
        server is told to stop when the thread that started it ends. It runs in
        a process group of its own, and every stop signals the whole group, so
        that a wrapper in `command_prefix` that forks (`faketime` does) cannot
        leave the real server behind."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._stderr_mark = self.stderr_path.stat().st_size if self.stderr_path.exists() else 0
        cmd = [
            *self.command_prefix,
            sys.executable, "-m", "fencepost", "serve",
            "--store", self.store_url,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--access-log", str(self.access_log),
            *(["--workers", str(self.workers)] if self.workers != 1 else []),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=self.env(),
            stdout=open(self.stdout_path, "ab"),
            stderr=open(self.stderr_path, "ab"),
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            start_new_session=True,
        )
        track(self.proc, own_group=True)

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def wait_ready(self, timeout: float = 20.0) -> "ServerProcess":
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}: {self.stderr_path.read_text()}"
                )
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1).status_code == 200 and (
                    self.workers == 1 or self.announced()
                ):  # one worker may answer before the others listen
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not become healthy: {self.stderr_path.read_text()}")

    def announced(self) -> bool:
        """Whether this life said "serving on" (with workers: all of them listen)."""
        with open(self.stderr_path, "rb") as err:
            err.seek(self._stderr_mark)
            return b"serving on" in err.read()

    def kill9(self) -> None:
        assert self.proc is not None
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        self._signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=5)
        # Anything left in its group (a wrapper's child) goes too.
        deadline = time.monotonic() + 5
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal(signal.SIGKILL)

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        """An httpx client authenticated with `key` (the bootstrap admin key by default)."""
        headers = {"Authorization": f"Bearer {key or self.admin_key}"}
        headers.update(kwargs.pop("headers", {}))
        kwargs.setdefault("timeout", 30)
        return httpx.Client(base_url=self.base_url, headers=headers, **kwargs)

    def async_client(self, key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key or self.admin_key}"}
        headers.update(kwargs.pop("headers", {}))
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=30, **kwargs)

    def create_key(self, role: str, **fields: Any) -> dict[str, Any]:
        """Creates a key in the admin key's project through the API; returns the 201 body."""
        with self.client() as c:
            resp = c.post("/v1/keys", json={"role": role, **fields})
            assert resp.status_code == 201, resp.text
            return dict(resp.json())

    def create_project(self, name: str) -> str:
        """Creates a project with the CLI straight in the store; returns its admin key."""
        out = subprocess.run(
            [sys.executable, "-m", "fencepost", "project", "create", name,
             "--store", self.store_url],
            capture_output=True, text=True, timeout=30, env=self.env(),
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def access_log_lines(self) -> list[dict[str, Any]]:
        import json

        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line]
