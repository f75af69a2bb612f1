"""The helpers every test folder shares, each written once: a real `fencepost serve` process
(ServerProcess, server_fleet) and the leak check on what the tests start, checks of the API's
answers (the error envelope, 422 details, `_at` times), waiting for a condition (wait_for,
wait_until), and what to do when a tool is missing (a failure under CI=true, else a skip).
Folder-specific helpers live beside their tests (cli/cli_support.py, http/lock_support.py, ...)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

BOOTSTRAP_KEY = "fp_test_bootstrap_admin_key_0123456789abcdef"

# The environment of a server whose parked waiters get up only when woken
# (server/waiting.py): the safety wake, the net under a lost wake-up, comes
# after an hour. A waiter whose wake-up is lost then waits its whole wait and
# is answered by its last try at the end of it (granted, if the lock or slot
# is free by then). So a test of a wake-up asserts, besides the status, that
# the waiter did not wait its whole wait, as the server measured it on its
# own clock (`waited_ms`, X-Queued-Ms): exact for a lost wake-up however
# loaded the machine, where a bound on how soon the grant came was not. The
# sweep that keeps places alive runs as usual: it wakes nobody.
WAKE_UPS_ONLY = {"FENCEPOST_TEST_HOOKS": "1", "FENCEPOST_SAFETY_WAKE_S": "3600"}


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


def missing(what: str) -> NoReturn:
    """A tool or service the suite needs is absent: a failure under CI=true (so that a check
    cannot pass by not running), a skip on a developer's machine."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available")


def faketime_library(multithreaded: bool = False) -> str:
    """The libfaketime the installed `faketime` preloads (its path is built into the wrapper),
    the variant for multithreaded programs when asked. Tests preload it themselves: the
    wrapper forks, so a stop signal would miss the server."""
    tool = shutil.which("faketime")
    if tool is None:
        missing("faketime (apt-get install faketime)")
    variant = ["-m"] if multithreaded else []
    probe = subprocess.run([tool, *variant, "-f", "+0", "printenv", "LD_PRELOAD"],
                           capture_output=True, text=True, timeout=30, check=True)
    library = probe.stdout.strip()
    assert library, f"faketime preloads nothing? {probe.stderr}"
    return library


@contextlib.contextmanager
def server_fleet(folder: Path) -> Iterator[Callable[..., ServerProcess]]:
    """A `start(name, **ServerProcess fields)` that starts a server in `folder/name`; every
    server it started is stopped on leaving, whatever happened."""
    made: list[ServerProcess] = []

    def start(name: str = "server", **fields: Any) -> ServerProcess:
        proc = ServerProcess(folder / name, **fields)
        made.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in made:
            proc.stop()


# --- answers -----------------------------------------------------------------------------------

SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
TIME_AT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
# The code each status has when an error may come from more than one check (SPEC §2).
_CODE_OF_STATUS = {400: "invalid_request", 401: "unauthorized", 404: "not_found",
                   413: "payload_too_large", 422: "validation_error"}


def assert_error(resp: httpx.Response, status: int | tuple[int, ...], code: str | None = None
                 ) -> dict[str, Any]:
    """`resp` is the error envelope of SPEC §2 with `status` (or one of them) and `code` (by
    default the code that status has, where it has one); returns the `error` object."""
    statuses = status if isinstance(status, tuple) else (status,)
    assert resp.status_code in statuses, (
        f"expected {statuses} {code or ''}, got {resp.status_code}: {resp.text[:500]}")
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    assert "Traceback" not in resp.text and "<html" not in resp.text.lower()
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err, dict), body
    assert isinstance(err.get("code"), str) and SNAKE.match(err["code"]), body
    expected = code if code is not None else _CODE_OF_STATUS.get(resp.status_code)
    if expected is not None:
        assert err["code"] == expected, body
    message = err.get("message")
    assert isinstance(message, str) and message.strip() and "\n" not in message.strip(), body
    assert resp.headers.get("x-request-id"), resp.headers
    return dict(err)


def detail_fields(err: dict[str, Any]) -> set[str]:
    """The fields a 422's `details` name, each detail checked for a field and a message."""
    details = err.get("details")
    assert isinstance(details, list) and details, f"422 without details: {err}"
    for item in details:
        assert isinstance(item, dict) and isinstance(item.get("field"), str), item
        assert isinstance(item.get("message"), str) and item["message"], item
    return {item["field"] for item in details}


def parse_at(value: Any) -> datetime:
    """An `_at` field (RFC 3339, milliseconds, Z) as an aware datetime."""
    assert isinstance(value, str) and TIME_AT.match(value), f"not RFC 3339 ms + Z: {value!r}"
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


# --- waiting -----------------------------------------------------------------------------------


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02) -> Any:
    """The first truthy result of `predicate`, or its last one once `timeout` has passed: the
    caller asserts on it (and says what it waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 10.0,
               interval: float = 0.05) -> Any:
    """The first truthy result of `predicate`; fails naming `what` when none comes within
    `timeout` seconds."""
    value = wait_for(predicate, timeout, interval)
    assert value, f"timed out after {timeout} s waiting for {what}"
    return value


def waited_ms(server: ServerProcess, request_id: str) -> int:
    """How long `server` kept the acquire `request_id` (lock or slot) before
    answering, on the server's own clock: its access-log line."""
    lines = wait_until(
        lambda: [e for e in server.access_log_lines() if e.get("request_id") == request_id],
        f"the access-log line of {request_id}")
    [line] = lines
    return int(line["waited_ms"])


def wait_parked(server: ServerProcess, count: int) -> None:
    """Wait until `server` has at least `count` requests parked in its lines
    (its metrics), so that what a test does next reaches them as a wake-up
    rather than at their first try."""
    wait_until(lambda: metric(server, "fencepost_waiters_parked") >= count,
               f"{count} parked waiters")


def true_within(ask: Callable[[], bool], since: float, within_s: float) -> bool:
    """Whether `ask` (one request) comes true, asked again and again, before a
    request sent `within_s` or more after `since` (a time.monotonic()) still
    finds it false: for the SPEC's "within N s" of something the server must
    learn (a revoked key refused, a new project's key accepted). When the
    request left counts, not when its answer came: the server decided in
    between, and a loaded machine can make an answer slow to come back."""
    while True:
        sent = time.monotonic()
        if ask():
            return True
        if sent - since >= within_s:
            return False
        time.sleep(0.05)


# --- processes and names -----------------------------------------------------------------------


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

    def start(self, timeout: float = 20.0) -> ServerProcess:
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

    def wait_ready(self, timeout: float = 20.0) -> ServerProcess:
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
            capture_output=True, text=True, timeout=30, env=self.env(), cwd=self.workdir,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def access_log_lines(self) -> list[dict[str, Any]]:
        import json

        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line]


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """The value of the sample `name` with exactly `labels` on the server's
    `/metrics` (0 when it is not exposed)."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = httpx.get(f"{server.base_url}/metrics", timeout=30)
    assert resp.status_code == 200, resp.text
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0
