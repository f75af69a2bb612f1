"""GET /metrics (SPEC §6): the Prometheus exposition of a real server, parsed with
prometheus_client's own parser, moves as real traffic says it must."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pg_support import temporary_database
from support import ServerProcess, lock_headers, new_token, unique_name, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: ServerProcess, **headers: str) -> Samples:
    resp = httpx.get(f"{server.base_url}/metrics", headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def acquire(c: httpx.Client, key: str, token: str, **body: Any) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                 json={"ttl_seconds": 30, **body})


@pytest.fixture
def metered(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "metered").start()
    yield server
    server.stop()


def test_counters_move_with_real_traffic(metered: ServerProcess) -> None:
    srv = metered
    reader = srv.create_key("reader")["key"]
    before = scrape(srv)
    held, freed, forced, short = (unique_name("m") for _ in range(4))
    with srv.client() as c:
        first, forced_token, short_token = new_token(), new_token(), new_token()
        assert acquire(c, held, first).status_code == 201
        assert acquire(c, held, new_token()).status_code == 409  # held: fail fast
        token = new_token()
        assert acquire(c, freed, token).status_code == 201
        assert c.request("DELETE", f"/v1/locks/{freed}/lease",
                         headers=lock_headers(token)).status_code == 200
        assert acquire(c, forced, forced_token).status_code == 201
        assert c.delete(f"/v1/locks/{forced}").status_code == 200
        lost = c.patch(f"/v1/locks/{forced}/lease", headers=lock_headers(forced_token),
                       json={"ttl_seconds": 30})
        assert lost.status_code == 409 and lost.json()["error"]["code"] == "lease_lost"
        assert acquire(c, short, short_token, ttl_seconds=5).status_code == 201
        assert c.get("/v1/whoami", headers={"Authorization": "Bearer nope"}).status_code == 401
        pool = unique_name("pool")
        assert c.put(f"/v1/pools/{pool}", json={"limit": 3}).status_code == 201
        slot = c.post(f"/v1/pools/{pool}/lock/acquire", json={})
        assert slot.status_code == 200, slot.text
        assert c.get("/no/such/route").status_code == 404
    with srv.client(reader) as r:
        assert r.put(f"/v1/pools/{unique_name('pool')}", json={"limit": 1}).status_code == 403

    during = scrape(srv)
    lease_route = {"method": "PUT", "route": "/v1/locks/{key}/lease"}
    assert delta(before, during, "fencepost_http_requests_total", **lease_route,
                 status="201") == 4
    assert delta(before, during, "fencepost_http_requests_total", **lease_route,
                 status="409") == 1
    assert delta(before, during, "fencepost_http_request_duration_seconds_count",
                 **lease_route) == 5
    assert delta(before, during, "fencepost_http_requests_total", method="other",
                 route="unmatched", status="404") == 1
    assert delta(before, during, "fencepost_acquires_total", kind="lock", outcome="granted") == 4
    assert delta(before, during, "fencepost_acquires_total", kind="lock", outcome="held") == 1
    assert delta(before, during, "fencepost_acquires_total", kind="slot", outcome="granted") == 1
    assert delta(before, during, "fencepost_acquire_wait_seconds_count", kind="lock") == 5
    assert delta(before, during, "fencepost_leases_granted_total", kind="lock") == 4
    assert delta(before, during, "fencepost_leases_granted_total", kind="slot") == 1
    assert delta(before, during, "fencepost_pool_admissions_total", project="default",
                 pool=pool) == 1
    assert delta(before, during, "fencepost_leases_ended_total", kind="lock",
                 reason="released") == 1
    assert delta(before, during, "fencepost_leases_ended_total", kind="lock",
                 reason="force_released") == 1
    assert delta(before, during, "fencepost_lease_held_seconds_count", kind="lock") == 2
    assert delta(before, during, "fencepost_leases_lost_total", reason="force_released") == 1
    assert delta(before, during, "fencepost_callers_refused_total", status="401") == 1
    assert delta(before, during, "fencepost_callers_refused_total", status="403") == 1
    assert delta(before, during, "fencepost_pool_changes_total", action="created") == 1
    assert delta(before, during, "fencepost_key_changes_total", action="created") == 0
    # The shared state, read from the store at scrape time.
    assert value(during, "fencepost_store_up") == 1
    assert value(during, "fencepost_leases_live", kind="lock") == 2  # held, short
    assert value(during, "fencepost_leases_live", kind="slot") == 1
    at_pool = {"project": "default", "pool": pool}
    assert value(during, "fencepost_pool_in_use", **at_pool) == 1
    assert value(during, "fencepost_pool_limit", **at_pool) == 3
    assert value(during, "fencepost_pool_effective_limit", **at_pool) == 3
    assert value(during, "fencepost_pool_queued", **at_pool) == 0
    assert value(during, "fencepost_pool_paused", **at_pool) == 0
    assert delta(before, during, "fencepost_store_batch_size_count", mode="write") > 0

    # The 5 s lease expires and the reaper ends it: counted as expired, and freed.
    def expired() -> bool:
        now = scrape(srv)
        return delta(before, now, "fencepost_leases_ended_total", kind="lock",
                     reason="expired") == 1
    wait_until(expired, "the reaper to end the 5 s lease", timeout=20.0)
    after = scrape(srv)
    assert delta(before, after, "fencepost_reaper_freed_total") >= 1
    assert delta(before, after, "fencepost_reaper_runs_total") >= 1
    assert value(after, "fencepost_leases_live", kind="lock") == 1

    # Low cardinality: no lock key, raw path or secret is ever a label value.
    text = httpx.get(f"{srv.base_url}/metrics", timeout=30).text
    for name in (held, freed, forced, short, "/no/such/route", first, srv.admin_key, reader):
        assert name not in text, name


def test_parked_waiters_are_a_gauge(metered: ServerProcess) -> None:
    srv = metered
    key = unique_name("line")
    with srv.client() as c:
        holder = new_token()
        assert acquire(c, key, holder).status_code == 201
    answers: list[int] = []

    def wait_in_line() -> None:
        with srv.client() as w:
            answers.append(acquire(w, key, new_token(), wait_seconds=30).status_code)

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    try:
        wait_until(lambda: value(scrape(srv), "fencepost_waiters_parked") == 1,
                   "the waiter to be parked", timeout=20.0)
    finally:
        with srv.client() as c:
            c.request("DELETE", f"/v1/locks/{key}/lease", headers=lock_headers(holder))
        waiter.join(timeout=30)
    assert answers == [201]
    after = scrape(srv)
    assert value(after, "fencepost_waiters_parked") == 0
    assert value(after, "fencepost_acquires_total", kind="lock", outcome="granted") == 2


def test_the_exposition_stays_parseable_with_odd_names_and_paths(metered: ServerProcess) -> None:
    srv = metered
    with srv.client() as c:
        for pool in ("a.b:c-d_e", "Z" * 128, "9"):
            assert c.put(f"/v1/pools/{pool}", json={"limit": 1}).status_code == 201
        for path in ('/v1/%22quoted%22', "/v1/locks/x/y/z", "/%E2%9C%93", "/v1/locks/\\n"):
            c.get(path)
        c.request("BREW", "/v1/locks")
    resp = httpx.get(f"{srv.base_url}/metrics", timeout=30)
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    pools = {s.labels["pool"] for s in families["fencepost_pool_limit"].samples}
    assert {"a.b:c-d_e", "Z" * 128, "9"} <= pools
    routes = {s.labels["route"] for s in families["fencepost_http_requests"].samples}
    assert all(r == "unmatched" or r.startswith("/") and "%" not in r for r in routes), routes
    methods = {s.labels["method"] for s in families["fencepost_http_requests"].samples}
    assert "BREW" not in methods
    # Every family follows the naming rules: the prefix, and counters end in _total.
    for family in families.values():
        assert family.name.startswith("fencepost_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name


def test_a_metrics_key_guards_the_route(tmp_path: Path) -> None:
    secret = "m" * 40
    srv = ServerProcess(tmp_path / "guarded", extra_args=["--metrics-key", secret]).start()
    try:
        assert httpx.get(f"{srv.base_url}/metrics", timeout=30).status_code == 401
        wrong = httpx.get(f"{srv.base_url}/metrics", timeout=30,
                          headers={"Authorization": f"Bearer {srv.admin_key}"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["code"] == "unauthorized"
        assert value(scrape(srv, Authorization=f"Bearer {secret}"), "fencepost_store_up") == 1
    finally:
        srv.stop()


def test_replicas_each_count_their_own_and_share_the_store_state(tmp_path: Path) -> None:
    with temporary_database() as url:
        a = ServerProcess(tmp_path / "a", store=url).start()
        b = ServerProcess(tmp_path / "b", store=url)
        try:
            b.start()
            pool = unique_name("shared")
            before_a, before_b = scrape(a), scrape(b)
            with a.client() as c:
                assert c.put(f"/v1/pools/{pool}", json={"limit": 2}).status_code == 201
                assert c.post(f"/v1/pools/{pool}/lock/acquire", json={}).status_code == 200
                assert acquire(c, unique_name("k"), new_token()).status_code == 201
            after_a, after_b = scrape(a), scrape(b)
            granted = {"kind": "lock"}
            assert delta(before_a, after_a, "fencepost_leases_granted_total", **granted) == 1
            assert delta(before_b, after_b, "fencepost_leases_granted_total", **granted) == 0
            at_pool = {"project": "default", "pool": pool}
            for seen in (after_a, after_b):  # the store's truth, the same from both
                assert value(seen, "fencepost_pool_in_use", **at_pool) == 1
                assert value(seen, "fencepost_leases_live", kind="lock") == 1
                assert value(seen, "fencepost_leases_live", kind="slot") == 1
        finally:
            b.stop()
            a.stop()


def test_pool_reports_and_rates_reach_the_pool_series(metered: ServerProcess) -> None:
    srv = metered
    pool, paced = unique_name("thr"), unique_name("rpm")
    at_pool = {"project": "default", "pool": pool}
    with srv.client() as c:
        assert c.put(f"/v1/pools/{pool}", json={"limit": 4}).status_code == 201
        assert c.put(f"/v1/pools/{paced}", json={"limit": 4, "rpm": 600}).status_code == 201
        for report in ({"status": 429}, {"status": 200, "throttled": 3}):
            slot = c.post(f"/v1/pools/{pool}/lock/acquire", json={}).json()["slot_id"]
            done = c.post(f"/v1/pools/{pool}/lock/{slot}/release", json=report)
            assert done.json() == {"released": True}, done.text
    seen = scrape(srv)
    assert value(seen, "fencepost_pool_reported_429_total", **at_pool) == 1
    assert value(seen, "fencepost_pool_reported_throttled_total", **at_pool) == 3
    assert value(seen, "fencepost_pool_released_total", **at_pool) == 2
    assert value(seen, "fencepost_pool_admissions_total", **at_pool) == 2
    assert value(seen, "fencepost_leases_ended_total", kind="slot", reason="released") == 2
    assert value(seen, "fencepost_lease_held_seconds_count", kind="slot") == 2
    # A rate is a gauge only where the pool has one.
    assert value(seen, "fencepost_pool_learned_rpm", project="default", pool=paced) == 600
    assert ("fencepost_pool_learned_rpm", frozenset(at_pool.items())) not in seen


def test_an_overdue_keep_lease_is_counted(metered: ServerProcess) -> None:
    """What the FencepostLockOverdue alert watches: a `keep` lease past its
    expiry, still held."""
    srv = metered
    with srv.client() as c:
        assert acquire(c, unique_name("keep"), new_token(), ttl_seconds=5,
                       on_expiry="keep").status_code == 201
    wait_until(lambda: value(scrape(srv), "fencepost_leases_overdue") == 1,
               "the keep lease to be overdue", timeout=20.0)
    assert value(scrape(srv), "fencepost_leases_live", kind="lock") == 1


@pytest.fixture(params=["sqlite", "postgresql"])
def metered_on(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own, on each backend."""
    if request.param == "sqlite":
        server = ServerProcess(tmp_path / "metered").start()
        yield server
        server.stop()
        return
    with temporary_database() as url:
        server = ServerProcess(tmp_path / "metered", store=url).start()
        try:
            yield server
        finally:
            server.stop()


