"""`fencepost serve --workers 2`: the guarantees of SPEC §7 hold across the
worker processes behind one port, on SQLite and on PostgreSQL.

The kernel spreads connections over the workers (SO_REUSEPORT); each probe
answer names its worker (X-Fencepost-Worker), so a test opens connections
until it holds one on each worker it needs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from pg_support import temporary_database
from support import (
    WAKE_UPS_ONLY,
    ServerProcess,
    lock_headers,
    new_token,
    unique_name,
    wait_parked,
    wait_until,
    waited_ms,
)

WORKERS = 2
# SPEC §7.4: a dead replica's waiters leave every line within 1 s; counted
# here from after the release, well after the worker died.
GHOSTS_GONE_WITHIN_S = 2.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None  # ServerProcess's own SQLite file
        return
    with temporary_database() as url:
        yield url


@pytest.fixture
def workers(tmp_path: Path, store_url: str | None) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "server", store=store_url, workers=WORKERS).start()
    yield server
    server.stop()


@pytest.fixture
def wake_workers(tmp_path: Path, store_url: str | None) -> Iterator[ServerProcess]:
    """Workers whose waiters are granted only through wake-ups (no safety
    wake, support.WAKE_UPS_ONLY)."""
    server = ServerProcess(tmp_path / "server", store=store_url, workers=WORKERS,
                           extra_env=WAKE_UPS_ONLY).start()
    yield server
    server.stop()


def worker_of(client: httpx.Client) -> int:
    response = client.get("/livez")
    assert response.status_code == 200, response.text
    return int(response.headers["x-fencepost-worker"])


def clients_on_every_worker(server: ServerProcess, count: int = WORKERS) -> dict[int, httpx.Client]:
    """One open client (one connection) on each worker."""
    found: dict[int, httpx.Client] = {}
    for _ in range(400):
        client = server.client()
        number = worker_of(client)
        if number in found:
            client.close()
        else:
            found[number] = client
        if len(found) == count:
            return found
    for client in found.values():
        client.close()
    raise AssertionError(f"connections reached only workers {sorted(found)}")


def acquire(c: httpx.Client, key: str, token: str, ttl: int = 60, request_id: str | None = None,
            **body: Any) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token, request_id),
                 json={"ttl_seconds": ttl, **body})


def release(c: httpx.Client, key: str, token: str) -> httpx.Response:
    return c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})


def waiters(c: httpx.Client, key: str) -> int:
    return int(c.get(f"/v1/locks/{key}").json()["waiters"])


def worker_pids(server: ServerProcess) -> list[int]:
    assert server.proc is not None
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(server.proc.pid)],
                         capture_output=True, text=True, check=False)
    return [int(pid) for pid in out.stdout.split()]


# --- one port, every worker -----------------------------------------------------


def test_every_worker_serves_and_the_start_is_announced_once(workers: ServerProcess) -> None:
    clients = clients_on_every_worker(workers)
    try:
        assert sorted(clients) == list(range(1, WORKERS + 1))
        for client in clients.values():
            assert client.get("/readyz").status_code == 200
            assert client.get("/v1/whoami").status_code == 200
    finally:
        for client in clients.values():
            client.close()
    err = workers.stderr_path.read_text()
    assert err.count("serving on") == 1, err
    assert f"({WORKERS} workers)" in err
    assert len(worker_pids(workers)) == WORKERS


# --- SPEC §3.1 and §7.1, §7.2 across workers ----------------------------------------


def test_a_waiter_on_one_worker_is_granted_when_another_worker_releases(
    wake_workers: ServerProcess,
) -> None:
    """The release on worker 1 wakes the waiter parked on worker 2 (SPEC §3.1).
    The workers have no safety wake (WAKE_UPS_ONLY): without the wake-up the
    waiter would wait its whole wait, granted only by its last try at the
    end of it, which the server's own measure of the wait shows."""
    clients = clients_on_every_worker(wake_workers)
    one, two = clients[1], clients[2]
    try:
        for round_ in range(3):
            key, holder, waiter = unique_name(f"wake{round_}"), new_token(), new_token()
            rid = str(uuid.uuid4())
            first = acquire(one, key, holder)
            assert first.status_code == 201, first.text
            granted: dict[str, Any] = {}

            def wait(key: str = key, waiter: str = waiter, granted: dict[str, Any] = granted,
                     rid: str = rid) -> None:
                granted["response"] = acquire(two, key, waiter, request_id=rid,
                                              wait_seconds=30)

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            wait_until(lambda key=key: waiters(one, key) == 1, "the waiter in line", 10)
            wait_parked(wake_workers, 1)
            assert release(one, key, holder).json() == {"released": True}
            thread.join(60)
            response = granted["response"]
            assert response.status_code == 201, response.text
            assert response.json()["fencing_token"] > first.json()["fencing_token"]
            assert waited_ms(wake_workers, rid) < 30_000, round_  # woken, not at its wait's end
    finally:
        for client in clients.values():
            client.close()


