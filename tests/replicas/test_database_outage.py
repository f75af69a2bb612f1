"""A PostgreSQL outage: replicas fail fast with 503, never hang or double-grant,
and recover by themselves when the database returns (SPEC §6, §7).

Runs its own PostgreSQL cluster (initdb in a temporary folder, as the `postgres`
user) so that stopping it disturbs nothing else.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
from pg_private import PrivatePostgres

from support import ServerProcess, lock_headers, new_token


def wait_healthy(replica: ServerProcess, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{replica.base_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{replica.base_url} did not recover")


def test_postgres_crash_under_load(private_pg: PrivatePostgres, tmp_path: Path) -> None:
    replicas = [ServerProcess(tmp_path / n, store=private_pg.url).start() for n in ("a", "b")]
    try:
        keys = ["outage-1", "outage-2", "outage-3"]
        grants: list[tuple[str, int, float]] = []  # (key, fencing token, when)
        violations: list[str] = []
        slowest = [0.0]
        statuses: dict[int, int] = defaultdict(int)
        stop = threading.Event()
        lock = threading.Lock()

        transport_errors: list[str] = []

        def failed(exc: httpx.HTTPError, started: float) -> None:
            with lock:
                slowest[0] = max(slowest[0], time.monotonic() - started)
                transport_errors.append(f"{type(exc).__name__}: {exc}")

        def worker(index: int) -> None:
            replica = replicas[index % 2]
            key = keys[index % 3]
            with replica.client(timeout=15) as client:
                while not stop.is_set():
                    token = new_token()
                    started = time.monotonic()
                    try:
                        resp = client.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                                          json={"ttl_seconds": 30})
                    except httpx.HTTPError as exc:
                        # A request that hit the client's timeout hung: counted, not skipped.
                        failed(exc, started)
                        continue
                    with lock:
                        slowest[0] = max(slowest[0], time.monotonic() - started)
                        statuses[resp.status_code] += 1
                    if resp.status_code != 201:
                        time.sleep(0.02)
                        continue
                    fencing = resp.json()["fencing_token"]
                    with lock:
                        grants.append((key, fencing, time.monotonic()))
                    # While we hold it, nobody else may: the lock shows our token.
                    started = time.monotonic()
                    try:
                        seen = client.get(f"/v1/locks/{key}")
                    except httpx.HTTPError as exc:
                        failed(exc, started)
                        continue
                    if seen.status_code == 200 and seen.json()["fencing_token"] != fencing:
                        violations.append(f"{key}: held {fencing}, server shows {seen.json()}")
                    while not stop.is_set():
                        started = time.monotonic()
                        try:
                            done = client.delete(f"/v1/locks/{key}/lease",
                                                 headers={"X-Lock-Token": token})
                        except httpx.HTTPError as exc:
                            failed(exc, started)
                            continue
                        with lock:
                            slowest[0] = max(slowest[0], time.monotonic() - started)
                        if done.status_code == 200:
                            break
                        time.sleep(0.05)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(2)
        before_crash = len(grants)
        private_pg.crash()
        crashed_at = time.monotonic()
        time.sleep(0.5)
        health = httpx.get(f"{replicas[0].base_url}/healthz", timeout=10)
        assert health.status_code == 503
        assert health.json()["error"]["code"] == "store_unavailable"
        # The metrics still answer, and say the store is down (the alert's signal).
        scraped = httpx.get(f"{replicas[0].base_url}/metrics", timeout=10)
        assert scraped.status_code == 200
        assert "\nfencepost_store_up 0.0\n" in scraped.text, scraped.text[-2000:]
        time.sleep(1.5)
        private_pg.start()
        for replica in replicas:
            wait_healthy(replica)
            scraped = httpx.get(f"{replica.base_url}/metrics", timeout=10)
            assert "\nfencepost_store_up 1.0\n" in scraped.text
        recovered_at = time.monotonic()
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join(timeout=30)

        assert not violations, violations
        assert statuses[503] > 0, dict(statuses)  # the outage was seen, and answered
        assert slowest[0] < 10, f"a request hung for {slowest[0]:.1f} s"
        # Every request got an HTTP answer: the replicas stayed up and answered 503
        # through the outage, never dropping a connection or leaving it unanswered.
        assert not transport_errors, transport_errors[:5]
        assert before_crash > 0 and any(when > recovered_at for _, _, when in grants), (
            "no grants after recovery without restarting the replicas")
        tokens = [fencing for _, fencing, _ in grants]
        assert len(tokens) == len(set(tokens)), "a fencing token was issued twice"
        for key in keys:
            mine = [fencing for k, fencing, _ in sorted(grants, key=lambda g: g[2]) if k == key]
            assert mine == sorted(mine), f"{key}: tokens went backwards {mine}"
        before = max(f for _, f, when in grants if when < crashed_at)
        after = [f for _, f, when in grants if when > recovered_at]
        assert min(after) > before
    finally:
        for replica in replicas:
            replica.stop()


def test_replicas_starting_together_migrate_once(private_pg: PrivatePostgres,
                                                 tmp_path: Path) -> None:
    replicas = [ServerProcess(tmp_path / n, store=private_pg.url) for n in ("a", "b", "c")]
    errors: list[BaseException] = []

    try:
        for replica in replicas:  # all three start at once: none waits for another
            replica.spawn()
        for replica in replicas:
            try:
                replica.wait_ready(60)
            except RuntimeError as exc:
                errors.append(exc)
        assert not errors, errors
        keys = []
        for replica in replicas:
            with replica.client() as client:
                keys = client.get("/v1/keys", params={"limit": "1000"}).json()["keys"]
        assert len(keys) == 1  # bootstrapped exactly once
    finally:
        for replica in replicas:
            replica.stop()
