"""SPEC §4.1 pool configuration over HTTP (PUT/GET/list/DELETE: defaults, ranges, replacement,
roles, isolation) and bad input on every pool route (SPEC §2, §7.7)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from pool_support import acquire, make_pool, pool_state, release, renew
from support import ServerProcess, assert_error, detail_fields, unique_name

MAX_BODY = 64 * 1024
SLOT_ID = re.compile(r"^slot_[A-Za-z0-9_-]{32,}$")
DEFAULTS = {
    "queue_size": 100,
    "queue_timeout_ms": 30_000,
    "term_ms": 30_000,
    "renew_interval_ms": 10_000,
    "request_timeout_ms": 60_000,
    "rpm": None,
    "adaptive": False,
    "min_limit": 1,
}
STATE_FIELDS = {"name", "limit", *DEFAULTS, "in_use", "queued", "effective_limit", "learned",
                "stats"}
LEARNED_FIELDS = {"effective_limit", "effective_rpm", "window_ms", "paused_until_at", "last_hint"}
ZERO_STATS = {
    "released": 0,
    "reclaimed": 0,
    "statuses": {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0},
    "status_429": 0,
    "throttled": 0,
    "last_retry_after_ms": None,
    "last_reported_at": None,
}


# --- helpers ---------------------------------------------------------------------------------


def assert_422(resp: httpx.Response, *fields: str) -> dict[str, Any]:
    err = assert_error(resp, 422, "validation_error")
    named = detail_fields(err)
    for f in fields:
        assert f in named, f"422 does not name {f!r}: {err}"
    return err


def put_pool(c: httpx.Client, name: str, **config: Any) -> httpx.Response:
    return c.put(f"/v1/pools/{name}", json=config)


def grab(c: httpx.Client, pool: str) -> str:
    resp = acquire(c, pool)
    assert resp.status_code == 200, resp.text
    slot_id = resp.json()["slot_id"]
    assert SLOT_ID.match(slot_id), slot_id
    return str(slot_id)


def assert_state_shape(state: dict[str, Any]) -> None:
    assert STATE_FIELDS <= set(state), state
    assert LEARNED_FIELDS <= set(state["learned"]), state  # SPEC §4.5
    assert state["learned"]["effective_limit"] == state["effective_limit"]
    stats = state["stats"]
    assert set(ZERO_STATS) <= set(stats), stats
    assert set(stats["statuses"]) == {"1xx", "2xx", "3xx", "4xx", "5xx"}, stats


# --- create, read, defaults ------------------------------------------------------------------


def test_put_creates_with_defaults(admin: httpx.Client) -> None:
    name = unique_name("pool")
    resp = put_pool(admin, name, limit=3)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert_state_shape(body)
    assert body["name"] == name
    assert body["limit"] == 3
    for field, value in DEFAULTS.items():
        assert body[field] == value, (field, body)
    assert body["in_use"] == 0
    assert body["queued"] == 0
    assert body["effective_limit"] == 3
    assert body["stats"] == ZERO_STATS

    got = pool_state(admin, name)
    assert got == body


def test_put_with_every_field_is_returned_verbatim(admin: httpx.Client) -> None:
    name = unique_name("pool")
    config = {
        "limit": 7, "queue_size": 3, "queue_timeout_ms": 1234, "term_ms": 5000,
        "renew_interval_ms": 1500, "request_timeout_ms": 20_000, "rpm": 600,
        "adaptive": True, "min_limit": 2,
    }
    resp = put_pool(admin, name, **config)
    assert resp.status_code == 201, resp.text
    got = pool_state(admin, name)
    for field, value in config.items():
        assert got[field] == value, (field, got)
    # A new adaptive pool starts slow (SPEC §4.5): at 2 here (its min_limit).
    assert got["effective_limit"] == 2
    assert got["in_use"] == 0 and got["queued"] == 0


def test_default_renew_interval_is_a_third_of_term(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=1, term_ms=3000)
    assert pool_state(admin, name)["renew_interval_ms"] == 1000


def test_put_again_is_200_and_replaces_the_whole_config(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=5, queue_size=7, queue_timeout_ms=900, term_ms=6000,
                     renew_interval_ms=1000, request_timeout_ms=9000, rpm=10, adaptive=True,
                     min_limit=3)
    resp = put_pool(admin, name, limit=4)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["limit"] == 4
    for field, value in DEFAULTS.items():
        assert body[field] == value, f"omitted {field} did not return to its default: {body}"
    assert pool_state(admin, name) == body


def test_put_keeps_live_slots_and_stats(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=3)
    held = grab(admin, name)
    done = grab(admin, name)
    assert release(admin, name, done, json={"status": 200}).json() == {"released": True}
    before = pool_state(admin, name)
    assert before["in_use"] == 1
    assert before["stats"]["released"] == 1

    resp = put_pool(admin, name, limit=1, term_ms=2000)
    assert resp.status_code == 200, resp.text
    after = pool_state(admin, name)
    assert after["in_use"] == 1
    assert after["stats"] == before["stats"]
    assert after["limit"] == 1 and after["term_ms"] == 2000
    # The slot itself still works: a new fail-fast acquire is refused (limit 1 reached)
    # and the old slot renews and releases.
    assert acquire(admin, name).status_code == 429
    assert renew(admin, name, held).status_code == 200
    assert release(admin, name, held).json() == {"released": True}
    assert pool_state(admin, name)["stats"]["released"] == 2


def test_lowering_the_limit_below_in_use_admits_nobody(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=3)
    slots = [grab(admin, name) for _ in range(3)]
    assert put_pool(admin, name, limit=1).status_code == 200
    assert pool_state(admin, name)["in_use"] == 3
    assert acquire(admin, name).status_code == 429
    assert release(admin, name, slots[0]).json() == {"released": True}
    assert acquire(admin, name).status_code == 429  # 2 still held, limit 1
    for s in slots[1:]:
        assert release(admin, name, s).json() == {"released": True}
    assert acquire(admin, name).status_code == 200


def test_get_unknown_pool_is_404(admin: httpx.Client) -> None:
    assert_error(admin.get(f"/v1/pools/{unique_name('nope')}"), 404, "not_found")


# --- list ------------------------------------------------------------------------------------


def test_list_pools_with_prefix_limit_and_after(admin: httpx.Client) -> None:
    prefix = unique_name("lst")
    names = [f"{prefix}-{suffix}" for suffix in ("c", "a", "b")]
    for n in names:
        make_pool(admin, n, limit=1)
    make_pool(admin, f"other-{prefix}", limit=1)

    resp = admin.get("/v1/pools", params={"prefix": prefix, "limit": 2})
    assert resp.status_code == 200, resp.text
    page = resp.json()
    assert set(page) >= {"pools", "next"}
    assert [p["name"] for p in page["pools"]] == [f"{prefix}-a", f"{prefix}-b"]
    for p in page["pools"]:
        assert_state_shape(p)
        assert p == pool_state(admin, p["name"])
    assert page["next"] is not None

    resp = admin.get("/v1/pools", params={"prefix": prefix, "limit": 2, "after": page["next"]})
    assert resp.status_code == 200, resp.text
    page2 = resp.json()
    assert [p["name"] for p in page2["pools"]] == [f"{prefix}-c"]
    assert page2["next"] is None

    full = admin.get("/v1/pools", params={"prefix": prefix}).json()
    assert [p["name"] for p in full["pools"]] == sorted(names)
    assert full["next"] is None


def test_list_shows_live_state(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=2)
    slot = grab(admin, name)
    listed = admin.get("/v1/pools", params={"prefix": name}).json()["pools"]
    assert [p["name"] for p in listed] == [name]
    assert listed[0]["in_use"] == 1
    release(admin, name, slot)


@pytest.mark.parametrize("query,field", [
    ({"bogus": "1"}, "bogus"),
    ({"limit": "0"}, "limit"),
    ({"limit": "1001"}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"limit": "-1"}, "limit"),
    ({"prefix": "has space"}, "prefix"),
    ({"after": "-bad"}, "after"),
])
def test_list_bad_query_is_422(admin: httpx.Client, query: dict[str, str], field: str) -> None:
    assert_422(admin.get("/v1/pools", params=query), field)


# --- delete ----------------------------------------------------------------------------------


def test_delete_pool(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=2)
    slot = grab(admin, name)
    resp = admin.delete(f"/v1/pools/{name}")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"deleted": True}
    assert_error(admin.get(f"/v1/pools/{name}"), 404, "not_found")
    assert_error(admin.delete(f"/v1/pools/{name}"), 404, "not_found")
    assert name not in [p["name"] for p in
                        admin.get("/v1/pools", params={"prefix": name}).json()["pools"]]
    # Its slots ended.
    assert_error(renew(admin, name, slot), 404, "not_found")
    assert_error(acquire(admin, name), 404, "not_found")

    # A new pool of the same name starts empty; the old slot does not come back.
    resp = put_pool(admin, name, limit=1)
    assert resp.status_code == 201, resp.text
    state = resp.json()
    assert state["in_use"] == 0
    assert state["stats"] == ZERO_STATS
    assert_error(renew(admin, name, slot), 404, "not_found")
    assert release(admin, name, slot).json() == {"released": False}
    assert acquire(admin, name).status_code == 200


def test_delete_unknown_pool_is_404(admin: httpx.Client) -> None:
    assert_error(admin.delete(f"/v1/pools/{unique_name('nope')}"), 404, "not_found")


# --- validation of PUT -----------------------------------------------------------------------

BAD_CONFIGS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "limit-missing": ({"queue_size": 5}, ("limit",)),
    "limit-zero": ({"limit": 0}, ("limit",)),
    "limit-negative": ({"limit": -1}, ("limit",)),
    "limit-too-big": ({"limit": 10_001}, ("limit",)),
    "limit-string": ({"limit": "3"}, ("limit",)),
    "limit-float": ({"limit": 2.5}, ("limit",)),
    "limit-bool": ({"limit": True}, ("limit",)),
    "limit-null": ({"limit": None}, ("limit",)),
    "queue_size-negative": ({"limit": 1, "queue_size": -1}, ("queue_size",)),
    "queue_size-too-big": ({"limit": 1, "queue_size": 100_001}, ("queue_size",)),
    "queue_size-string": ({"limit": 1, "queue_size": "10"}, ("queue_size",)),
    "queue_timeout_ms-negative": ({"limit": 1, "queue_timeout_ms": -1}, ("queue_timeout_ms",)),
    "queue_timeout_ms-too-big": ({"limit": 1, "queue_timeout_ms": 600_001},
                                 ("queue_timeout_ms",)),
    "term_ms-too-small": ({"limit": 1, "term_ms": 999}, ("term_ms",)),
    "term_ms-too-big": ({"limit": 1, "term_ms": 600_001}, ("term_ms",)),
    "term_ms-float": ({"limit": 1, "term_ms": 1500.5}, ("term_ms",)),
    "renew_interval_ms-zero": ({"limit": 1, "renew_interval_ms": 0}, ("renew_interval_ms",)),
    "renew_interval_ms-equal-term": ({"limit": 1, "term_ms": 3000, "renew_interval_ms": 3000},
                                     ("renew_interval_ms",)),
    "renew_interval_ms-above-term": ({"limit": 1, "term_ms": 3000, "renew_interval_ms": 4000},
                                     ("renew_interval_ms",)),
    "renew_interval_ms-above-default-term": ({"limit": 1, "renew_interval_ms": 30_000},
                                             ("renew_interval_ms",)),
    "renew_interval_ms-too-big": ({"limit": 1, "term_ms": 600_000,
                                   "renew_interval_ms": 600_000}, ("renew_interval_ms",)),
    "request_timeout_ms-too-small": ({"limit": 1, "request_timeout_ms": 999},
                                     ("request_timeout_ms",)),
    "request_timeout_ms-too-big": ({"limit": 1, "request_timeout_ms": 86_400_001},
                                   ("request_timeout_ms",)),
    "rpm-zero": ({"limit": 1, "rpm": 0}, ("rpm",)),
    "rpm-too-big": ({"limit": 1, "rpm": 1_000_001}, ("rpm",)),
    "rpm-string": ({"limit": 1, "rpm": "60"}, ("rpm",)),
    "adaptive-string": ({"limit": 1, "adaptive": "yes"}, ("adaptive",)),
    "adaptive-int": ({"limit": 1, "adaptive": 1}, ("adaptive",)),
    "min_limit-zero": ({"limit": 1, "min_limit": 0}, ("min_limit",)),
    "min_limit-above-limit": ({"limit": 3, "min_limit": 4}, ("min_limit",)),
    "min_limit-too-big": ({"limit": 10_000, "min_limit": 10_001}, ("min_limit",)),
    "unknown-field": ({"limit": 1, "limt": 2}, ("limt",)),
    "typo-only": ({"limt": 2}, ("limt", "limit")),
    "several-bad": ({"limit": 0, "queue_size": -1, "term_ms": 5, "bogus": True},
                    ("limit", "queue_size", "term_ms", "bogus")),
    "both-cross-field": ({"limit": 2, "min_limit": 3, "term_ms": 2000,
                          "renew_interval_ms": 2000}, ("min_limit", "renew_interval_ms")),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_put_validation_is_422_naming_fields(admin: httpx.Client, case: str) -> None:
    body, fields = BAD_CONFIGS[case]
    name = unique_name("bad")
    assert_422(put_pool(admin, name, **body), *fields)
    assert_error(admin.get(f"/v1/pools/{name}"), 404, "not_found")


def test_bad_put_leaves_an_existing_config_alone(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=4, queue_size=9)
    before = pool_state(admin, name)
    assert_422(put_pool(admin, name, limit=4, queue_size=-1), "queue_size")
    assert_422(put_pool(admin, name, limit=2, min_limit=3), "min_limit")
    assert pool_state(admin, name) == before


@pytest.mark.parametrize("body", [[], [1], "limit", 3, None, True])
def test_put_non_object_json_is_422(admin: httpx.Client, body: Any) -> None:
    name = unique_name("bad")
    resp = admin.put(f"/v1/pools/{name}", content=json.dumps(body),
                     headers={"Content-Type": "application/json"})
    assert_error(resp, 422, "validation_error")
    assert_error(admin.get(f"/v1/pools/{name}"), 404, "not_found")


GOOD_CONFIGS: dict[str, dict[str, Any]] = {
    "limit-min": {"limit": 1},
    "limit-max": {"limit": 10_000},
    "queue_size-zero": {"limit": 1, "queue_size": 0},
    "queue_size-max": {"limit": 1, "queue_size": 100_000},
    "queue_timeout_ms-zero": {"limit": 1, "queue_timeout_ms": 0},
    "queue_timeout_ms-max": {"limit": 1, "queue_timeout_ms": 600_000},
    "term_ms-min": {"limit": 1, "term_ms": 1000},
    "term_ms-max": {"limit": 1, "term_ms": 600_000},
    "renew_interval_ms-min": {"limit": 1, "renew_interval_ms": 1},
    "renew_interval_ms-max": {"limit": 1, "term_ms": 600_000, "renew_interval_ms": 599_999},
    "renew_interval_ms-just-below-term": {"limit": 1, "term_ms": 1000,
                                          "renew_interval_ms": 999},
    "request_timeout_ms-min": {"limit": 1, "request_timeout_ms": 1000},
    "request_timeout_ms-max": {"limit": 1, "request_timeout_ms": 86_400_000},
    "rpm-null": {"limit": 1, "rpm": None},
    "rpm-min": {"limit": 1, "rpm": 1},
    "rpm-max": {"limit": 1, "rpm": 1_000_000},
    "adaptive-true": {"limit": 1, "adaptive": True},
    "min_limit-equals-limit": {"limit": 10_000, "min_limit": 10_000},
}


@pytest.mark.parametrize("case", sorted(GOOD_CONFIGS))
def test_put_accepts_boundary_values(admin: httpx.Client, case: str) -> None:
    config = GOOD_CONFIGS[case]
    name = unique_name("edge")
    resp = put_pool(admin, name, **config)
    assert resp.status_code == 201, resp.text
    got = pool_state(admin, name)
    for field, value in config.items():
        assert got[field] == value, (field, got)


# --- PATCH: only the fields given ----------------------------------------------------------

FULL = {
    "limit": 5, "queue_size": 7, "queue_timeout_ms": 900, "term_ms": 6000,
    "renew_interval_ms": 1000, "request_timeout_ms": 9000, "rpm": 10, "adaptive": True,
    "min_limit": 3,
}


def patch_pool(c: httpx.Client, name: str, **fields: Any) -> httpx.Response:
    return c.patch(f"/v1/pools/{name}", json=fields)


def test_patch_changes_only_the_given_fields(admin: httpx.Client) -> None:
    name = make_pool(admin, **FULL)
    resp = patch_pool(admin, name, limit=9, queue_size=0)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert_state_shape(body)
    assert body["limit"] == 9 and body["queue_size"] == 0
    for field, value in FULL.items():
        if field not in ("limit", "queue_size"):
            assert body[field] == value, (field, body)
    assert pool_state(admin, name) == body


def test_patch_with_no_fields_changes_nothing(admin: httpx.Client) -> None:
    name = make_pool(admin, **FULL)
    before = pool_state(admin, name)
    resp = patch_pool(admin, name)
    assert resp.status_code == 200 and resp.json() == before


def test_patch_null_clears_rpm_and_renew_interval(admin: httpx.Client) -> None:
    name = make_pool(admin, **FULL)
    body = patch_pool(admin, name, rpm=None, renew_interval_ms=None).json()
    assert body["rpm"] is None and body["renew_interval_ms"] == 2000  # term_ms / 3
    assert body["adaptive"] is True and body["min_limit"] == 3


def test_patch_keeps_slots_and_statistics(admin: httpx.Client) -> None:
    name = make_pool(admin, limit=3)
    held = grab(admin, name)
    done = grab(admin, name)
    assert release(admin, name, done, json={"status": 200}).json() == {"released": True}
    body = patch_pool(admin, name, adaptive=True).json()
    assert body["in_use"] == 1 and body["stats"]["released"] == 1 and body["limit"] == 3
    assert renew(admin, name, held).status_code == 200


BAD_PATCHES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "limit-zero": ({"limit": 0}, ("limit",)),
    "limit-null": ({"limit": None}, ("limit",)),
    "adaptive-string": ({"adaptive": "yes"}, ("adaptive",)),
    "unknown-field": ({"limt": 2}, ("limt",)),
    "min_limit-above-the-kept-limit": ({"min_limit": 6}, ("min_limit",)),
    "limit-below-the-kept-min_limit": ({"limit": 2}, ("min_limit",)),
    "renew_interval-not-below-the-kept-term": ({"renew_interval_ms": 6000},
                                               ("renew_interval_ms",)),
    "several-bad": ({"limit": 0, "term_ms": 5, "bogus": 1}, ("limit", "term_ms", "bogus")),
}


@pytest.mark.parametrize("case", sorted(BAD_PATCHES))
def test_patch_validation_is_422_and_changes_nothing(admin: httpx.Client, case: str) -> None:
    body, fields = BAD_PATCHES[case]
    name = make_pool(admin, **FULL)
    before = pool_state(admin, name)
    assert_422(admin.patch(f"/v1/pools/{name}", json=body), *fields)
    assert pool_state(admin, name) == before


def test_patch_of_an_unknown_pool_is_404_and_creates_nothing(admin: httpx.Client) -> None:
    name = unique_name("nopool")
    assert_error(patch_pool(admin, name, limit=3), 404, "not_found")
    assert_error(admin.get(f"/v1/pools/{name}"), 404, "not_found")


# --- roles -----------------------------------------------------------------------------------


def test_reader_may_read_but_not_configure(server: ServerProcess, admin: httpx.Client,
                                           reader_key: str) -> None:
    name = make_pool(admin, limit=2)
    with server.client(reader_key) as reader:
        assert pool_state(reader, name)["limit"] == 2
        listed = reader.get("/v1/pools", params={"prefix": name})
        assert listed.status_code == 200 and len(listed.json()["pools"]) == 1
        assert_error(put_pool(reader, name, limit=9), 403, "forbidden")
        assert_error(put_pool(reader, unique_name("new"), limit=9), 403, "forbidden")
        assert_error(reader.delete(f"/v1/pools/{name}"), 403, "forbidden")
        assert_error(reader.patch(f"/v1/pools/{name}", json={"limit": 9}), 403, "forbidden")
    assert pool_state(admin, name)["limit"] == 2


def test_member_may_not_configure_or_delete(server: ServerProcess, admin: httpx.Client,
                                            member_key: str) -> None:
    name = make_pool(admin, limit=2)
    fresh = unique_name("new")
    with server.client(member_key) as member:
        assert pool_state(member, name)["limit"] == 2
        assert_error(put_pool(member, name, limit=9), 403, "forbidden")
        assert_error(put_pool(member, fresh, limit=9), 403, "forbidden")
        assert_error(member.delete(f"/v1/pools/{name}"), 403, "forbidden")
        assert_error(member.patch(f"/v1/pools/{name}", json={"limit": 9}), 403, "forbidden")
    assert pool_state(admin, name)["limit"] == 2
    assert_error(admin.get(f"/v1/pools/{fresh}"), 404, "not_found")


# --- isolation -------------------------------------------------------------------------------


def test_pools_are_per_project(server: ServerProcess, admin: httpx.Client) -> None:
    name = make_pool(admin, limit=2, queue_size=5)
    slot = grab(admin, name)
    other_key = server.create_project(unique_name("proj"))
    with server.client(other_key) as other:
        assert_error(other.get(f"/v1/pools/{name}"), 404, "not_found")
        assert other.get("/v1/pools", params={"prefix": name}).json()["pools"] == []
        assert_error(other.delete(f"/v1/pools/{name}"), 404, "not_found")
        assert_error(acquire(other, name), 404, "not_found")
        # The same name in the other project is an independent pool.
        resp = put_pool(other, name, limit=1)
        assert resp.status_code == 201, resp.text
        assert resp.json()["in_use"] == 0
        assert grab(other, name)
        assert acquire(other, name).status_code == 429
        assert other.delete(f"/v1/pools/{name}").json() == {"deleted": True}
    state = pool_state(admin, name)
    assert state["limit"] == 2 and state["queue_size"] == 5 and state["in_use"] == 1
    assert release(admin, name, slot).json() == {"released": True}


# --- bad input on every pool route -----------------------------------------------------------

ROUTES: list[tuple[str, str]] = [
    ("PUT", "/v1/pools/{pool}"),
    ("PATCH", "/v1/pools/{pool}"),
    ("GET", "/v1/pools/{pool}"),
    ("DELETE", "/v1/pools/{pool}"),
    ("GET", "/v1/pools"),
    ("POST", "/v1/pools/{pool}/lock/acquire"),
    ("POST", "/v1/pools/{pool}/lock/{slot}/renew"),
    ("POST", "/v1/pools/{pool}/lock/{slot}/release"),
]
NAMED_ROUTES = [r for r in ROUTES if "{pool}" in r[1]]
BODY_ROUTES = [r for r in ROUTES if r[0] in ("PUT", "PATCH", "POST")]


class Held:
    """A pool with one live slot; checks that a bad request changed nothing."""

    def __init__(self, admin: httpx.Client) -> None:
        self.admin = admin
        self.pool = make_pool(admin, limit=2, queue_size=4)
        self.slot = grab(admin, self.pool)
        self.before = pool_state(admin, self.pool)

    def path(self, template: str) -> str:
        return template.format(pool=self.pool, slot=self.slot)

    def assert_unchanged(self) -> None:
        after = pool_state(self.admin, self.pool)
        assert after == self.before, (self.before, after)
        # The slot is still live and still this caller's.
        assert renew(self.admin, self.pool, self.slot).status_code == 200


@pytest.fixture
def held(admin: httpx.Client) -> Held:
    return Held(admin)


def _route_id(route: tuple[str, str]) -> str:
    return f"{route[0]} {route[1]}"


@pytest.mark.parametrize("route", ROUTES, ids=_route_id)
@pytest.mark.parametrize("auth", ["none", "garbage-bearer", "garbage-x-api-key", "not-bearer"])
def test_missing_or_bad_auth_is_401(server: ServerProcess, held: Held, route: tuple[str, str],
                                    auth: str) -> None:
    headers = {
        "none": {},
        "garbage-bearer": {"Authorization": "Bearer fp_nope_0123456789"},
        "garbage-x-api-key": {"X-Api-Key": "fp_nope_0123456789"},
        "not-bearer": {"Authorization": f"Basic {server.admin_key}"},
    }[auth]
    method, template = route
    body = {"limit": 9} if method in ("PUT", "PATCH") else None
    with httpx.Client(base_url=server.base_url, timeout=30) as anon:
        resp = anon.request(method, held.path(template), json=body, headers=headers)
    assert_error(resp, 401, "unauthorized")
    held.assert_unchanged()


BAD_NAMES = {
    "leading-dash": "-pool",
    "leading-dot": ".pool",
    "leading-underscore": "_pool",
    "too-long": "p" * 129,
    "space": "po%20ol",
    "star": "po*ol",
    "non-ascii": "p%C3%BCol",
    "at-sign": "po@ol",
    "comma": "po,ol",
}


@pytest.mark.parametrize("route", NAMED_ROUTES, ids=_route_id)
@pytest.mark.parametrize("case", sorted(BAD_NAMES))
def test_bad_pool_name_is_422(admin: httpx.Client, held: Held, route: tuple[str, str],
                              case: str) -> None:
    method, template = route
    path = template.format(pool=BAD_NAMES[case], slot=held.slot)
    body = {"limit": 1} if method == "PUT" else None
    resp = admin.request(method, path, json=body)
    assert_422(resp, "pool")
    held.assert_unchanged()


def test_longest_valid_name_is_accepted(admin: httpx.Client) -> None:
    name = ("P" + unique_name("x")).ljust(128, "z")
    assert len(name) == 128
    assert put_pool(admin, name, limit=1).status_code == 201
    assert pool_state(admin, name)["name"] == name
    assert acquire(admin, name).status_code == 200
    assert admin.delete(f"/v1/pools/{name}").status_code == 200


MALFORMED_JSON = {
    "truncated": b'{"limit": 1',
    "garbage": b"not json at all",
    "trailing-comma": b'{"limit": 1,}',
    "single-quotes": b"{'limit': 1}",
    "bad-utf8": b'{"limit": "\xff\xfe"}',
    "nan": b'{"limit": NaN}',
    "two-objects": b'{"limit": 1}{"limit": 2}',
}


@pytest.mark.parametrize("route", BODY_ROUTES, ids=_route_id)
@pytest.mark.parametrize("case", sorted(MALFORMED_JSON))
def test_malformed_json_is_400(admin: httpx.Client, held: Held, route: tuple[str, str],
                               case: str) -> None:
    method, template = route
    resp = admin.request(method, held.path(template), content=MALFORMED_JSON[case],
                         headers={"Content-Type": "application/json"})
    assert_error(resp, 400, "invalid_request")
    held.assert_unchanged()


def test_put_with_empty_body_is_400(admin: httpx.Client, held: Held) -> None:
    resp = admin.put(f"/v1/pools/{held.pool}", content=b"",
                     headers={"Content-Type": "application/json"})
    assert_error(resp, 400, "invalid_request")
    held.assert_unchanged()


@pytest.mark.parametrize("route", BODY_ROUTES, ids=_route_id)
@pytest.mark.parametrize("size", [MAX_BODY + 1, 200 * 1024])
def test_body_over_64_kib_is_413(admin: httpx.Client, held: Held, route: tuple[str, str],
                                 size: int) -> None:
    method, template = route
    prefix = b'{"limit": 1, "pad": "'
    body = prefix + b"x" * (size - len(prefix) - 2) + b'"}'
    assert len(body) == size
    resp = admin.request(method, held.path(template), content=body,
                         headers={"Content-Type": "application/json"})
    assert_error(resp, 413, "payload_too_large")
    held.assert_unchanged()
    assert admin.get("/healthz").status_code == 200


@pytest.mark.parametrize("route", BODY_ROUTES, ids=_route_id)
def test_body_of_exactly_64_kib_is_not_413(admin: httpx.Client, held: Held,
                                           route: tuple[str, str]) -> None:
    """64 KiB is the limit, not over it: the body is read and judged on its content."""
    method, template = route
    prefix = b'{"pad": "'
    body = prefix + b"x" * (MAX_BODY - len(prefix) - 2) + b'"}'
    assert len(body) == MAX_BODY
    resp = admin.request(method, held.path(template), content=body,
                         headers={"Content-Type": "application/json"})
    assert_422(resp, "pad")
    held.assert_unchanged()


@pytest.mark.parametrize("method", ["POST"])
def test_wrong_method_on_pool_is_405(admin: httpx.Client, held: Held, method: str) -> None:
    assert_error(admin.request(method, f"/v1/pools/{held.pool}", json={"limit": 1}), 405,
                 "method_not_allowed")
    held.assert_unchanged()


def test_server_keeps_serving_after_bad_pool_requests(admin: httpx.Client, held: Held) -> None:
    for i in range(60):
        body = list(MALFORMED_JSON.values())[i % len(MALFORMED_JSON)]
        resp = admin.put(f"/v1/pools/{held.pool}", content=body,
                         headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, resp.text
    held.assert_unchanged()
    assert admin.get("/healthz").status_code == 200