def test_a_fenced_counter_counts_every_grant_across_workers(workers: ServerProcess) -> None:
    """A counter that keeps the highest fencing token it has seen and refuses
    writes under a lower one (what fencing is for), incremented by clients on
    both workers that each take the lock, read, write and release. Mutual
    exclusion: no increment is lost; fencing: every write carries a higher
    token than the one before, so none is refused."""
    key = unique_name("counter")
    state = {"value": 0, "highest": 0, "refused": 0, "inside": 0, "overlaps": 0}
    guard = threading.Lock()
    rounds = 15
    seen_workers: set[int] = set()

    def writer() -> None:
        with workers.client() as c:
            with guard:
                seen_workers.add(worker_of(c))
            for _ in range(rounds):
                token = new_token()
                response = acquire(c, key, token, ttl=30, wait_seconds=60)
                assert response.status_code == 201, response.text
                fencing = response.json()["fencing_token"]
                with guard:
                    state["inside"] += 1
                    state["overlaps"] += state["inside"] > 1
                    seen = state["value"]
                time.sleep(0.002)  # the read-modify-write a lock protects
                with guard:
                    if fencing <= state["highest"]:
                        state["refused"] += 1
                    else:
                        state["highest"] = fencing
                        state["value"] = seen + 1
                    state["inside"] -= 1
                assert release(c, key, token).json() == {"released": True}

    threads = 8
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(writer) for _ in range(threads)]:
            future.result(timeout=120)
    assert seen_workers == set(range(1, WORKERS + 1)), seen_workers
    assert state["overlaps"] == 0
    assert state["refused"] == 0
    assert state["value"] == threads * rounds


def test_a_killed_workers_waiters_leave_the_line_and_it_is_restarted(
    workers: ServerProcess,
) -> None:
    """SPEC §7.4 for a worker: its parked waiters are a dead replica's."""
    clients = clients_on_every_worker(workers)
    one, two = clients[1], clients[2]
    key, holder = unique_name("ghost"), new_token()
    try:
        assert acquire(one, key, holder).status_code == 201
        before = set(worker_pids(workers))

        def park() -> None:
            try:
                acquire(two, key, new_token(), wait_seconds=60)
            except httpx.HTTPError:
                pass  # its worker was killed under it

        parked = threading.Thread(target=park, daemon=True)
        parked.start()
        wait_until(lambda: waiters(one, key) == 1, "the waiter in line", 10)
        os.kill(_pid_of_worker(workers, 2), signal.SIGKILL)  # the one serving `two`
        parked.join(10)
        assert release(one, key, holder).json() == {"released": True}
        took = wait_until(lambda: acquire(one, key, new_token()).status_code == 201,
                          "the lock, free of the dead worker's waiter", GHOSTS_GONE_WITHIN_S)
        assert took
        assert waiters(one, key) == 0
        wait_until(lambda: len(set(worker_pids(workers)) - before) == 1
                   and len(worker_pids(workers)) == WORKERS,
                   "a new worker in the dead one's place", 20)
        again = clients_on_every_worker(workers)
        for client in again.values():
            assert client.get("/readyz").status_code == 200
            client.close()
    finally:
        for client in clients.values():
            client.close()
    assert "starting it again" in workers.stderr_path.read_text()


