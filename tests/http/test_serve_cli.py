"""`fencepost serve` and `fencepost project create`: bootstrap, configuration, shutdown
(SPEC §6)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from support import (
    BOOTSTRAP_KEY,
    ServerProcess,
    free_port,
    lock_headers,
    new_token,
    track,
    true_within,
    unique_name,
)

MakeServer = Callable[..., ServerProcess]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any FENCEPOST_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str], cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fencepost", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def wait_healthy(base_url: str, proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("server did not become healthy")


def stop(proc: subprocess.Popen[Any]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
            raise AssertionError("server ignored SIGTERM for 15 s") from None
    return int(proc.returncode)


def port_is_closed(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def whoami(base_url: str, key: str) -> httpx.Response:
    return httpx.get(f"{base_url}/v1/whoami", headers={"Authorization": f"Bearer {key}"},
                     timeout=30)


def wait_for_text(path: Path, needle: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


# --- bootstrap -------------------------------------------------------------------------------


class NoBootstrapEnvServer(ServerProcess):
    """A server started without FENCEPOST_BOOTSTRAP_KEY in its environment."""

    def env(self) -> dict[str, str]:
        return clean_env()


@pytest.fixture
def generated_key_server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = NoBootstrapEnvServer(tmp_path / "generated")
    proc.start()
    yield proc
    proc.stop()


def test_generated_bootstrap_key_saved_and_only_its_file_logged(generated_key_server:
                                                                ServerProcess) -> None:
    """Standard output is no terminal here (a file, as under a supervisor or a
    container runtime): the secret is not printed; the log says which file holds it."""
    srv = generated_key_server
    key_file = Path(f"{srv.db_path}.admin-key")
    deadline = time.monotonic() + 5
    while not key_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert key_file.exists(), f"no {key_file.name} beside the database"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600, oct(key_file.stat().st_mode)
    key = key_file.read_text().strip()
    assert key and len(key.split()) == 1 and len(key) >= 22, key_file.read_text()
    assert key != BOOTSTRAP_KEY

    stderr = wait_for_text(srv.stderr_path, str(key_file))
    told = [json.loads(line) for line in stderr.splitlines() if str(key_file) in line]
    assert len(told) == 1 and told[0]["log"] == "app", stderr
    assert "admin key is in" in told[0]["message"], told
    assert key not in srv.stdout_path.read_text()
    assert key not in srv.stderr_path.read_text()

    resp = whoami(srv.base_url, key)
    assert resp.status_code == 200, resp.text
    assert resp.json()["project"] == "default" and resp.json()["role"] == "admin"
    srv.admin_key = key
    with srv.client() as c:
        assert c.put(f"/v1/locks/{unique_name('gen')}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30}).status_code == 201
    assert whoami(srv.base_url, BOOTSTRAP_KEY).status_code == 401

    # a restart finds the key in the store: nothing new is generated or printed
    assert srv.terminate() == 0
    srv.start()
    assert whoami(srv.base_url, key).status_code == 200
    assert key_file.read_text().strip() == key
    time.sleep(0.3)
    assert key not in srv.stdout_path.read_text()
    assert srv.stderr_path.read_text().count("admin key is in") == 1, "a second key was made"
    assert key not in (srv.access_log.read_text() if srv.access_log.exists() else "")
    assert key not in srv.stderr_path.read_text()


def test_configured_bootstrap_key_is_never_printed(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    assert whoami(srv.base_url, BOOTSTRAP_KEY).status_code == 200
    with srv.client() as c:
        assert c.put(f"/v1/locks/{unique_name('b')}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30}).status_code == 201
    assert srv.terminate() == 0
    for path in (srv.stdout_path, srv.stderr_path, srv.access_log):
        assert BOOTSTRAP_KEY not in (path.read_text() if path.exists() else ""), path.name
    assert not Path(f"{srv.db_path}.admin-key").exists() or \
        BOOTSTRAP_KEY not in Path(f"{srv.db_path}.admin-key").read_text()


@pytest.mark.parametrize("length", [1, 8, 31])
def test_short_bootstrap_key_is_refused(tmp_path: Path, length: int) -> None:
    short = "s" * (length - 1) + "Z"
    port = free_port()
    proc = track(subprocess.Popen(
        [sys.executable, "-m", "fencepost", "serve", "--store", f"sqlite:///{tmp_path}/fp.db",
         "--host", "127.0.0.1", "--port", str(port)],
        env=clean_env(FENCEPOST_BOOTSTRAP_KEY=short), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"server started with a {length}-character FENCEPOST_BOOTSTRAP_KEY")
    assert proc.returncode != 0
    assert "Traceback" not in err and "Traceback" not in out, err
    assert re.search(r"bootstrap|32", err + out, re.IGNORECASE), f"unclear message: {err!r}"
    if length >= 8:
        assert short not in err + out, "the refused secret was echoed"
    assert port_is_closed(port)


def test_bootstrap_key_of_exactly_32_chars_is_accepted(make_server: MakeServer) -> None:
    key = "k" * 31 + "Q"
    srv = make_server("exact32", FENCEPOST_BOOTSTRAP_KEY=key)
    srv.admin_key = key
    srv.start()
    assert whoami(srv.base_url, key).status_code == 200


# --- configuration from the environment ------------------------------------------------------


@pytest.mark.parametrize("store_form", ["relative", "absolute"])
def test_env_vars_configure_the_server(tmp_path: Path, store_form: str) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    port = free_port()
    db = cwd / "env-store.db" if store_form == "relative" else tmp_path / "elsewhere" / "abs.db"
    db.parent.mkdir(exist_ok=True)
    store = "sqlite:///env-store.db" if store_form == "relative" else f"sqlite:///{db}"
    log = tmp_path / "env-access.log"
    env = clean_env(FENCEPOST_BOOTSTRAP_KEY=BOOTSTRAP_KEY, FENCEPOST_PORT=str(port),
                    FENCEPOST_STORE=store, FENCEPOST_HOST="127.0.0.1",
                    FENCEPOST_ACCESS_LOG=str(log))
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = track(subprocess.Popen([sys.executable, "-m", "fencepost", "serve"], cwd=cwd,
                                      env=env, stdout=out, stderr=err))
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        name = unique_name("env")
        resp = httpx.put(f"http://127.0.0.1:{port}/v1/locks/{name}/lease",
                         headers={**lock_headers(), "Authorization": f"Bearer {BOOTSTRAP_KEY}"},
                         json={"ttl_seconds": 30}, timeout=30)
        assert resp.status_code == 201, resp.text
        assert db.exists(), f"FENCEPOST_STORE={store} not honoured"
        assert not (cwd / "fencepost.db").exists(), "default store used despite FENCEPOST_STORE"
    finally:
        code = stop(proc)
    assert code == 0
    assert log.exists(), "FENCEPOST_ACCESS_LOG not honoured"
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert any(line.get("lock") == name for line in lines), lines[-5:]
    assert BOOTSTRAP_KEY not in log.read_text() + out_path.read_text() + err_path.read_text()


def test_defaults_are_port_7440_and_fencepost_db_in_cwd(tmp_path: Path) -> None:
    if not port_is_closed(7440):
        pytest.skip("something else listens on 127.0.0.1:7440")
    with open(tmp_path / "err", "wb") as err_file:
        proc = track(subprocess.Popen([sys.executable, "-m", "fencepost", "serve"], cwd=tmp_path,
                                      env=clean_env(FENCEPOST_BOOTSTRAP_KEY=BOOTSTRAP_KEY),
                                      stdout=subprocess.DEVNULL, stderr=err_file))
    try:
        wait_healthy("http://127.0.0.1:7440", proc)
        name = unique_name("default")
        resp = httpx.put(f"http://127.0.0.1:7440/v1/locks/{name}/lease",
                         headers={**lock_headers(), "X-Api-Key": BOOTSTRAP_KEY},
                         json={"ttl_seconds": 30}, timeout=30)
        assert resp.status_code == 201, resp.text
        assert (tmp_path / "fencepost.db").exists()
    finally:
        code = stop(proc)
    assert code == 0
    err = (tmp_path / "err").read_text()
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(line.get("lock") == name for line in logged), "access log not on stderr by default"


def test_generated_bootstrap_key_printed_once_on_a_terminal(tmp_path: Path) -> None:
    """Started by a person at a terminal, the server shows the new key once."""
    import pty
    import select

    port = free_port()
    leader, follower = pty.openpty()
    with open(tmp_path / "err", "wb") as err:
        proc = track(subprocess.Popen(
            [sys.executable, "-m", "fencepost", "serve", "--host", "127.0.0.1", "--port",
             str(port), "--store", f"sqlite:///{tmp_path}/fp.db"],
            cwd=tmp_path, env=clean_env(), stdout=follower, stderr=err))
    os.close(follower)
    shown = b""
    key_file = tmp_path / "fp.db.admin-key"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if key_file.exists() and key_file.read_text().strip().encode() in shown:
                break
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                shown += os.read(leader, 4096)
        key = key_file.read_text().strip()
        assert shown.count(key.encode()) == 1, shown
        assert key not in (tmp_path / "err").read_text()
        assert whoami(f"http://127.0.0.1:{port}", key).status_code == 200
    finally:
        assert stop(proc) == 0
        os.close(leader)


# --- project create --------------------------------------------------------------------------


def test_project_create_prints_only_the_key_and_is_accepted_within_2s(
        fresh_server: ServerProcess) -> None:
    srv = fresh_server
    name = unique_name("proj")
    result = run_cli("project", "create", name, "--store", srv.store_url,
                     env=clean_env())
    created = time.monotonic()
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be the key alone on one line: {result.stdout!r}"
    key = lines[0].strip()
    assert key == lines[0] and key and " " not in key
    assert true_within(lambda: whoami(srv.base_url, key).status_code == 200, created, 2.0), \
        "a key from `project create` was not accepted within 2 s"
    resp = whoami(srv.base_url, key)
    assert resp.json()["project"] == name and resp.json()["role"] == "admin"
    assert srv.terminate() == 0
    for path in (srv.stdout_path, srv.stderr_path, srv.access_log):
        assert key not in (path.read_text() if path.exists() else ""), path.name


def test_project_create_twice_fails_cleanly(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    name = unique_name("twice")
    first = run_cli("project", "create", name, "--store", srv.store_url, env=clean_env())
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    second = run_cli("project", "create", name, "--store", srv.store_url, env=clean_env())
    assert second.returncode != 0, "creating an existing project succeeded"
    assert second.stdout.strip() == "", f"a key was printed: {second.stdout!r}"
    assert "Traceback" not in second.stderr + second.stdout, second.stderr
    message = second.stderr.strip()
    assert message and (name in message or re.search(r"exist", message, re.I)), message
    assert len(message.splitlines()) <= 5, message
    # the first project is intact and has still exactly one key
    deadline = time.monotonic() + 3
    while whoami(srv.base_url, key).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    with srv.client(key) as c:
        assert c.get("/v1/whoami").json()["project"] == name
        assert len(c.get("/v1/keys").json()["keys"]) == 1


def test_project_create_default_fails_when_bootstrapped(fresh_server: ServerProcess) -> None:
    result = run_cli("project", "create", "default", "--store", fresh_server.store_url,
                     env=clean_env())
    assert result.returncode != 0
    assert result.stdout.strip() == ""
    assert "Traceback" not in result.stderr
    with fresh_server.client() as c:
        keys = c.get("/v1/keys").json()["keys"]
    assert len(keys) == 1, "a second admin key was added to project default"


# --- shutdown --------------------------------------------------------------------------------


def test_sigterm_exits_zero(fresh_server: ServerProcess) -> None:
    with fresh_server.client() as c:  # an idle keep-alive connection stays open
        assert c.get("/v1/whoami").status_code == 200
        assert fresh_server.terminate() == 0
    assert port_is_closed(fresh_server.port)


def test_sigterm_answers_parked_waiter_and_exits_zero(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    name, holder = unique_name("shut"), new_token()
    with srv.client() as c:
        grant = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(holder),
                      json={"ttl_seconds": 600})
        assert grant.status_code == 201, grant.text
    result: dict[str, Any] = {}

    def wait_in_line() -> None:
        try:
            with srv.client() as c:
                result["resp"] = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                                       json={"ttl_seconds": 30, "wait_seconds": 60})
        except httpx.HTTPError as exc:
            result["error"] = exc

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    deadline = time.monotonic() + 10
    with srv.client() as c:
        while c.get(f"/v1/locks/{name}").json()["waiters"] != 1:
            assert time.monotonic() < deadline, "the waiter never got in line"
            time.sleep(0.05)
    assert srv.terminate() == 0
    waiter.join(timeout=20)
    assert not waiter.is_alive()
    assert "resp" in result, f"the parked waiter got no answer: {result.get('error')!r}"
    resp = result["resp"]
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "shutting_down"
    # the waiter was not granted: after a restart the first holder still has the lock
    srv.start()
    with srv.client() as c:
        now = c.get(f"/v1/locks/{name}").json()
    assert now["held"] is True and now["fencing_token"] == grant.json()["fencing_token"]


# --- start-up tells the truth (SPEC §6) -------------------------------------------------------


def serve_until_exit(*args: str, cwd: Path, env: dict[str, str] | None = None,
                     ) -> subprocess.CompletedProcess[str]:
    """`fencepost serve ARGS` expected to give up at start; fails the test if it
    is still running after 30 s (it would be serving)."""
    proc = track(subprocess.Popen(
        [sys.executable, "-m", "fencepost", "serve", "--host", "127.0.0.1", *args], cwd=cwd,
        env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        stop(proc)
        pytest.fail("the server started although it should have refused to")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_one_line_refusal(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 1, nothing on stdout (no key), exactly one line on stderr naming the cause."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "", f"printed on stdout: {result.stdout!r}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"want one line on stderr, got: {result.stderr!r}"
    line = lines[0]
    assert line.startswith("fencepost: ") and "serving" not in line, line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_serving_is_announced_only_once_it_listens_with_its_store_open(tmp_path: Path) -> None:
    # Port 0: the kernel picks the port, so only a server that already listens
    # can name it; the message must be true the moment it appears.
    err_path = tmp_path / "err"
    with open(err_path, "wb") as err:
        proc = track(subprocess.Popen(
            [sys.executable, "-m", "fencepost", "serve", "--host", "127.0.0.1", "--port", "0",
             "--store", f"sqlite:///{tmp_path}/fp.db"],
            cwd=tmp_path, env=clean_env(FENCEPOST_BOOTSTRAP_KEY=BOOTSTRAP_KEY),
            stdout=subprocess.DEVNULL, stderr=err))
    try:
        text = wait_for_text(err_path, "serving on", timeout=30)
        found = re.search(r"serving on http://127\.0\.0\.1:(\d+) with sqlite:///", text)
        assert found, f"no true 'serving on' line: {text!r}"
        port = int(found.group(1))
        assert port != 0
        # One request, no retry: it must be answered, and the store must answer.
        resp = whoami(f"http://127.0.0.1:{port}", BOOTSTRAP_KEY)
        assert resp.status_code == 200, resp.text
    finally:
        assert stop(proc) == 0


def test_a_busy_port_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # No FENCEPOST_BOOTSTRAP_KEY: a server that opened the empty store would
        # make a key, print it and write it to a file.
        result = serve_until_exit("--port", str(port), "--store", "sqlite:///fp.db",
                                  cwd=tmp_path)
    assert_one_line_refusal(result, f"127.0.0.1:{port}", "in use")
    assert files_under(tmp_path) == [], "a busy port still created the store or a key file"


def test_a_missing_sqlite_folder_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    port = free_port()
    result = serve_until_exit("--port", str(port), "--store", "sqlite:///no/such/fp.db",
                              cwd=tmp_path)
    assert_one_line_refusal(result, "no/such", "does not exist")
    assert files_under(tmp_path) == [], "the missing folder (or a key file) was created"
    assert port_is_closed(port)

    absolute = tmp_path / "gone" / "fp.db"
    result = serve_until_exit("--port", str(port), "--store", f"sqlite:///{absolute}",
                              cwd=tmp_path)
    assert_one_line_refusal(result, str(absolute.parent), "does not exist")
    assert files_under(tmp_path) == []


def test_an_unreachable_postgresql_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = serve_until_exit("--port", str(free_port()), "--store",
                              f"postgresql://fp:s3cret-pw@127.0.0.1:{port}/fencepost", cwd=tmp_path)
    line = assert_one_line_refusal(result, "PostgreSQL")
    assert "s3cret-pw" not in line
    assert files_under(tmp_path) == []


def test_a_missing_postgresql_database_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    import pg_support

    name = f"fencepost_test_missing_{new_token()[:8]}"
    result = serve_until_exit("--port", str(free_port()), "--store",
                              pg_support.database_url(name), cwd=tmp_path)
    assert_one_line_refusal(result, name, "does not exist")
    assert files_under(tmp_path) == [], "a key file was written for a store that never opened"
    with pg_support._admin_connection() as admin:
        assert admin.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             (name,)).fetchone() is None, "the database was created"


def test_project_create_refuses_a_sqlite_store_that_does_not_exist(tmp_path: Path) -> None:
    workdir = tmp_path / "server"
    workdir.mkdir()
    store = f"sqlite:///{workdir}/fencepost.db"
    refused = run_cli("project", "create", "acme", "--store", store, env=clean_env())
    assert_one_line_refusal(refused, str(workdir / "fencepost.db"), "--create")
    assert files_under(workdir) == []

    missing_folder = run_cli("project", "create", "acme", "--store",
                             f"sqlite:///{tmp_path}/nope/fp.db", "--create", env=clean_env())
    assert_one_line_refusal(missing_folder, "does not exist")
    assert not (tmp_path / "nope").exists()

    created = run_cli("project", "create", "acme", "--store", store, "--create", env=clean_env())
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert created.stdout == key + "\n" and key
    # The store it made is a real one: a server started on it accepts the key.
    srv = ServerProcess(workdir).start()
    try:
        resp = whoami(srv.base_url, key)
        assert resp.status_code == 200 and resp.json()["project"] == "acme", resp.text
    finally:
        srv.stop()
    # Now that it exists, no --create is needed.
    again = run_cli("project", "create", "beta", "--store", store, env=clean_env())
    assert again.returncode == 0, again.stderr


def test_project_create_refuses_a_postgresql_database_without_fencepost(tmp_path: Path) -> None:
    from pg_support import temporary_database

    with temporary_database() as url:
        refused = run_cli("project", "create", "acme", "--store", url, env=clean_env(),
                          cwd=tmp_path)
        assert_one_line_refusal(refused, "--create")
        assert not (tmp_path / "fencepost.acme.admin-key").exists()
        import psycopg

        with psycopg.connect(url) as conn:
            tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                                  ).fetchone()
        assert tables == (0,), "the refused command created tables"

        created = run_cli("project", "create", "acme", "--store", url, "--create",
                          env=clean_env(), cwd=tmp_path)
        assert created.returncode == 0, created.stderr
        key = created.stdout.strip()
        # No database beside which to save it: the current folder.
        saved = tmp_path / "fencepost.acme.admin-key"
        assert saved.read_text() == key + "\n" and str(saved) in created.stderr
        srv = ServerProcess(tmp_path / "pg", store=url).start()
        try:
            resp = whoami(srv.base_url, key)
            assert resp.status_code == 200 and resp.json()["project"] == "acme", resp.text
        finally:
            srv.stop()


def test_project_create_on_a_missing_or_unreachable_postgresql_is_one_line(
        tmp_path: Path) -> None:
    import pg_support

    name = f"fencepost_test_missing_{new_token()[:8]}"
    for store, needle in [(pg_support.database_url(name), name),
                          (f"postgresql://fp:s3cret-pw@127.0.0.1:{free_port()}/fp", "PostgreSQL")]:
        for extra in ([], ["--create"]):
            result = run_cli("project", "create", "acme", "--store", store, *extra,
                             env=clean_env(), cwd=tmp_path)
            line = assert_one_line_refusal(result, needle)
            assert "s3cret-pw" not in line
    with pg_support._admin_connection() as admin:
        assert admin.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             (name,)).fetchone() is None, "the database was created"