def test_refusals_served_beside_good_renewals_replay_no_batch(metered_on: ServerProcess) -> None:
    """A refused renewal (wrong token, unknown or capped slot, unknown
    session) or force release is answered as a value inside its batch: the
    good renewals it shares batches with are not rolled back and run again."""
    srv = metered_on
    member = srv.create_key("member")["key"]
    with srv.client() as c:
        held = {unique_name("held"): new_token() for _ in range(4)}
        for key, token in held.items():
            assert acquire(c, key, token).status_code == 201
        pool = unique_name("pool")
        assert c.put(f"/v1/pools/{pool}", json={"limit": 8}).status_code == 201
        capped_pool = unique_name("capped")  # one term reaches the request deadline
        assert c.put(f"/v1/pools/{capped_pool}", json={
            "limit": 8, "term_ms": 60_000, "request_timeout_ms": 60_000,
        }).status_code == 201
        slots = [c.post(f"/v1/pools/{pool}/lock/acquire", json={}).json()["slot_id"]
                 for _ in range(4)]
        capped = c.post(f"/v1/pools/{capped_pool}/lock/acquire", json={}).json()["slot_id"]
    before = scrape(srv)
    replays = ("fencepost_store_batch_replays_total", frozenset({("mode", "write")}))
    assert replays in before  # shown at 0, not absent

    def good(c: httpx.Client, i: int) -> list[tuple[int, str | None]]:
        key = list(held)[i % len(held)]
        lease = c.patch(f"/v1/locks/{key}/lease", headers=lock_headers(held[key]),
                        json={"ttl_seconds": 30})
        slot = c.post(f"/v1/pools/{pool}/lock/{slots[i % len(slots)]}/renew")
        return [(lease.status_code, None), (slot.status_code, None)]

    def refused(c: httpx.Client, member_c: httpx.Client, i: int) -> list[tuple[int, str | None]]:
        key = list(held)[i % len(held)]
        answers = [
            c.patch(f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                    json={"ttl_seconds": 30}),
            c.post(f"/v1/pools/{pool}/lock/slot_{'u' * 32}/renew"),
            c.post(f"/v1/pools/{capped_pool}/lock/{capped}/renew"),
            c.patch(f"/v1/sessions/ses_{'v' * 32}", json={"ttl_seconds": 30}),
            member_c.delete(f"/v1/locks/{key}"),
        ]
        return [(a.status_code, a.json()["error"]["code"]) for a in answers]

    def worker(n: int, answers: list[tuple[int, str | None]]) -> None:
        with srv.client() as c, srv.client(member) as member_c:
            for i in range(12):
                answers += good(c, i) if (n + i) % 2 else refused(c, member_c, i)

    answered: list[list[tuple[int, str | None]]] = [[] for _ in range(8)]
    threads = [threading.Thread(target=worker, args=(n, answered[n])) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = scrape(srv)

    counts: dict[tuple[int, str | None], int] = {}
    for answer in (a for answers in answered for a in answers):
        counts[answer] = counts.get(answer, 0) + 1
    assert counts == {
        (200, None): 96,
        (409, "lease_lost"): 48, (404, "not_found"): 96, (409, "capped"): 48,
        (403, "forbidden"): 48,
    }, counts
    assert delta(before, after, "fencepost_store_batch_size_count", mode="write") > 0
    assert delta(before, after, "fencepost_store_batch_replays_total", mode="write") == 0
    with srv.client() as c:  # the good renewals held
        for key in held:
            assert c.get(f"/v1/locks/{key}").json()["held"] is True