def _pid_of_worker(server: ServerProcess, number: int) -> int:
    """A worker's process, by the name it gives itself (`fencepost-w<N>`)."""
    for pid in worker_pids(server):
        if Path(f"/proc/{pid}/comm").read_text().strip() == f"fencepost-w{number}":
            return pid
    raise AssertionError(f"no process is worker {number}")


def test_every_worker_notices_a_deleted_store_file(tmp_path: Path) -> None:
    """SPEC §7.8 in each worker: each watches the file for itself (its own
    write probe), so none keeps acknowledging into a file that is gone."""
    server = ServerProcess(tmp_path / "s", workers=WORKERS).start()
    clients = clients_on_every_worker(server)
    try:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{server.db_path}{suffix}").unlink(missing_ok=True)
        for number, client in clients.items():
            wait_until(lambda client=client: client.get("/readyz").status_code == 503,
                       f"worker {number}'s /readyz at 503", 10)
            refused = acquire(client, unique_name("lost"), new_token())
            assert refused.status_code == 503, (number, refused.text)
            assert refused.json()["error"]["code"] == "store_unavailable"
            assert client.get("/livez").status_code == 200
    finally:
        for client in clients.values():
            client.close()
        server.stop()


# --- /metrics behind one port ---------------------------------------------------------


def sample(exposition: str, name: str, **labels: str) -> float:
    """One sample's value from a text exposition (0 when absent)."""
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                     if labels else "")
    for line in exposition.splitlines():
        series, _, value = line.rpartition(" ")
        if series == wanted:
            return float(value)
    return 0.0


def test_any_workers_metrics_count_every_workers_requests(workers: ServerProcess) -> None:
    """A scrape reaches one worker; it must answer for all of them."""
    clients = clients_on_every_worker(workers)
    key, holder = unique_name("metrics"), new_token()
    try:
        for number, client in clients.items():
            for _ in range(number + 2):  # 3 on worker 1, 4 on worker 2
                assert client.get("/v1/whoami").status_code == 200
        whoami = {"method": "GET", "route": "/v1/whoami", "status": "200"}
        for client in clients.values():
            text = client.get("/metrics").text
            assert sample(text, "fencepost_http_requests_total", **whoami) == 7, text
        # A waiter parked on worker 2 shows in worker 1's scrape.
        assert acquire(clients[1], key, holder).status_code == 201
        parked = threading.Thread(
            target=lambda: acquire(clients[2], key, new_token(), wait_seconds=30), daemon=True)
        parked.start()
        wait_until(
            lambda: sample(clients[1].get("/metrics").text, "fencepost_waiters_parked") == 1,
            "the parked waiter in worker 1's metrics", 10)
        assert release(clients[1], key, holder).json() == {"released": True}
        parked.join(30)
    finally:
        for client in clients.values():
            client.close()


# --- SPEC §6 --------------------------------------------------------------------------


def test_sigterm_answers_parked_waiters_on_every_worker_and_exits_0(
    workers: ServerProcess,
) -> None:
    clients = clients_on_every_worker(workers)
    key, holder = unique_name("drain"), new_token()
    answers: dict[int, httpx.Response] = {}
    try:
        assert acquire(clients[1], key, holder).status_code == 201

        def park(number: int) -> None:
            answers[number] = acquire(clients[number], key, new_token(), wait_seconds=60)

        threads = [threading.Thread(target=park, args=(n,), daemon=True) for n in clients]
        for thread in threads:
            thread.start()
        wait_until(lambda: waiters(clients[1], key) == WORKERS, "a waiter from each worker", 10)
        assert workers.terminate() == 0
        for thread in threads:
            thread.join(15)
        for number, response in answers.items():
            assert response.status_code == 503, (number, response.text)
            assert response.json()["error"]["code"] == "shutting_down"
        assert sorted(answers) == list(range(1, WORKERS + 1))
        assert worker_pids(workers) == []
    finally:
        for client in clients.values():
            client.close()


def test_readyz_turns_503_on_every_worker_during_the_drain(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "s", workers=WORKERS,
                           extra_args=["--drain-seconds", "30"]).start()
    clients = clients_on_every_worker(server)
    try:
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGTERM)  # the supervisor alone, as systemd does
        for client in clients.values():
            wait_until(lambda client=client: client.get("/readyz").status_code == 503,
                       "/readyz at 503", 10)
            assert client.get("/livez").status_code == 200
        os.kill(server.proc.pid, signal.SIGTERM)  # a second one ends the drain
        assert server.proc.wait(20) == 0
    finally:
        for client in clients.values():
            client.close()
        server.stop()


