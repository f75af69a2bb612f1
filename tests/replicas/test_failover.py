"""Failover to a standby that was behind (SPEC §6 "Highly available
PostgreSQL", §7.9): no fencing token is issued twice or at or below one
already answered for that lock, whether fencepost reconnects by itself or is
restarted on the promoted standby.

A primary and an asynchronous standby of the test's own (tests/pg_private.py),
the standby streaming through a relay that the test holds, so that the
standby is really behind (the primary goes on committing grants the standby
never receives) when the primary is killed and the standby promoted. The
standby's clock runs 30 minutes behind the primary's (libfaketime): the
token floor of a reconnection must not rest on the two clocks agreeing.

Expiry is judged by the database's clock (SPEC §2), so on the promoted
standby a lease whose release it never received stays live for the clocks'
difference as well as its TTL: after the failover the load takes fresh
locks. Every lock draws from one token sequence, so a token issued again
shows as a token granted twice on any two locks.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from grants import LockLoad
from pg_private import PrivatePostgres

from replicas.standby_pair import Pair
from support import (
    WAKE_UPS_ONLY,
    ServerProcess,
    lock_headers,
    new_token,
    wait_until,
)


def _servers(tmp_path: Path, url: str, names: tuple[str, ...]) -> list[ServerProcess]:
    return [ServerProcess(tmp_path / name, store=url, extra_args=["--store-timeout", "2"]).start()
            for name in names]


def _lagged_failover(pair: Pair, load: LockLoad) -> float:
    """Run the load, hold the standby back while grants go on, fail over;
    return when the standby was promoted."""
    load.start()
    load.wait_for_grants(50, after=0, timeout_s=30)
    pair.relay.hold()
    held_at = time.monotonic()
    load.wait_for_grants(300, after=held_at, timeout_s=60)  # none of these reach the standby
    pair.fail_over()
    load.switch_keys([f"{key}-after" for key in load.keys])
    return time.monotonic()


def test_failover_to_a_lagging_standby_reissues_no_token(pair: Pair, tmp_path: Path) -> None:
    servers = _servers(tmp_path, pair.url, ("a", "b"))
    load = LockLoad(servers, [f"failover-{i}" for i in range(8)], workers=6)
    try:
        promoted = _lagged_failover(pair, load)
        # Service resumes without a restart, on the promoted standby.
        load.wait_for_grants(200, after=promoted + 0.5, timeout_s=60)
    finally:
        load.stop()
        for server in servers:
            server.stop()
    assert pair.relay.dropped > 64 * 1024, "the standby was not behind"
    violations = load.violations(exclusive=False)
    assert not violations, violations[:10]
    assert not load.transport_errors, load.transport_errors[:5]
    # The servers said what happened: a database they did not last write to.
    said = "".join(server.stderr_path.read_text() for server in servers)
    assert "did not last write to" in said, said[-3000:]
    print(f"\nfailover: {len(load.grants)} grants, statuses {dict(load.statuses)}, "
          f"errors {dict(load.errors)}, slowest request {load.slowest_s:.2f} s, "
          f"standby missed {pair.relay.dropped} bytes")


def test_restart_on_the_promoted_standby_reissues_no_token(pair: Pair, tmp_path: Path) -> None:
    servers = _servers(tmp_path, pair.url, ("a",))
    load = LockLoad(servers, [f"restart-{i}" for i in range(4)], workers=4)
    try:
        _lagged_failover(pair, load)
        load.stop()
        before = list(load.grants)
        servers[0].stop()
        # A new process, which never read the old primary, on the promoted standby
        # (its clock 30 minutes behind the old primary's).
        servers = _servers(tmp_path, pair.url, ("b",))
        after = LockLoad(servers, [f"restart-{i}-again" for i in range(4)], workers=4)
        after.grants = before
        after.start()
        after.wait_for_grants(100, after=time.monotonic(), timeout_s=60)
        after.stop()
    finally:
        for server in servers:
            server.stop()
    violations = after.violations(exclusive=False)
    assert not violations, violations[:10]


def test_paused_database_answers_503_within_the_store_timeout(pair: Pair,
                                                             tmp_path: Path) -> None:
    (server,) = _servers(tmp_path, pair.url, ("a",))
    try:
        with server.client(timeout=30) as client:
            token = new_token()
            assert client.put("/v1/locks/paused/lease", headers=lock_headers(token),
                              json={"ttl_seconds": 60}).status_code == 201
            pair.primary.pause()
            other = new_token()
            try:
                started = time.monotonic()
                resp = client.put("/v1/locks/other/lease", headers=lock_headers(other),
                                  json={"ttl_seconds": 60})
                took = time.monotonic() - started
                assert resp.status_code == 503, resp.text
                assert resp.json()["error"]["code"] == "store_unavailable"
                # The change was under way: a caller must not take the 503 for a refusal.
                assert resp.json()["error"]["outcome"] == "unknown"
                # --store-timeout 2, checked every 0.1 s; the slack is for a loaded machine.
                assert took < 2 + 1.5, f"answered after {took:.1f} s"
                ready = client.get("/readyz")
                assert ready.status_code == 503, ready.text
                # A renewal of the lease held before the pause: unknown outcome, 503.
                renewed = client.patch("/v1/locks/paused/lease", headers=lock_headers(token),
                                       json={"ttl_seconds": 60})
                assert renewed.status_code == 503
                # /livez never asks the store.
                assert client.get("/livez").status_code == 200
            finally:
                pair.primary.resume()
            # Service resumes by itself: the renewal, retried with the same token as a
            # client does after a 503, works, and the lock is still this token's
            # (nothing was lost or granted twice).
            wait_until(lambda: client.patch(
                "/v1/locks/paused/lease", headers=lock_headers(token),
                json={"ttl_seconds": 60}).status_code == 200, "the renewal", timeout=30)
            wait_until(lambda: client.get("/readyz").status_code == 200, "ready again",
                       timeout=30)
            taken = client.put("/v1/locks/paused/lease", headers=lock_headers(new_token()),
                               json={"ttl_seconds": 60})
            assert taken.status_code == 409
            # The acquire whose outcome was unknown, retried with its lock token: a
            # grant (201), or the grant it had made after all (200): one lease either way.
            retried = client.put("/v1/locks/other/lease", headers=lock_headers(other),
                                 json={"ttl_seconds": 60})
            assert retried.status_code in (200, 201), retried.text
            again = client.put("/v1/locks/other/lease", headers=lock_headers(other),
                               json={"ttl_seconds": 60})
            assert again.status_code == 200
            assert again.json()["fencing_token"] == retried.json()["fencing_token"]
    finally:
        server.stop()


def test_readyz_and_metrics_report_the_replication(pair: Pair, tmp_path: Path) -> None:
    (server,) = _servers(tmp_path, pair.url, ("a",))
    try:
        ready = httpx.get(f"{server.base_url}/readyz", timeout=10).json()
        assert ready["replication"] == {"mode": "async", "standbys": 1}
        scraped = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        assert 'fencepost_store_replication{mode="async"} 1.0' in scraped
        assert 'fencepost_store_replication{mode="sync"} 0.0' in scraped
        assert "fencepost_store_standbys 1.0" in scraped
        said = server.stderr_path.read_text()
        assert "store replication: async (1 standbys attached asynchronously)" in said, said
    finally:
        server.stop()


def test_require_sync_replication_refuses_changes_until_a_standby_confirms(
        pair: Pair, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "a", store=pair.url,
                           extra_args=["--require-sync-replication"])
    server.spawn()  # it serves, but is not ready: /readyz is 503 until a standby confirms
    try:
        wait_until(lambda: server.announced(), "serving", timeout=30)
        with server.client(timeout=30) as client:
            token = new_token()
            refused = client.put("/v1/locks/sync/lease", headers=lock_headers(token),
                                 json={"ttl_seconds": 60})
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store_not_replicated"
            assert client.get("/v1/locks/sync").json()["held"] is False  # nothing changed
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"]["code"] == "store_not_replicated"
            # The standby becomes synchronous: commits now wait for it.
            pair.primary.sql("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            pair.primary.sql("SELECT pg_reload_conf()")
            wait_until(lambda: client.put(
                "/v1/locks/sync/lease", headers=lock_headers(token),
                json={"ttl_seconds": 60}).status_code in (200, 201),
                "a change accepted with a synchronous standby", timeout=30)
            wait_until(lambda: client.get("/readyz").status_code == 200, "ready", timeout=30)
            assert client.get("/readyz").json()["replication"]["mode"] == "sync"
            # The standby goes away: commits would wait for ever; changes are refused
            # at once instead, and nothing changes.
            pair.standby.stop()
            wait_until(lambda: pair.primary.sql("SELECT count(*) FROM pg_stat_replication")
                       == [(0,)], "the standby gone", timeout=30)
            other = client.put("/v1/locks/sync-2/lease", headers=lock_headers(new_token()),
                               json={"ttl_seconds": 60})
            assert other.status_code == 503, other.text
            assert other.json()["error"]["code"] == "store_not_replicated"
            assert client.get("/v1/locks/sync-2").json()["held"] is False
            wait_until(lambda: client.get("/readyz").status_code == 503, "readyz off",
                       timeout=30)
    finally:
        server.stop()


def test_a_standby_alone_is_never_used(pair: Pair, tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "a", store=f"postgresql://postgres@127.0.0.1:{pair.standby.port}/postgres")
    server.spawn()
    assert server.proc is not None
    code = server.proc.wait(timeout=60)
    assert code != 0
    said = server.stderr_path.read_text()
    assert "standby" in said, said


def test_waiters_parked_through_an_outage_are_told_not_requeued(
        private_pg: PrivatePostgres, tmp_path: Path) -> None:
    """A database that stops answering for longer than a parked waiter's place
    lasts (10 s unrefreshed): each waiter gets a clear 503, never a silent trip
    to the back of the line once the database answers again. No safety wake
    (WAKE_UPS_ONLY): only the sweep that keeps places alive can notice."""
    server = ServerProcess(tmp_path / "a", store=private_pg.url, extra_env=WAKE_UPS_ONLY,
                           extra_args=["--store-timeout", "1"]).start()
    answers: dict[int, httpx.Response | str] = {}

    def wait_in_line(index: int) -> None:
        with server.client(timeout=60) as client:
            try:
                answers[index] = client.put(
                    "/v1/locks/outage-line/lease", headers=lock_headers(new_token()),
                    json={"ttl_seconds": 60, "wait_seconds": 120})
            except httpx.HTTPError as exc:
                answers[index] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=wait_in_line, args=(i,)) for i in range(3)]
    try:
        with server.client(timeout=30) as client:
            holder = new_token()
            assert client.put("/v1/locks/outage-line/lease", headers=lock_headers(holder),
                              json={"ttl_seconds": 120}).status_code == 201
            for thread in threads:
                thread.start()
            wait_until(lambda: client.get("/v1/locks/outage-line").json()["waiters"] == 3,
                       "three waiters in line", timeout=30)
            private_pg.pause()
            try:
                wait_until(lambda: len(answers) == 3, "every waiter answered", timeout=40)
            finally:
                private_pg.resume()
            for thread in threads:
                thread.join(timeout=30)
            for index, answer in answers.items():
                assert isinstance(answer, httpx.Response), answer
                assert answer.status_code == 503, (index, answer.text)
                assert answer.json()["error"]["code"] == "store_unavailable"
            # Nobody was left in line, and the lock is still the holder's.
            wait_until(lambda: client.get("/v1/locks/outage-line").status_code == 200,
                       "the store answers again", timeout=30)
            wait_until(lambda: client.get("/v1/locks/outage-line").json()["waiters"] == 0,
                       "the line empty", timeout=30)
            assert client.delete("/v1/locks/outage-line/lease",
                                 headers={"X-Lock-Token": holder}).json()["released"]
    finally:
        server.stop()


def test_a_stalled_synchronous_standby_answers_503_within_the_store_timeout(
        pair: Pair, tmp_path: Path) -> None:
    """Commits wait for a synchronous standby; frozen, it confirms none, and
    the primary waits with them (a cancel does not end that wait): callers get
    503 within the store timeout, and service resumes when the standby does."""
    pair.primary.sql("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
    pair.primary.sql("SELECT pg_reload_conf()")
    (server,) = _servers(tmp_path, pair.url, ("a",))
    try:
        with server.client(timeout=30) as client:
            wait_until(lambda: client.get("/readyz").json().get("replication", {}).get("mode")
                       == "sync", "sync replication seen", timeout=30)
            pair.standby.pause()
            try:
                started = time.monotonic()
                resp = client.put("/v1/locks/stalled/lease", headers=lock_headers(new_token()),
                                  json={"ttl_seconds": 60})
                took = time.monotonic() - started
                assert resp.status_code == 503, resp.text
                assert took < 2 + 1.5, f"answered after {took:.1f} s"
                wait_until(lambda: client.get("/readyz").status_code == 503, "readyz off",
                           timeout=5)
            finally:
                pair.standby.resume()
            wait_until(lambda: client.put(
                "/v1/locks/stalled-after/lease", headers=lock_headers(new_token()),
                json={"ttl_seconds": 60}).status_code == 201, "a grant again", timeout=60)
    finally:
        server.stop()
