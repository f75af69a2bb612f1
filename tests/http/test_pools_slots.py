"""SPEC §4.3–§4.4 slot renewal and release over HTTP: renew, capped renewals, reclaim of an
unrenewed slot (§7.4), idempotent release, outcome reports (validated and counted in `stats`),
cross-project isolation (§7.6) and durability across a kill -9 (§7.3)."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
import pytest

from pool_support import acquire, make_pool, pool_state, release, renew
from support import ServerProcess, assert_error, detail_fields, parse_at, unique_name, wait_for

SLOT_ID = re.compile(r"^slot_[A-Za-z0-9_-]{32}$")
UNKNOWN_SLOT = "slot_" + "A" * 32


# --- helpers ---------------------------------------------------------------------------------


def now_ms() -> float:
    return time.time() * 1000


def grab(c: httpx.Client, pool: str) -> dict[str, Any]:
    resp = acquire(c, pool)
    assert resp.status_code == 200, resp.text
    body = dict(resp.json())
    assert SLOT_ID.match(body["slot_id"]), body
    return body


# --- renew -----------------------------------------------------------------------------------


def test_renew_extends_the_lease(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, term_ms=2000, request_timeout_ms=60_000)
    slot = grab(member, pool)
    time.sleep(0.3)
    before = now_ms()
    resp = renew(member, pool, slot["slot_id"])
    after = now_ms()
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"lease_deadline"}, body
    assert isinstance(body["lease_deadline"], int)
    assert body["lease_deadline"] > slot["lease_deadline"]
    assert before - 1000 <= body["lease_deadline"] - 2000 <= after + 1000
    assert body["lease_deadline"] <= slot["request_deadline"]
    # Renewing keeps the slot alive past its first term.
    time.sleep(2.0 - 0.3 + 0.2)
    assert pool_state(admin, pool)["in_use"] == 1
    assert renew(member, pool, slot["slot_id"]).status_code == 200


# (Whitespace alone is not JSON, and is refused: test_bad_input.py.)
@pytest.mark.parametrize("body", [b"", b"{}", b"  {}  ", b"\r\n{}\t"])
def test_renew_accepts_empty_body_or_empty_object(admin: httpx.Client, member: httpx.Client,
                                                  body: bytes) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    resp = renew(member, pool, slot["slot_id"], content=body,
                 headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("body,field", [
    ({"ttl_seconds": 30}, "ttl_seconds"),
    ({"term_ms": 5000}, "term_ms"),
    ({"lease_deadline": 1}, "lease_deadline"),
])
def test_renew_with_fields_is_422(admin: httpx.Client, member: httpx.Client,
                                  body: dict[str, Any], field: str) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    err = assert_error(renew(member, pool, slot["slot_id"], json=body), 422, "validation_error")
    assert field in detail_fields(err), err
    assert renew(member, pool, slot["slot_id"]).status_code == 200


@pytest.mark.parametrize("slot_id", [UNKNOWN_SLOT, "slot_" + "-_" * 16, "nope", "slot_", "slot_x",
                                     "slot_" + "A" * 31 + "!", "SLOT_" + "A" * 32, "12345"])
def test_renew_unknown_or_malformed_slot_is_404(admin: httpx.Client, member: httpx.Client,
                                                slot_id: str) -> None:
    pool = make_pool(admin)
    grab(member, pool)
    assert_error(renew(member, pool, slot_id), 404, "not_found")
    assert pool_state(admin, pool)["in_use"] == 1


def test_renew_released_slot_is_404(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    assert release(member, pool, slot["slot_id"]).json() == {"released": True}
    assert_error(renew(member, pool, slot["slot_id"]), 404, "not_found")


def test_renew_in_unknown_pool_is_404(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    assert_error(renew(member, unique_name("nope"), slot["slot_id"]), 404, "not_found")
    assert_error(release(member, unique_name("nope"), slot["slot_id"]), 404, "not_found")
    assert pool_state(admin, pool)["in_use"] == 1


def test_slot_of_another_pool_is_404(admin: httpx.Client, member: httpx.Client) -> None:
    pool_a = make_pool(admin)
    pool_b = make_pool(admin)
    slot = grab(member, pool_a)
    assert_error(renew(member, pool_b, slot["slot_id"]), 404, "not_found")
    assert_error(release(member, pool_b, slot["slot_id"]), 404, "not_found")
    assert pool_state(admin, pool_a)["in_use"] == 1
    assert pool_state(admin, pool_b)["stats"]["released"] == 0
    assert renew(member, pool_a, slot["slot_id"]).status_code == 200


def test_renewals_are_capped_at_request_deadline(admin: httpx.Client,
                                                 member: httpx.Client) -> None:
    """term 1 s, request timeout 2.5 s: renewals stop at request_deadline, then 409 capped,
    and the slot is gone by its request_deadline at the latest."""
    pool = make_pool(admin, limit=1, term_ms=1000, request_timeout_ms=2500)
    slot = grab(member, pool)
    request_deadline = slot["request_deadline"]
    deadlines = [slot["lease_deadline"]]
    capped = None
    for _ in range(40):
        time.sleep(0.25)
        resp = renew(member, pool, slot["slot_id"])
        if resp.status_code == 409:
            capped = resp
            break
        assert resp.status_code == 200, resp.text
        lease = resp.json()["lease_deadline"]
        assert lease <= request_deadline, (lease, request_deadline)
        assert lease >= deadlines[-1], (lease, deadlines)
        deadlines.append(lease)
    assert capped is not None, f"never capped: {deadlines}"
    assert_error(capped, 409, "capped")
    # The last successful renewal reached the request deadline exactly.
    assert deadlines[-1] == request_deadline, (deadlines, request_deadline)
    assert now_ms() < request_deadline + 1000  # capped while still live, not gone

    # Still held until request_deadline, then reclaimed (within about a second).
    assert wait_for(lambda: pool_state(admin, pool)["in_use"] == 0,
                    timeout=(request_deadline - now_ms()) / 1000 + 2.5)
    gone_at = now_ms()
    assert gone_at >= request_deadline - 300, (gone_at, request_deadline)
    assert_error(renew(member, pool, slot["slot_id"]), 404, "not_found")
    assert release(member, pool, slot["slot_id"]).json() == {"released": False}
    stats = pool_state(admin, pool)["stats"]
    assert stats["reclaimed"] == 1, stats
    assert stats["released"] == 0, stats
    assert acquire(member, pool).status_code == 200


def test_capped_slot_may_still_be_released(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1, term_ms=30_000, request_timeout_ms=1000)
    slot = grab(member, pool)
    # term > request timeout: the lease already ends at the request deadline.
    assert slot["lease_deadline"] == slot["request_deadline"]
    assert_error(renew(member, pool, slot["slot_id"]), 409, "capped")
    assert release(member, pool, slot["slot_id"]).json() == {"released": True}
    assert pool_state(admin, pool)["stats"]["released"] == 1


# --- reclaim ---------------------------------------------------------------------------------


def test_unrenewed_slot_is_reclaimed_after_lease_deadline(admin: httpx.Client,
                                                          member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1, term_ms=1000, request_timeout_ms=60_000)
    sent = time.monotonic()
    slot = grab(member, pool)
    answered = time.monotonic()  # the server decided in between: lease_deadline is 1 s after
    time.sleep(0.3)
    held = pool_state(admin, pool)
    if time.monotonic() < sent + 1.0:  # answered before its time (unless the machine crawls)
        assert held["in_use"] == 1, held  # not reclaimed before its time
    # SPEC §7.4: reclaimed within 1 s of lease_deadline, counted from the
    # latest the deadline can be (`answered` + the term) to when the next
    # request leaves, so a slow answer does not count against the server.
    time.sleep(max(0.0, answered + 1.0 + 1.5 - time.monotonic()))
    state = pool_state(admin, pool)
    assert state["in_use"] == 0, state
    assert state["stats"]["reclaimed"] == 1, state  # the reaper did it, nobody asked
    stats = state["stats"]
    assert stats["released"] == 0, stats
    assert_error(renew(member, pool, slot["slot_id"]), 404, "not_found")
    assert release(member, pool, slot["slot_id"]).json() == {"released": False}
    assert pool_state(admin, pool)["stats"]["released"] == 0
    assert acquire(member, pool).status_code == 200


def test_reclaim_admits_a_waiter(server: ServerProcess, admin: httpx.Client,
                                 member: httpx.Client, member_key: str) -> None:
    pool = make_pool(admin, limit=1, term_ms=1000, request_timeout_ms=60_000)
    vanished = grab(member, pool)
    result: dict[str, Any] = {}

    def run() -> None:
        with server.client(member_key) as c:
            result["resp"] = acquire(c, pool, json={"wait_ms": 10_000})
            result["at"] = now_ms()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert wait_for(lambda: pool_state(admin, pool)["queued"] == 1)
    t.join(15)
    assert not t.is_alive()
    resp = result["resp"]
    assert resp.status_code == 200, resp.text
    assert result["at"] <= vanished["lease_deadline"] + 1500, \
        result["at"] - vanished["lease_deadline"]
    assert resp.json()["slot_id"] != vanished["slot_id"]
    state = pool_state(admin, pool)
    assert state["in_use"] == 1 and state["queued"] == 0
    assert wait_for(lambda: pool_state(admin, pool)["stats"]["reclaimed"] == 1, timeout=3.0), \
        pool_state(admin, pool)


def test_renewed_slot_is_not_reclaimed(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1, term_ms=1000, request_timeout_ms=60_000)
    slot = grab(member, pool)
    for _ in range(6):
        time.sleep(0.3)
        assert renew(member, pool, slot["slot_id"]).status_code == 200
    state = pool_state(admin, pool)
    assert state["in_use"] == 1 and state["stats"]["reclaimed"] == 0
    assert release(member, pool, slot["slot_id"]).json() == {"released": True}


# --- release ---------------------------------------------------------------------------------


def test_release_is_idempotent(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=2)
    slot = grab(member, pool)
    other = grab(member, pool)
    assert pool_state(admin, pool)["in_use"] == 2
    first = release(member, pool, slot["slot_id"])
    assert first.status_code == 200 and first.json() == {"released": True}
    assert pool_state(admin, pool)["in_use"] == 1
    for _ in range(3):
        again = release(member, pool, slot["slot_id"], json={"status": 500})
        assert again.status_code == 200 and again.json() == {"released": False}
    state = pool_state(admin, pool)
    assert state["in_use"] == 1
    assert state["stats"]["released"] == 1, state["stats"]
    assert state["stats"]["statuses"]["5xx"] == 0, state["stats"]
    assert release(member, pool, other["slot_id"]).json() == {"released": True}
    assert pool_state(admin, pool)["stats"]["released"] == 2


def test_release_unknown_well_formed_slot_is_false(admin: httpx.Client,
                                                   member: httpx.Client) -> None:
    pool = make_pool(admin)
    resp = release(member, pool, UNKNOWN_SLOT)
    assert resp.status_code == 200 and resp.json() == {"released": False}
    assert pool_state(admin, pool)["stats"]["released"] == 0


@pytest.mark.parametrize("slot_id", ["nope", "slot_", "slot_x", "12345",
                                     "slot_" + "A" * 31 + "!"])
def test_release_malformed_slot_is_404(admin: httpx.Client, member: httpx.Client,
                                       slot_id: str) -> None:
    pool = make_pool(admin)
    grab(member, pool)
    assert_error(release(member, pool, slot_id), 404, "not_found")
    assert pool_state(admin, pool)["in_use"] == 1


def test_release_frees_the_slot_for_the_next_caller(admin: httpx.Client,
                                                    member: httpx.Client) -> None:
    pool = make_pool(admin, limit=1)
    slot = grab(member, pool)
    assert_error(acquire(member, pool), 429, "too_many_requests")
    assert release(member, pool, slot["slot_id"]).json() == {"released": True}
    assert acquire(member, pool).status_code == 200


def test_reader_may_not_renew_or_release(server: ServerProcess, admin: httpx.Client,
                                         member: httpx.Client) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    reader_key = server.create_key("reader", name="pool-slots-reader")["key"]
    with server.client(reader_key) as reader:
        assert_error(renew(reader, pool, slot["slot_id"]), 403, "forbidden")
        assert_error(release(reader, pool, slot["slot_id"]), 403, "forbidden")
    assert pool_state(admin, pool)["in_use"] == 1
    # Any member-or-better key of the slot's own project may act on it.
    assert release(admin, pool, slot["slot_id"]).json() == {"released": True}


# --- outcome reports and statistics ----------------------------------------------------------


def test_outcome_reports_are_counted(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin, limit=10)
    reports = [
        {"status": 200},
        {"status": 204, "rate": {"limit": 100, "remaining": 99, "reset_ms": 1000}},
        {"status": 101},
        {"status": 301},
        {"status": 429, "throttled": 3, "retry_after_ms": 1500},
        {"status": 404, "throttled": 0},
        {"status": 503, "retry_after_ms": 2500,
         "headers": {"Retry-After": "3", "x-ratelimit-remaining-requests": "0"}},
        {"throttled": 2},
        {},
    ]
    for report in reports:
        slot = grab(member, pool)
        resp = release(member, pool, slot["slot_id"], json=report)
        assert resp.status_code == 200 and resp.json() == {"released": True}, (report, resp.text)
    bare = grab(member, pool)
    assert release(member, pool, bare["slot_id"]).json() == {"released": True}

    stats = pool_state(admin, pool)["stats"]
    assert stats["released"] == len(reports) + 1, stats
    assert stats["statuses"] == {"1xx": 1, "2xx": 2, "3xx": 1, "4xx": 2, "5xx": 1}, stats
    assert stats["status_429"] == 1, stats
    assert stats["throttled"] == 5, stats
    assert stats["last_retry_after_ms"] == 2500, stats
    parse_at(stats["last_reported_at"])  # a time, in the `_at` format
    assert stats["reclaimed"] == 0


def test_release_without_report_leaves_outcome_stats_alone(admin: httpx.Client,
                                                           member: httpx.Client) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    assert release(member, pool, slot["slot_id"]).json() == {"released": True}
    stats = pool_state(admin, pool)["stats"]
    assert stats["released"] == 1
    assert stats["statuses"] == {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0}
    assert stats["status_429"] == 0 and stats["throttled"] == 0
    assert stats["last_retry_after_ms"] is None


def test_last_retry_after_is_the_last_reported(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin)
    for hint in (9000, 40, 0):
        slot = grab(member, pool)
        assert release(member, pool, slot["slot_id"],
                       json={"status": 429, "retry_after_ms": hint}).json() == {"released": True}
        assert pool_state(admin, pool)["stats"]["last_retry_after_ms"] == hint
    stats = pool_state(admin, pool)["stats"]
    assert stats["status_429"] == 3 and stats["statuses"]["4xx"] == 3


def test_report_on_a_gone_slot_is_not_counted(admin: httpx.Client, member: httpx.Client) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    assert release(member, pool, slot["slot_id"], json={"status": 200}).json() == \
        {"released": True}
    before = pool_state(admin, pool)["stats"]
    assert release(member, pool, slot["slot_id"],
                   json={"status": 429, "throttled": 7, "retry_after_ms": 1}).json() == \
        {"released": False}
    assert release(member, pool, UNKNOWN_SLOT, json={"status": 500}).json() == \
        {"released": False}
    assert pool_state(admin, pool)["stats"] == before


BAD_REPORTS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "status-99": ({"status": 99}, ("status",)),
    "status-600": ({"status": 600}, ("status",)),
    "status-0": ({"status": 0}, ("status",)),
    "status-negative": ({"status": -200}, ("status",)),
    "status-string": ({"status": "200"}, ("status",)),
    "status-float": ({"status": 200.5}, ("status",)),
    "status-bool": ({"status": True}, ("status",)),
    "throttled-negative": ({"throttled": -1}, ("throttled",)),
    "throttled-string": ({"throttled": "3"}, ("throttled",)),
    "throttled-float": ({"throttled": 1.5}, ("throttled",)),
    "retry_after_ms-negative": ({"retry_after_ms": -5}, ("retry_after_ms",)),
    # Beyond what the stores' 64-bit columns hold (a fuzzer's find: a 500).
    "retry_after_ms-huge": ({"retry_after_ms": 724518503532623319514742784},
                            ("retry_after_ms",)),
    "retry_after_ms-2^53": ({"retry_after_ms": 2**53}, ("retry_after_ms",)),
    "throttled-huge": ({"throttled": 2**63}, ("throttled",)),
    "throttled-over-a-million": ({"throttled": 1_000_001}, ("throttled",)),
    "rate-huge-limit": ({"rate": {"limit": 10**30}}, ("rate",)),
    "rate-huge-reset": ({"rate": {"reset_ms": 2**64}}, ("rate",)),
    "retry_after_ms-string": ({"retry_after_ms": "1000"}, ("retry_after_ms",)),
    "unknown-field": ({"status": 200, "latency_ms": 5}, ("latency_ms",)),
    "typo": ({"stauts": 200}, ("stauts",)),
    "rate-negative-limit": ({"rate": {"limit": -1}}, ("rate",)),
    "rate-negative-remaining": ({"rate": {"remaining": -3}}, ("rate",)),
    "rate-negative-reset": ({"rate": {"reset_ms": -1}}, ("rate",)),
    "rate-negative-token-limit": ({"rate": {"token_limit": -1}}, ("rate",)),
    "rate-negative-token-remaining": ({"rate": {"token_remaining": -10}}, ("rate",)),
    "rate-negative-token-reset": ({"rate": {"token_reset_ms": -1}}, ("rate",)),
    "rate-string-value": ({"rate": {"limit": "100"}}, ("rate",)),
    "rate-unknown-field": ({"rate": {"limt": 100}}, ("rate",)),
    "rate-not-object": ({"rate": "100/min"}, ("rate",)),
    "rate-list": ({"rate": [100]}, ("rate",)),
    "headers-int-value": ({"headers": {"Retry-After": 3}}, ("headers",)),
    "headers-null-value": ({"headers": {"Retry-After": None}}, ("headers",)),
    "headers-list-value": ({"headers": {"Retry-After": ["3"]}}, ("headers",)),
    "headers-list": ({"headers": ["Retry-After: 3"]}, ("headers",)),
    "headers-string": ({"headers": "Retry-After: 3"}, ("headers",)),
    "headers-object-value": ({"headers": {"a": {"b": "c"}}}, ("headers",)),
    "several": ({"status": 600, "throttled": -1, "retry_after_ms": -1, "bogus": 1},
                ("status", "throttled", "retry_after_ms", "bogus")),
    "rate-and-headers-bad": ({"rate": {"limit": -1}, "headers": {"a": 1}}, ("rate", "headers")),
}


def test_the_largest_reported_numbers_are_taken_and_counted(admin: httpx.Client,
                                                            member: httpx.Client) -> None:
    pool = make_pool(admin)
    biggest = 2**53 - 1
    report = {"status": 429, "throttled": 1_000_000, "retry_after_ms": biggest,
              "rate": {"limit": biggest, "remaining": 0, "reset_ms": biggest,
                       "token_limit": biggest, "token_remaining": biggest,
                       "token_reset_ms": biggest}}
    for _ in range(2):
        slot = grab(member, pool)
        assert release(member, pool, slot["slot_id"], json=report).json() == {"released": True}
    stats = pool_state(admin, pool)["stats"]
    assert stats["throttled"] == 2_000_000 and stats["status_429"] == 2, stats
    assert stats["last_retry_after_ms"] == biggest, stats


@pytest.mark.parametrize("case", sorted(BAD_REPORTS))
def test_bad_outcome_report_is_422_and_keeps_the_slot(admin: httpx.Client, member: httpx.Client,
                                                      case: str) -> None:
    body, fields = BAD_REPORTS[case]
    pool = make_pool(admin)
    slot = grab(member, pool)
    err = assert_error(release(member, pool, slot["slot_id"], json=body), 422,
                       "validation_error")
    named = detail_fields(err)
    for f in fields:
        # The field, or a part of it (`rate.limit` names the bad part of `rate`).
        assert any(n == f or n.startswith(f + ".") for n in named), \
            f"422 does not name {f!r}: {err}"
    state = pool_state(admin, pool)
    assert state["in_use"] == 1, "a refused release must not free the slot"
    assert state["stats"]["released"] == 0
    assert renew(member, pool, slot["slot_id"]).status_code == 200
    assert release(member, pool, slot["slot_id"], json={"status": 200}).json() == \
        {"released": True}


@pytest.mark.parametrize("body", [[], [200], 200, "done", None, True])
def test_non_object_report_is_422(admin: httpx.Client, member: httpx.Client, body: Any) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    resp = release(member, pool, slot["slot_id"], content=json.dumps(body),
                   headers={"Content-Type": "application/json"})
    assert_error(resp, 422, "validation_error")
    assert pool_state(admin, pool)["in_use"] == 1


GOOD_REPORTS = {
    "status-100": {"status": 100},
    "status-599": {"status": 599},
    "zeros": {"throttled": 0, "retry_after_ms": 0},
    "full-rate": {"rate": {"limit": 0, "remaining": 0, "reset_ms": 0, "token_limit": 0,
                           "token_remaining": 0, "token_reset_ms": 0}},
    "empty-rate": {"rate": {}},
    "empty-headers": {"headers": {}},
    "headers-dialects": {"headers": {
        "retry-after": "Wed, 21 Oct 2026 07:28:00 GMT", "retry-after-ms": "250",
        "x-ratelimit-reset-requests": "6m0s", "anthropic-ratelimit-tokens-reset":
        "2026-11-29T06:43:26Z", "ratelimit": "limit=10, remaining=0, reset=5",
        "X-RateLimit-Remaining": "", "weird": "not a number at all"}},
    "rate-and-headers": {"status": 429, "rate": {"remaining": 0, "reset_ms": 500},
                         "headers": {"retry-after": "7"}},
    "nulls": {"status": None, "throttled": None, "retry_after_ms": None, "rate": None,
              "headers": None},
}


@pytest.mark.parametrize("case", sorted(GOOD_REPORTS))
def test_valid_outcome_reports_are_accepted(admin: httpx.Client, member: httpx.Client,
                                            case: str) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    resp = release(member, pool, slot["slot_id"], json=GOOD_REPORTS[case])
    assert resp.status_code == 200 and resp.json() == {"released": True}, resp.text
    assert pool_state(admin, pool)["in_use"] == 0


def test_renew_and_release_never_accept_bad_names(admin: httpx.Client,
                                                  member: httpx.Client) -> None:
    pool = make_pool(admin)
    slot = grab(member, pool)
    for bad in ("-x", "x" * 129, "a*b"):
        err = assert_error(renew(member, bad, slot["slot_id"]), 422, "validation_error")
        assert "pool" in detail_fields(err)
        err = assert_error(release(member, bad, slot["slot_id"]), 422, "validation_error")
        assert "pool" in detail_fields(err)
    assert pool_state(admin, pool)["in_use"] == 1


# --- isolation -------------------------------------------------------------------------------


def test_other_project_cannot_renew_or_release(server: ServerProcess, admin: httpx.Client,
                                               member: httpx.Client) -> None:
    pool = make_pool(admin, limit=2)
    slot = grab(member, pool)
    other_key = server.create_project(unique_name("proj"))
    with server.client(other_key) as other:
        # No pool of that name over there.
        assert_error(renew(other, pool, slot["slot_id"]), 404, "not_found")
        assert_error(release(other, pool, slot["slot_id"]), 404, "not_found")
        # Even with a pool of the same name in the other project.
        assert other.put(f"/v1/pools/{pool}", json={"limit": 1}).status_code == 201
        assert_error(renew(other, pool, slot["slot_id"]), 404, "not_found")
        resp = release(other, pool, slot["slot_id"], json={"status": 500})
        assert_error(resp, 404, "not_found")
        theirs = pool_state(other, pool)
        assert theirs["in_use"] == 0 and theirs["stats"]["released"] == 0
        # And their own slot is not reachable from here either.
        their_slot = grab(other, pool)
        assert_error(renew(member, pool, their_slot["slot_id"]), 404, "not_found")
        assert_error(release(member, pool, their_slot["slot_id"]), 404, "not_found")
        assert pool_state(other, pool)["in_use"] == 1
    state = pool_state(admin, pool)
    assert state["in_use"] == 1
    assert state["stats"]["released"] == 0 and state["stats"]["statuses"]["5xx"] == 0
    assert renew(member, pool, slot["slot_id"]).status_code == 200
    assert release(member, pool, slot["slot_id"]).json() == {"released": True}


# --- durability ------------------------------------------------------------------------------


def test_restart_keeps_config_live_slots_and_stats(fresh_server: ServerProcess) -> None:
    config = {"limit": 2, "queue_size": 7, "queue_timeout_ms": 800, "term_ms": 60_000,
              "renew_interval_ms": 5000, "request_timeout_ms": 120_000, "rpm": None,
              "adaptive": False, "min_limit": 1}
    with fresh_server.client() as c:
        pool = make_pool(c, **config)
        done = grab(c, pool)
        assert release(c, pool, done["slot_id"],
                       json={"status": 429, "throttled": 2, "retry_after_ms": 700}).json() == \
            {"released": True}
        kept = [grab(c, pool), grab(c, pool)]
        renewed = renew(c, pool, kept[0]["slot_id"])
        assert renewed.status_code == 200
        before = pool_state(c, pool)
    assert before["in_use"] == 2

    fresh_server.kill9()
    fresh_server.start()

    with fresh_server.client() as c:
        after = pool_state(c, pool)
        for field, value in config.items():
            assert after[field] == value, (field, after)
        assert after["in_use"] == 2, after
        assert after["stats"] == before["stats"], (before["stats"], after["stats"])
        # The live slots still count against the limit and still work.
        assert_error(acquire(c, pool), 429, "too_many_requests")
        resp = renew(c, pool, kept[1]["slot_id"])
        assert resp.status_code == 200, resp.text
        assert resp.json()["lease_deadline"] <= kept[1]["request_deadline"]
        assert release(c, pool, kept[0]["slot_id"]).json() == {"released": True}
        assert release(c, pool, kept[0]["slot_id"]).json() == {"released": False}
        assert release(c, pool, done["slot_id"]).json() == {"released": False}
        assert acquire(c, pool).status_code == 200
        assert pool_state(c, pool)["stats"]["released"] == 2


def test_restart_keeps_a_deleted_pool_deleted(fresh_server: ServerProcess) -> None:
    with fresh_server.client() as c:
        pool = make_pool(c, limit=1)
        slot = grab(c, pool)
        assert c.delete(f"/v1/pools/{pool}").json() == {"deleted": True}
    fresh_server.kill9()
    fresh_server.start()
    with fresh_server.client() as c:
        assert_error(c.get(f"/v1/pools/{pool}"), 404, "not_found")
        assert_error(renew(c, pool, slot["slot_id"]), 404, "not_found")