# --- start-up tells the truth -----------------------------------------------------------


def test_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _serve(tmp_path, "--port", str(port))
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert out.stderr.startswith(f"fencepost: cannot listen on 127.0.0.1:{port}")
    assert not (tmp_path / "fencepost.db").exists()


def test_a_store_in_a_missing_folder_is_one_line_and_exit_1(tmp_path: Path) -> None:
    out = _serve(tmp_path, "--port", "0", "--store", f"sqlite:///{tmp_path}/nowhere/x.db")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencepost: cannot start:"), out.stderr
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("value", ["0", "-1", "257", "two", "1.5", ""])
def test_a_bad_worker_count_is_a_usage_error(tmp_path: Path, value: str) -> None:
    out = _serve(tmp_path, "--port", "0", workers=value)
    assert out.returncode == 2, out.stderr
    assert "--workers" in out.stderr
    assert not (tmp_path / "fencepost.db").exists()


def test_cores_is_one_worker_per_core_this_process_may_use() -> None:
    from fencepost.cli.server import WorkerCount
    from fencepost.server.cores import cpu_quota

    if cpu_quota() is None:  # this test's own process runs without a CPU quota
        assert WorkerCount().convert("cores", None, None) == len(os.sched_getaffinity(0))
    assert WorkerCount().convert(" 3 ", None, None) == 3


def _cpu_cgroup_v1() -> Path | None:
    """A cgroup-v1 CPU hierarchy this test may make cgroups in (root on a
    machine that mounts one), or None."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if len(after) >= 3 and after[0] == "cgroup" and "cpu" in after[2].split(","):
            mount = Path(fields[4])
            if os.access(mount, os.W_OK):
                return mount
    return None


@pytest.mark.parametrize("quota_cores,expected", [(0.5, 1), (1.5, 2)])
def test_cores_counts_a_cpu_quota(tmp_path: Path, quota_cores: float, expected: int) -> None:
    """`--workers cores` in a cgroup whose CPU quota is less than the cores the
    process sees (a container run with `--cpus`): one worker per core of the
    quota, rounded up, not one per visible core."""
    hierarchy = _cpu_cgroup_v1()
    if hierarchy is None:
        pytest.skip("no writable cgroup-v1 CPU hierarchy to set a quota in (needs root)")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two visible cores to tell a quota from the affinity")
    group = hierarchy / f"fencepost-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    server = ServerProcess(
        tmp_path / "server", extra_args=["--workers", "cores"],
        # Joins the cgroup, then becomes the server: everything it starts is inside.
        command_prefix=["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group)],
    )
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(quota_cores * 100000)))
        server.start()
        wait_until(server.announced, "the serving line", timeout=20)
        line = next(text for text in server.stderr_path.read_text().splitlines()
                    if "serving on" in text)
        if expected == 1:
            assert "workers)" not in line, line
        else:
            assert f"({expected} workers)" in line, line
    finally:
        server.stop()
        group.rmdir()


def test_metrics_folders_of_killed_supervisors_are_removed(tmp_path: Path) -> None:
    """A supervisor killed by kill -9 cannot remove its metrics folder; the
    next one to start does."""
    import tempfile

    from fencepost.server.workers import new_metrics_dir

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = Path(tempfile.mkdtemp(prefix=f"fencepost-metrics-{gone.stdout.strip()}-"))
    live = Path(tempfile.mkdtemp(prefix=f"fencepost-metrics-{os.getppid()}-"))
    made = Path(new_metrics_dir())
    try:
        assert not stale.exists()
        assert live.exists() and made.is_dir()
        assert made.name.startswith(f"fencepost-metrics-{os.getpid()}-")
    finally:
        for folder in (stale, live, made):
            if folder.exists():
                folder.rmdir()


def _serve(
    tmp_path: Path, *args: str, workers: str = str(WORKERS)
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencepost", "serve", "--workers", workers, *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "FENCEPOST_BOOTSTRAP_KEY": "k" * 40},
    )
