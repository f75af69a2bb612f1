"""SPEC §4.2 slot acquisition over HTTP: grants, fail-fast refusals, the bound on live slots,
the fair wait line (wait_ms / X-Queue-Timeout-Ms / X-No-Queue, clamping, queue_size),
disconnected waiters, deleting a pool under its waiters, and the access log."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from pool_support import pool_state, release, renew
from support import (
    ServerProcess,
    assert_error,
    detail_fields,
    unique_name,
    wait_for,
    wait_parked,
    waited_ms,
)

SLOT_ID = re.compile(r"^slot_[A-Za-z0-9_-]{32}$")


# --- helpers ---------------------------------------------------------------------------------


def make_pool(c: httpx.Client, **config: Any) -> str:
    name = unique_name("pool")
    config.setdefault("limit", 1)
    resp = c.put(f"/v1/pools/{name}", json=config)
    assert resp.status_code == 201, resp.text
    return name


def acquire(c: httpx.Client, pool: str, body: Any = None, headers: dict[str, str] | None = None
            ) -> httpx.Response:
    kwargs: dict[str, Any] = {"headers": headers or {}}
    if body is not None:
        kwargs["json"] = body
    return c.post(f"/v1/pools/{pool}/lock/acquire", **kwargs)


def grab(c: httpx.Client, pool: str) -> dict[str, Any]:
    resp = acquire(c, pool)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def waited_for(c: httpx.Client, server: ServerProcess, pool: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[httpx.Response, int]:
    """An acquire, and how long the server kept it (ms, on the server's clock:
    its access-log line), which a test compares with the wait the request
    chose rather than with a guess at how fast the machine is."""
    rid = str(uuid.uuid4())
    resp = acquire(c, pool, body, headers={"X-Request-Id": rid, **(headers or {})})
    return resp, waited_ms(server, rid)


def assert_waited(resp: httpx.Response, waited: int, wait_ms: int) -> None:
    """A 504 after waiting exactly the wait `wait_ms` (the one the server chose
    is the one its message names, and it kept the request at least that long)."""
    err = assert_error(resp, 504, "queue_timeout")
    assert err["message"].startswith(f"Waited {wait_ms} ms"), err
    assert waited >= wait_ms, waited


@dataclass
class Waiter:
    name: str
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    thread: threading.Thread | None = None
    response: httpx.Response | None = None
    error: BaseException | None = None
    started_at: float = 0.0
    done_at: float = 0.0

    def join(self, timeout: float = 40.0) -> httpx.Response:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} still waiting"
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


def start_waiter(
    server: ServerProcess, api_key: str, pool: str, name: str, wait_ms: int,
    on_grant: Callable[[httpx.Client, Waiter], None] | None = None,
    headers: dict[str, str] | None = None,
) -> Waiter:
    waiter = Waiter(name=name)

    def run() -> None:
        try:
            with server.client(api_key) as c:
                waiter.started_at = time.monotonic()
                waiter.response = acquire(c, pool, {"wait_ms": wait_ms},
                                          headers={"X-Request-Id": waiter.request_id,
                                                   **(headers or {})})
                waiter.done_at = time.monotonic()
                if on_grant is not None and waiter.response.status_code == 200:
                    on_grant(c, waiter)
        except Exception as exc:  # surfaced by join()
            waiter.error = exc

    waiter.thread = threading.Thread(target=run, name=name, daemon=True)
    waiter.thread.start()
    return waiter


def queued(c: httpx.Client, pool: str) -> int:
    return int(pool_state(c, pool)["queued"])


@dataclass
class FullPool:
    """A pool of limit 1 whose one slot is held."""

    name: str
    slot: dict[str, Any]


@pytest.fixture
def full_pool(admin: httpx.Client, member: httpx.Client) -> FullPool:
    name = make_pool(admin, limit=1, request_timeout_ms=60_000)
    return FullPool(name, grab(member, name))


# --- grants ----------------------------------------------------------------------------------


def test_grant_body_and_headers(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=3, term_ms=4000, renew_interval_ms=700,
                     request_timeout_ms=9000)
    before_ms = time.time() * 1000
    resp = acquire(member, pool)
    after_ms = time.time() * 1000
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"slot_id", "lease_deadline", "request_deadline", "term_ms",
                         "renew_interval_ms"}, body
    assert SLOT_ID.match(body["slot_id"]), body
    assert body["term_ms"] == 4000
    assert body["renew_interval_ms"] == 700
    for f in ("lease_deadline", "request_deadline"):
        assert isinstance(body[f], int) and not isinstance(body[f], bool), body
    # Both deadlines are measured from one `now`.
    assert body["request_deadline"] - body["lease_deadline"] == 9000 - 4000
    # Epoch milliseconds (server and test share the machine's clock).
    assert before_ms - 1000 <= body["lease_deadline"] - 4000 <= after_ms + 1000
    assert resp.headers["X-Remaining-Slots"] == "2"
    assert resp.headers["X-Effective-Limit"] == "3"
    assert resp.headers["X-Queued-Ms"].isdigit()
    assert pool_state(admin, pool)["in_use"] == 1

    second = acquire(member, pool)
    assert second.status_code == 200
    assert second.headers["X-Remaining-Slots"] == "1"
    assert second.json()["slot_id"] != body["slot_id"]


def test_default_renew_interval_in_grant(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1)
    body = grab(member, pool)
    assert body["term_ms"] == 30_000
    assert body["renew_interval_ms"] == 10_000
    assert body["request_deadline"] - body["lease_deadline"] == 60_000 - 30_000


def test_lease_deadline_never_passes_request_deadline(admin: httpx.Client,
                                                      member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1, term_ms=30_000, request_timeout_ms=5000)
    body = grab(member, pool)
    assert body["lease_deadline"] <= body["request_deadline"]
    assert body["request_deadline"] - 5000 <= time.time() * 1000 + 1000


def test_slot_ids_are_distinct(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=50)
    ids = [grab(member, pool)["slot_id"] for _ in range(50)]
    assert len(set(ids)) == 50
    assert all(SLOT_ID.match(i) for i in ids)


def test_unknown_pool_is_404(server: ServerProcess, member: httpx.Client) -> None:
    name = unique_name("nope")
    assert_error(acquire(member, name), 404, "not_found")
    resp, waited = waited_for(member, server, name, {"wait_ms": 20_000})
    assert_error(resp, 404, "not_found")
    assert waited < 20_000  # refused at once, not after waiting the wait


def test_reader_may_not_acquire(server: ServerProcess, admin: httpx.Client,
                                reader_key: str) -> None:
    pool = make_pool(admin, limit=2)
    with server.client(reader_key) as reader:
        assert_error(acquire(reader, pool), 403, "forbidden")
        assert_error(acquire(reader, pool, {"wait_ms": 100}), 403, "forbidden")
    assert pool_state(admin, pool)["in_use"] == 0


def test_admin_may_acquire(admin: httpx.Client) -> None:
    pool = make_pool(admin, limit=1)
    assert acquire(admin, pool).status_code == 200


def test_other_project_cannot_acquire_from_the_pool(server: ServerProcess,
                                                    admin: httpx.Client) -> None:
    pool = make_pool(admin, limit=1)
    other = server.create_project(unique_name("proj"))
    with server.client(other) as c:
        assert_error(acquire(c, pool), 404, "not_found")
        assert_error(acquire(c, pool, {"wait_ms": 200}), 404, "not_found")
    assert pool_state(admin, pool)["in_use"] == 0
    assert acquire(admin, pool).status_code == 200


# --- fail fast and the bound -----------------------------------------------------------------


def test_fail_fast_when_full_is_429_with_retry_estimate(admin: httpx.Client,
                                                        member: httpx.Client) -> None:
    pool = make_pool(admin, limit=2, request_timeout_ms=20_000)
    first = grab(member, pool)
    time.sleep(0.05)
    grab(member, pool)
    before_ms = time.time() * 1000
    resp = acquire(member, pool)
    after_ms = time.time() * 1000
    err = assert_error(resp, 429, "too_many_requests")
    assert err["in_use"] == 2
    assert err["effective_limit"] == 2
    retry_ms = err["retry_after_ms"]
    assert isinstance(retry_ms, int) and retry_ms > 0, err
    # The time until the earliest held slot's request_deadline, from the
    # server's "now", which lies between the test's readings around the
    # request, however slow the answer (1 s for the server's clock, the wall
    # clock as read when it started, advanced by the steady clock since).
    deadline = first["request_deadline"]
    assert deadline - after_ms - 1000 <= retry_ms <= deadline - before_ms + 1000, (
        retry_ms, deadline - after_ms, deadline - before_ms)
    assert resp.headers["Retry-After"] == str(math.ceil(retry_ms / 1000))
    assert pool_state(admin, pool)["in_use"] == 2


async def test_48_concurrent_fail_fast_acquires_admit_exactly_3(
    server: ServerProcess, admin: httpx.Client, member_key: str,
) -> None:
    pool = make_pool(admin, limit=3)
    limits = httpx.Limits(max_connections=48, max_keepalive_connections=48)
    async with server.async_client(member_key, limits=limits) as c:
        # Open the connections first so the acquires themselves race.
        await asyncio.gather(*(c.get("/healthz") for _ in range(48)))
        gate = asyncio.Event()

        async def one() -> httpx.Response:
            await gate.wait()
            return await c.post(f"/v1/pools/{pool}/lock/acquire")

        tasks = [asyncio.create_task(one()) for _ in range(48)]
        await asyncio.sleep(0.05)
        gate.set()
        responses = await asyncio.gather(*tasks)

    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 3, statuses
    assert statuses.count(429) == 45, statuses
    granted = [r for r in responses if r.status_code == 200]
    assert len({r.json()["slot_id"] for r in granted}) == 3
    assert sorted(int(r.headers["X-Remaining-Slots"]) for r in granted) == [0, 1, 2]
    for r in responses:
        if r.status_code == 429:
            err = assert_error(r, 429, "too_many_requests")
            assert err["in_use"] == 3 and err["effective_limit"] == 3, err
    state = pool_state(admin, pool)
    assert state["in_use"] == 3
    assert state["queued"] == 0


def test_waiting_acquires_never_exceed_the_limit(
    server: ServerProcess, admin: httpx.Client, member_key: str,
) -> None:
    """12 holders contend with waits for a pool of 3: all get in, never more than 3 at once."""
    pool = make_pool(admin, limit=3)
    holding = 0
    most = 0
    count_lock = threading.Lock()

    def on_grant(c: httpx.Client, w: Waiter) -> None:
        nonlocal holding, most
        with count_lock:
            holding += 1
            most = max(most, holding)
        time.sleep(0.1)
        with count_lock:
            holding -= 1
        assert release(c, pool, w.response.json()["slot_id"]).json() == {"released": True}

    waiters = [start_waiter(server, member_key, pool, f"w{i}", 20_000, on_grant=on_grant)
               for i in range(12)]
    for w in waiters:
        assert w.join().status_code == 200, w.response.text if w.response else w.error
    assert most <= 3, most
    state = pool_state(admin, pool)
    assert state["in_use"] == 0 and state["queued"] == 0
    assert state["stats"]["released"] == 12


# --- the wait line ---------------------------------------------------------------------------


def test_waiters_are_admitted_in_arrival_order(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client, member_key: str,
) -> None:
    pool = make_pool(admin, limit=1)
    holder = grab(member, pool)
    order: list[str] = []
    order_lock = threading.Lock()

    def on_grant(c: httpx.Client, w: Waiter) -> None:
        with order_lock:
            order.append(w.name)
        time.sleep(0.1)
        assert release(c, pool, w.response.json()["slot_id"]).json() == {"released": True}

    line: list[Waiter] = []
    for i, name in enumerate(("w1", "w2", "w3", "w4"), start=1):
        line.append(start_waiter(server, member_key, pool, name, 20_000, on_grant=on_grant))
        assert wait_for(lambda n=i: queued(admin, pool) == n), f"{name} never got in line"
        time.sleep(0.03)

    assert release(member, pool, holder["slot_id"]).json() == {"released": True}
    responses = [w.join() for w in line]
    for r in responses:
        assert r.status_code == 200, r.text
        assert int(r.headers["X-Queued-Ms"]) > 0
    assert order == ["w1", "w2", "w3", "w4"]
    state = pool_state(admin, pool)
    assert state["in_use"] == 0 and state["queued"] == 0


def test_waiter_is_admitted_by_the_release(wake_server: ServerProcess) -> None:
    """The release wakes the parked waiter. The server has no safety wake
    (WAKE_UPS_ONLY): without the wake-up the waiter would wait its whole wait,
    admitted only by its last try at the end of it."""
    with wake_server.client() as admin:
        pool = make_pool(admin, limit=1)
        holder = grab(admin, pool)
        w = start_waiter(wake_server, wake_server.admin_key, pool, "w", 20_000)
        assert wait_for(lambda: queued(admin, pool) == 1)
        wait_parked(wake_server, 1)
        assert release(admin, pool, holder["slot_id"]).json() == {"released": True}
        resp = w.join()
        assert resp.status_code == 200, resp.text
        assert int(resp.headers["X-Queued-Ms"]) < 20_000  # woken, not at the end of its wait
        assert SLOT_ID.match(resp.json()["slot_id"])
        assert resp.headers["X-Remaining-Slots"] == "0"
        state = pool_state(admin, pool)
        assert state["in_use"] == 1 and state["queued"] == 0


def test_fail_fast_does_not_jump_the_line(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client, member_key: str,
) -> None:
    """While a waiter is in line, a slot that frees goes to it, not to a fail-fast caller."""
    pool = make_pool(admin, limit=1)
    holder = grab(member, pool)
    w = start_waiter(server, member_key, pool, "w", 20_000)
    assert wait_for(lambda: queued(admin, pool) == 1)
    assert release(member, pool, holder["slot_id"]).json() == {"released": True}
    resp = w.join()
    assert resp.status_code == 200, resp.text
    assert_error(acquire(member, pool), 429, "too_many_requests")


def test_a_grant_after_a_wait_has_the_configuration_it_was_admitted_under(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client, member_key: str,
) -> None:
    pool = make_pool(admin, limit=1, term_ms=30_000, request_timeout_ms=60_000)
    holder = grab(member, pool)
    w = start_waiter(server, member_key, pool, "w", 20_000)
    assert wait_for(lambda: queued(admin, pool) == 1)
    changed = {"term_ms": 12_000, "renew_interval_ms": 2_000}
    assert admin.patch(f"/v1/pools/{pool}", json=changed).status_code == 200
    assert release(member, pool, holder["slot_id"]).json() == {"released": True}
    resp = w.join()
    assert resp.status_code == 200, resp.text
    grant = resp.json()
    assert {k: grant[k] for k in changed} == changed
    assert grant["request_deadline"] - grant["lease_deadline"] == 60_000 - 12_000


def test_raising_the_limit_admits_waiters(wake_server: ServerProcess) -> None:
    """(The server has no safety wake: without the wake-up of the new limit
    the waiter would wait its whole wait.)"""
    with wake_server.client() as admin:
        pool = make_pool(admin, limit=1)
        grab(admin, pool)
        w = start_waiter(wake_server, wake_server.admin_key, pool, "w", 20_000)
        assert wait_for(lambda: queued(admin, pool) == 1)
        wait_parked(wake_server, 1)
        assert admin.put(f"/v1/pools/{pool}", json={"limit": 2}).status_code == 200
        resp = w.join()
        assert resp.status_code == 200, resp.text
        assert int(resp.headers["X-Queued-Ms"]) < 20_000  # woken, not at the end of its wait
        assert pool_state(admin, pool)["in_use"] == 2


# --- body / header / X-No-Queue precedence ---------------------------------------------------

# (body, headers, waits?) on a full pool: a wait ends in 504 after the wait; no wait is a 429
# at once.
PRECEDENCE: dict[str, tuple[Any, dict[str, str], bool]] = {
    "no-wait": (None, {}, False),
    "empty-body": ({}, {}, False),
    "body-zero": ({"wait_ms": 0}, {}, False),
    "body-wait": ({"wait_ms": 300}, {}, True),
    "header-wait": (None, {"X-Queue-Timeout-Ms": "300"}, True),
    "header-zero": (None, {"X-Queue-Timeout-Ms": "0"}, False),
    "header-with-empty-body": ({}, {"X-Queue-Timeout-Ms": "300"}, True),
    "body-zero-beats-header": ({"wait_ms": 0}, {"X-Queue-Timeout-Ms": "5000"}, False),
    "body-wait-beats-header-zero": ({"wait_ms": 300}, {"X-Queue-Timeout-Ms": "0"}, True),
    "body-wait-beats-long-header": ({"wait_ms": 300}, {"X-Queue-Timeout-Ms": "20000"}, True),
    "no-queue-1-body": ({"wait_ms": 5000}, {"X-No-Queue": "1"}, False),
    "no-queue-true-header": (None, {"X-Queue-Timeout-Ms": "5000", "X-No-Queue": "true"}, False),
    "no-queue-yes-both": ({"wait_ms": 5000},
                          {"X-Queue-Timeout-Ms": "5000", "X-No-Queue": "yes"}, False),
    "no-queue-any-word": ({"wait_ms": 5000}, {"X-No-Queue": "please"}, False),
    "no-queue-TRUE": ({"wait_ms": 5000}, {"X-No-Queue": "TRUE"}, False),
    "no-queue-0": ({"wait_ms": 300}, {"X-No-Queue": "0"}, True),
    "no-queue-false": ({"wait_ms": 300}, {"X-No-Queue": "false"}, True),
    "no-queue-no": ({"wait_ms": 300}, {"X-No-Queue": "no"}, True),
    "no-queue-off": ({"wait_ms": 300}, {"X-No-Queue": "off"}, True),
    "no-queue-FALSE": (None, {"X-Queue-Timeout-Ms": "300", "X-No-Queue": "FALSE"}, True),
    "no-queue-Off": ({"wait_ms": 300}, {"X-No-Queue": "Off"}, True),
}


@pytest.mark.parametrize("case", sorted(PRECEDENCE))
def test_wait_precedence(server: ServerProcess, member: httpx.Client, full_pool: FullPool,
                         case: str) -> None:
    body, headers, waits = PRECEDENCE[case]
    resp, waited = waited_for(member, server, full_pool.name, body, headers=headers)
    if waits:
        assert_waited(resp, waited, 300)  # the 300 ms of the table, whichever field won
    else:
        # Fail-fast: a request that waited in line would end in 504 queue_timeout.
        assert_error(resp, 429, "too_many_requests")
    assert pool_state(member, full_pool.name)["queued"] == 0


def test_no_queue_on_a_free_pool_still_grants(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1)
    resp = acquire(member, pool, {"wait_ms": 5000}, headers={"X-No-Queue": "1"})
    assert resp.status_code == 200, resp.text


def test_header_wait_is_admitted_when_a_slot_frees(
    admin: httpx.Client, member: httpx.Client, server: ServerProcess, member_key: str,
) -> None:
    pool = make_pool(admin, limit=1)
    holder = grab(member, pool)
    result: dict[str, httpx.Response] = {}

    def run() -> None:
        with server.client(member_key) as c:
            result["r"] = acquire(c, pool, headers={"X-Queue-Timeout-Ms": "20000"})

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert wait_for(lambda: queued(admin, pool) == 1)
    assert release(member, pool, holder["slot_id"]).json() == {"released": True}
    t.join(20)
    assert result["r"].status_code == 200, result["r"].text


# --- clamping and queue size -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["body", "header"])
def test_wait_is_clamped_to_queue_timeout(server: ServerProcess, admin: httpx.Client,
                                          member: httpx.Client, how: str) -> None:
    pool = make_pool(admin, limit=1, queue_timeout_ms=500)
    grab(member, pool)
    if how == "body":
        resp, waited = waited_for(member, server, pool, {"wait_ms": 10_000})
    else:
        resp, waited = waited_for(member, server, pool, headers={"X-Queue-Timeout-Ms": "10000"})
    assert_waited(resp, waited, 500)
    assert pool_state(admin, pool)["queued"] == 0


def test_queue_timeout_zero_means_fail_fast(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1, queue_timeout_ms=0)
    grab(member, pool)
    resp = acquire(member, pool, {"wait_ms": 5000})
    # Fail-fast: a request that waited in line would end in 504 queue_timeout.
    assert_error(resp, 429, "too_many_requests")


def test_queue_size_zero_means_fail_fast(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1, queue_size=0)
    grab(member, pool)
    for kwargs in ({"body": {"wait_ms": 5000}}, {"headers": {"X-Queue-Timeout-Ms": "5000"}}):
        resp = acquire(member, pool, **kwargs)
        # Fail-fast: a request that waited in line would end in 504 queue_timeout.
        err = assert_error(resp, 429, "too_many_requests")
        assert err["in_use"] == 1 and err["effective_limit"] == 1
    assert pool_state(admin, pool)["queued"] == 0


def test_full_queue_is_429(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client, member_key: str,
) -> None:
    pool = make_pool(admin, limit=1, queue_size=2)
    holder = grab(member, pool)

    def on_grant(c: httpx.Client, w: Waiter) -> None:
        time.sleep(0.05)
        release(c, pool, w.response.json()["slot_id"])

    line = []
    for i in (1, 2):
        line.append(start_waiter(server, member_key, pool, f"w{i}", 20_000, on_grant=on_grant))
        assert wait_for(lambda n=i: queued(admin, pool) == n)
    resp = acquire(member, pool, {"wait_ms": 5000})
    # Refused: a request that took a place in line would end in 200 or 504.
    err = assert_error(resp, 429, "too_many_requests")
    assert err["in_use"] == 1 and err["effective_limit"] == 1
    assert "Retry-After" in resp.headers
    assert queued(admin, pool) == 2  # the refused caller did not take a place

    assert release(member, pool, holder["slot_id"]).json() == {"released": True}
    for w in line:
        assert w.join().status_code == 200
    assert wait_for(lambda: pool_state(admin, pool)["in_use"] == 0)


# --- acquire input ---------------------------------------------------------------------------

BAD_WAIT_BODIES: dict[str, tuple[Any, str]] = {
    "negative": ({"wait_ms": -1}, "wait_ms"),
    "string": ({"wait_ms": "100"}, "wait_ms"),
    "float": ({"wait_ms": 1.5}, "wait_ms"),
    "bool": ({"wait_ms": True}, "wait_ms"),
    "object": ({"wait_ms": {}}, "wait_ms"),
    "unknown-field": ({"wait": 100}, "wait"),
    "typo-with-good": ({"wait_ms": 100, "wait_seconds": 1}, "wait_seconds"),
}


@pytest.mark.parametrize("case", sorted(BAD_WAIT_BODIES))
def test_bad_acquire_body_is_422(admin: httpx.Client, member: httpx.Client, case: str) -> None:
    pool = make_pool(admin, limit=1)
    body, field = BAD_WAIT_BODIES[case]
    err = assert_error(acquire(member, pool, body), 422, "validation_error")
    assert field in detail_fields(err), err
    assert pool_state(admin, pool)["in_use"] == 0


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "10ms", "1e3", "", "0x10", "+5",
                                   b"\xb2"])  # '²' in latin-1: a digit to str.isdigit
def test_malformed_queue_timeout_header_is_400(admin: httpx.Client, member: httpx.Client,
                                               value: str | bytes) -> None:
    pool = make_pool(admin, limit=1)
    resp = acquire(member, pool, headers={"X-Queue-Timeout-Ms": value})
    assert_error(resp, 400, "invalid_request")
    assert pool_state(admin, pool)["in_use"] == 0


@pytest.mark.parametrize("wait_ms", [10**12, 10**30])  # beyond 64 bits: still a wait
def test_huge_but_valid_wait_is_clamped(server: ServerProcess, admin: httpx.Client,
                                        member: httpx.Client, wait_ms: int) -> None:
    pool = make_pool(admin, limit=1, queue_timeout_ms=300)
    grab(member, pool)
    resp, waited = waited_for(member, server, pool, {"wait_ms": wait_ms})
    assert_waited(resp, waited, 300)


# --- deleting a pool under its waiters -------------------------------------------------------


def test_delete_pool_answers_waiters_404(wake_server: ServerProcess) -> None:
    """Every waiter is woken and answered 404 (the server has no safety wake:
    a waiter not woken would wait its whole wait first)."""
    with wake_server.client() as admin:
        pool = make_pool(admin, limit=1)
        grab(admin, pool)
        line = []
        for i in (1, 2, 3):
            line.append(start_waiter(wake_server, wake_server.admin_key, pool, f"w{i}", 20_000))
            assert wait_for(lambda n=i: queued(admin, pool) == n)
        wait_parked(wake_server, 3)
        resp = admin.delete(f"/v1/pools/{pool}")
        assert resp.status_code == 200 and resp.json() == {"deleted": True}
        for w in line:
            assert_error(w.join(), 404, "not_found")
            assert waited_ms(wake_server, w.request_id) < 20_000
        assert_error(admin.get(f"/v1/pools/{pool}"), 404, "not_found")


# --- disconnected waiters --------------------------------------------------------------------


def park_raw_waiter(server: ServerProcess, api_key: str, pool: str, request_id: str,
                    wait_ms: int = 20_000) -> socket.socket:
    body = json.dumps({"wait_ms": wait_ms}).encode()
    head = (
        f"POST /v1/pools/{pool}/lock/acquire HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {api_key}\r\n"
        f"X-Request-Id: {request_id}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(head + body)
    return sock


def hang_up(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def log_lines_for(server: ServerProcess, request_id: str) -> list[dict[str, Any]]:
    return [line for line in server.access_log_lines() if line.get("request_id") == request_id]


def test_disconnected_waiter_is_never_admitted(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client, member_key: str,
) -> None:
    pool = make_pool(admin, limit=1)
    holder = grab(member, pool)
    ghost_rid = str(uuid.uuid4())
    sock = park_raw_waiter(server, member_key, pool, ghost_rid)
    assert wait_for(lambda: queued(admin, pool) == 1), "raw waiter never got in line"
    hang_up(sock)
    # The server notices and takes the ghost out of line.
    assert wait_for(lambda: queued(admin, pool) == 0, timeout=3.0), pool_state(admin, pool)

    assert release(member, pool, holder["slot_id"]).json() == {"released": True}
    time.sleep(0.5)
    state = pool_state(admin, pool)
    assert state["in_use"] == 0, state
    assert state["stats"]["released"] == 1, state  # the ghost was never granted and let go
    # The free slot is there for the next live caller.
    assert acquire(member, pool).status_code == 200
    lines = log_lines_for(server, ghost_rid)
    assert [line["outcome"] for line in lines] == ["disconnected"], lines


def test_disconnected_waiter_is_skipped_for_the_next_in_line(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client, member_key: str,
) -> None:
    pool = make_pool(admin, limit=1)
    holder = grab(member, pool)
    ghost_rid = str(uuid.uuid4())
    sock = park_raw_waiter(server, member_key, pool, ghost_rid)
    assert wait_for(lambda: queued(admin, pool) == 1)
    live = start_waiter(server, member_key, pool, "live", 20_000)
    assert wait_for(lambda: queued(admin, pool) == 2)
    hang_up(sock)
    assert wait_for(lambda: queued(admin, pool) == 1, timeout=3.0), pool_state(admin, pool)

    assert release(member, pool, holder["slot_id"]).json() == {"released": True}
    resp = live.join()
    assert resp.status_code == 200, resp.text
    time.sleep(0.3)
    state = pool_state(admin, pool)
    assert state["in_use"] == 1 and state["queued"] == 0, state
    assert release(member, pool, resp.json()["slot_id"]).json() == {"released": True}
    assert pool_state(admin, pool)["in_use"] == 0
    assert "granted" not in [line["outcome"] for line in log_lines_for(server, ghost_rid)]


# --- access log ------------------------------------------------------------------------------


def test_every_acquire_attempt_is_logged_and_slot_ids_are_not(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client,
) -> None:
    pool = make_pool(admin, limit=1)
    rid = {k: str(uuid.uuid4()) for k in ("granted", "rejected", "timeout", "invalid",
                                          "unknown", "renew", "release", "bad_header")}
    granted = acquire(member, pool, headers={"X-Request-Id": rid["granted"]})
    assert granted.status_code == 200
    slot_id = granted.json()["slot_id"]
    assert acquire(member, pool, headers={"X-Request-Id": rid["rejected"]}).status_code == 429
    assert acquire(member, pool, {"wait_ms": 200},
                   headers={"X-Request-Id": rid["timeout"]}).status_code == 504
    assert acquire(member, pool, {"wait_ms": -1},
                   headers={"X-Request-Id": rid["invalid"]}).status_code == 422
    assert acquire(member, pool, headers={"X-Request-Id": rid["bad_header"],
                                          "X-Queue-Timeout-Ms": "x"}).status_code == 400
    assert acquire(member, unique_name("nope"),
                   headers={"X-Request-Id": rid["unknown"]}).status_code == 404
    assert member.post(f"/v1/pools/{pool}/lock/{slot_id}/renew",
                       headers={"X-Request-Id": rid["renew"]}).status_code == 200
    assert member.post(f"/v1/pools/{pool}/lock/{slot_id}/release",
                       headers={"X-Request-Id": rid["release"]}).json() == {"released": True}

    def by_rid() -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for line in server.access_log_lines():
            if line.get("request_id") in rid.values():
                out.setdefault(line["request_id"], []).append(line)
        return out

    assert wait_for(lambda: len(by_rid()) >= 6)
    lines = by_rid()
    expected = {"granted": ("granted", 200), "rejected": ("rejected", 429),
                "timeout": ("timeout", 504), "invalid": ("invalid", 422),
                "bad_header": ("invalid", 400)}
    for kind, (outcome, status) in expected.items():
        got = lines.get(rid[kind], [])
        assert len(got) == 1, (kind, got)
        line = got[0]
        assert line["event"] == "pool.acquire", line
        assert line["outcome"] == outcome, (kind, line)
        assert line["status"] == status, (kind, line)
        assert line["pool"] == pool, line
        assert isinstance(line.get("ts"), str) and line["ts"].endswith("Z"), line
        assert isinstance(line.get("waited_ms"), int) and line["waited_ms"] >= 0, line
        assert line.get("key_id"), line
        assert line.get("project"), line
    assert lines[rid["timeout"]][0]["waited_ms"] >= 150
    unknown = lines.get(rid["unknown"], [])
    assert len(unknown) == 1 and unknown[0]["status"] == 404, unknown
    assert unknown[0]["event"] == "pool.acquire"
    assert unknown[0]["outcome"] in {"invalid", "rejected"}, unknown
    # Renewals and releases write nothing.
    assert rid["renew"] not in lines
    assert rid["release"] not in lines
    # The slot id is a capability: it never appears in the log, nor do secrets.
    text = server.access_log.read_text()
    assert slot_id not in text
    assert slot_id[5:] not in text
    assert server.admin_key not in text


def test_log_has_no_slot_ids_after_many_grants(
    server: ServerProcess, admin: httpx.Client, member: httpx.Client, member_key: str,
) -> None:
    pool = make_pool(admin, limit=20)
    ids = [grab(member, pool)["slot_id"] for _ in range(20)]
    for s in ids[:10]:
        renew(member, pool, s)
        release(member, pool, s, json={"status": 200})
    text = server.access_log.read_text()
    for s in ids:
        assert s not in text
    assert member_key not in text
