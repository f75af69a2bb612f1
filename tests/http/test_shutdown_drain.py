"""SIGTERM (SPEC §6): readiness off first, a drain while everything else still
serves, then the listener closes, parked waiters get 503 shutting_down, exit 0."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import ServerProcess, lock_headers, new_token, unique_name, wait_for


def status_on_new_connection(server: ServerProcess, path: str) -> int | None:
    """The status of `path` over a connection of its own; None when refused."""
    try:
        with server.client() as c:
            return c.get(path).status_code
    except httpx.ConnectError:
        return None


def sigterm(server: ServerProcess) -> None:
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGTERM)


class Parked:
    """An acquire waiting in line behind a held lock, in a thread of its own."""

    def __init__(self, server: ServerProcess) -> None:
        self.name = unique_name("drain")
        with server.client() as c:
            held = c.put(f"/v1/locks/{self.name}/lease", headers=lock_headers(new_token()),
                         json={"ttl_seconds": 600})
            assert held.status_code == 201, held.text
        self.result: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._wait, args=(server,), daemon=True)
        self.thread.start()
        with server.client() as c:
            assert wait_for(lambda: c.get(f"/v1/locks/{self.name}").json()["waiters"] == 1,
                            timeout=10.0), (
                "the waiter never got in line"
            )

    def _wait(self, server: ServerProcess) -> None:
        try:
            with server.client() as c:
                self.result["resp"] = c.put(
                    f"/v1/locks/{self.name}/lease", headers=lock_headers(new_token()),
                    json={"ttl_seconds": 30, "wait_seconds": 120},
                )
        except httpx.HTTPError as exc:
            self.result["error"] = exc

    def answer(self) -> httpx.Response:
        self.thread.join(timeout=30)
        assert "resp" in self.result, f"the parked waiter got no answer: {self.result}"
        return self.result["resp"]  # type: ignore[no-any-return]


@pytest.fixture
def draining_server(tmp_path: Path) -> Iterator[ServerProcess]:
    # A drain far longer than the test: a second SIGTERM ends it on cue.
    proc = ServerProcess(tmp_path / "server", extra_args=["--drain-seconds", "600"]).start()
    yield proc
    proc.stop()


def test_sigterm_turns_readiness_off_then_drains_then_closes(
    draining_server: ServerProcess,
) -> None:
    srv = draining_server
    parked = Parked(srv)
    sigterm(srv)
    assert wait_for(lambda: status_on_new_connection(srv, "/readyz") == 503, timeout=10.0), \
        "/readyz stayed up"
    with srv.client() as c:
        ready = c.get("/readyz")
        assert ready.json()["error"]["code"] == "shutting_down"
        assert c.get("/healthz").status_code == 503
    # The drain: new connections are still accepted and served.
    assert status_on_new_connection(srv, "/livez") == 200
    with srv.client() as c:
        assert c.get("/v1/whoami").status_code == 200
        other, token = unique_name("drain"), new_token()
        assert c.put(f"/v1/locks/{other}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": 30}).status_code == 201
        assert c.delete(f"/v1/locks/{other}/lease", headers=lock_headers(token)).json() == {
            "released": True
        }
        assert c.get(f"/v1/locks/{parked.name}").json()["waiters"] == 1  # still in line
    assert parked.thread.is_alive()
    sigterm(srv)  # the drain ends early when asked again
    resp = parked.answer()
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "shutting_down"
    assert wait_for(lambda: status_on_new_connection(srv, "/livez") is None, timeout=10.0), \
        "still accepting"
    assert srv.proc is not None and srv.proc.wait(timeout=30) == 0


def test_the_drain_ends_by_itself(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "server", extra_args=["--drain-seconds", "0.5"]).start()
    try:
        parked = Parked(srv)
        sigterm(srv)
        resp = parked.answer()
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "shutting_down"
        assert srv.proc is not None and srv.proc.wait(timeout=30) == 0
        assert status_on_new_connection(srv, "/livez") is None
    finally:
        srv.stop()


def test_drain_seconds_from_the_environment_and_bad_values(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = subprocess.run(
        [sys.executable, "-m", "fencepost", "serve", "--drain-seconds", "-1"],
        capture_output=True, text=True, timeout=30, cwd=tmp_path,
    )
    assert bad.returncode == 2 and "--drain-seconds" in bad.stderr
    srv = ServerProcess(tmp_path / "server", extra_env={"FENCEPOST_DRAIN_SECONDS": "600"})
    srv.start()
    try:
        sigterm(srv)
        assert wait_for(lambda: status_on_new_connection(srv, "/readyz") == 503, timeout=10.0)
        assert status_on_new_connection(srv, "/v1/whoami") == 200  # draining, not closed
    finally:
        srv.stop()  # a second SIGTERM ends the drain
