"""U+0000 in any string a request carries (SPEC §2 "Query parameters"): a
`422 validation_error` naming the field, refused before the store sees it, on
SQLite and PostgreSQL alike (PostgreSQL TEXT cannot hold NUL, so a NUL that
reached it was a 500 there while SQLite stored it). In JSON a NUL can only be
the escape `\\u0000`; a raw NUL byte is not JSON at all (400)."""

from __future__ import annotations

import http.client
from typing import Any, Iterator

import httpx
import pytest

from pg_support import migrated_database
from support import (
    ServerProcess,
    assert_error,
    detail_fields,
    lock_headers,
    metric,
    new_token,
    unique_name,
)

NUL = "\u0000"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[ServerProcess]:
    """A server of this module's own on each store."""
    folder = tmp_path_factory.mktemp(f"nul-{request.param}")
    if request.param == "sqlite":
        server = ServerProcess(folder).start()
        yield server
        server.stop()
        return
    with migrated_database() as url:
        server = ServerProcess(folder, store=url).start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def c(srv: ServerProcess) -> Iterator[httpx.Client]:
    """The bootstrap admin (admin may do everything a member may)."""
    with srv.client() as client:
        yield client


def refused(resp: httpx.Response, field: str) -> dict[str, Any]:
    """`resp` is a 422 whose details name `field`; returns the error."""
    err = assert_error(resp, 422, "validation_error")
    named = detail_fields(err)
    assert field in named, f"details do not name {field!r}: {err['details']}"
    return err


def raw(srv: ServerProcess, method: str, target: str, body: bytes | None = None
        ) -> httpx.Response:
    """`target` sent exactly as written (percent escapes kept)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {srv.admin_key}", **lock_headers()}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return httpx.Response(resp.status, headers=resp.getheaders(), content=resp.read())
    finally:
        conn.close()


def held(c: httpx.Client, key: str) -> bool:
    resp = c.get(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    return bool(resp.json()["held"])


# --- lock acquire --------------------------------------------------------------------------

ACQUIRE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "operation": ({"operation": f"de{NUL}ploy"}, "operation"),
    "operation-only-nul": ({"operation": NUL}, "operation"),
    "metadata-value": ({"metadata": {"host": f"a{NUL}b"}}, "metadata.host"),
    "metadata-nested-value": ({"metadata": {"job": {"host": f"a{NUL}"}}}, "metadata.job.host"),
    "metadata-list-item": ({"metadata": {"tags": ["ok", f"{NUL}x"]}}, "metadata.tags[1]"),
    "metadata-key": ({"metadata": {f"a{NUL}b": 1}}, "metadata"),
    "metadata-nested-key": ({"metadata": {"job": {f"{NUL}": "x"}}}, "metadata.job"),
}


@pytest.mark.parametrize("case", ACQUIRE_CASES)
def test_acquire_refuses_nul(srv: ServerProcess, c: httpx.Client, case: str) -> None:
    extra, field = ACQUIRE_CASES[case]
    key = unique_name("nul")
    resp = c.put(f"/v1/locks/{key}/lease", headers=lock_headers(),
                 json={"ttl_seconds": 30, **extra})
    refused(resp, field)
    assert not held(c, key)
    # The lock is free and the server well: the same body without the NUL is granted.
    token = new_token()
    clean = {"ttl_seconds": 30, "operation": "deploy", "metadata": {"host": "a"}}
    assert c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                 json=clean).status_code == 201
    assert c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token}).status_code == 200


def test_acquire_names_nul_beside_other_bad_fields(c: httpx.Client) -> None:
    key = unique_name("nul")
    resp = c.put(f"/v1/locks/{key}/lease", headers=lock_headers(),
                 json={"ttl_seconds": 0, "operation": f"a{NUL}"})
    err = refused(resp, "operation")
    assert "ttl_seconds" in detail_fields(err)
    assert not held(c, key)


def test_acquire_refuses_nul_with_an_integral_float(c: httpx.Client) -> None:
    """`30.0` takes the slower decoding path; the NUL is refused there too."""
    key = unique_name("nul")
    resp = c.put(f"/v1/locks/{key}/lease", headers=lock_headers(),
                 content=b'{"ttl_seconds": 30.0, "operation": "a\\u0000"}')
    refused(resp, "operation")
    assert not held(c, key)


def test_an_escaped_backslash_before_u0000_is_no_nul(c: httpx.Client) -> None:
    """`"a\\\\u0000b"` in JSON is the text a, backslash, u0000, b: no NUL, accepted."""
    key, token = unique_name("nul"), new_token()
    resp = c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                 content=b'{"ttl_seconds": 30, "operation": "a\\\\u0000b",'
                         b' "metadata": {"k\\\\u0000": "v\\\\u0000"}}')
    assert resp.status_code == 201, resp.text
    got = c.get(f"/v1/locks/{key}").json()
    assert got["operation"] == "a\\u0000b"
    assert got["metadata"] == {"k\\u0000": "v\\u0000"}
    assert c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token}).status_code == 200


def test_a_raw_nul_byte_in_the_body_is_not_json(c: httpx.Client) -> None:
    key = unique_name("nul")
    resp = c.put(f"/v1/locks/{key}/lease", headers=lock_headers(),
                 content=b'{"ttl_seconds": 30, "operation": "a\x00b"}')
    assert_error(resp, 400, "invalid_request")
    assert not held(c, key)


# --- lock sets ------------------------------------------------------------------------------

LOCK_SET_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "operation": ({"operation": f"x{NUL}"}, "operation"),
    "metadata-value": ({"metadata": {"job": [f"{NUL}"]}}, "metadata.job[0]"),
    "metadata-key": ({"metadata": {f"k{NUL}": "v"}}, "metadata"),
}


@pytest.mark.parametrize("case", LOCK_SET_CASES)
def test_lock_set_refuses_nul(c: httpx.Client, case: str) -> None:
    extra, field = LOCK_SET_CASES[case]
    keys = [unique_name("set"), unique_name("set")]
    resp = c.post("/v1/lock-sets", headers=lock_headers(),
                  json={"keys": keys, "ttl_seconds": 30, **extra})
    refused(resp, field)
    assert not any(held(c, key) for key in keys)


def test_lock_set_refuses_a_key_with_nul(c: httpx.Client) -> None:
    """A key with a NUL breaks the naming rule (and was refused before NULs were)."""
    keys = [unique_name("set"), f"bad{NUL}key"]
    resp = c.post("/v1/lock-sets", headers=lock_headers(), json={"keys": keys, "ttl_seconds": 30})
    err = assert_error(resp, 422, "validation_error")
    assert any(field.startswith("keys") for field in detail_fields(err)), err
    assert not held(c, keys[0])


# --- names in paths and queries --------------------------------------------------------------

def test_lock_key_with_nul_in_the_path(srv: ServerProcess, c: httpx.Client) -> None:
    resp = raw(srv, "PUT", "/v1/locks/a%00b/lease", b'{"ttl_seconds": 30}')
    refused(resp, "key")
    assert c.get("/v1/locks", params={"prefix": "a"}).json()["locks"] == []


@pytest.mark.parametrize("route", ["/v1/locks", "/v1/pools"])
@pytest.mark.parametrize("param", ["prefix", "after"])
def test_list_query_with_nul(c: httpx.Client, route: str, param: str) -> None:
    refused(c.get(route, params={param: f"a{NUL}"}), param)


def test_key_id_with_nul_in_the_path_is_not_found(srv: ServerProcess, c: httpx.Client) -> None:
    """A key ID that cannot be one is simply not found (as every impossible ID is)."""
    before = c.get("/v1/keys").json()
    assert_error(raw(srv, "DELETE", "/v1/keys/key_%00"), 404, "not_found")
    assert c.get("/v1/keys").json() == before


# --- sessions and keys -----------------------------------------------------------------------

def test_session_name_with_nul(srv: ServerProcess, c: httpx.Client) -> None:
    started = metric(srv, "fencepost_sessions_total", action="started", reason="")
    resp = c.post("/v1/sessions", json={"ttl_seconds": 60, "name": f"night{NUL}ly"})
    refused(resp, "name")
    assert metric(srv, "fencepost_sessions_total", action="started", reason="") == started
    # A clean name is taken (and counted), so the count above would have moved.
    made = c.post("/v1/sessions", json={"ttl_seconds": 60, "name": "nightly"})
    assert made.status_code == 201, made.text
    assert metric(srv, "fencepost_sessions_total", action="started", reason="") == started + 1
    assert c.delete(f"/v1/sessions/{made.json()['session_id']}").status_code == 200


@pytest.mark.parametrize("body,field", [
    ({"role": "reader", "name": f"wor{NUL}ker"}, "name"),
    ({"role": "reader", "allow_ips": ["10.0.0.1", f"10.0.0.2{NUL}"]}, "allow_ips"),
])
def test_key_fields_with_nul(c: httpx.Client, body: dict[str, Any], field: str) -> None:
    before = c.get("/v1/keys").json()
    err = assert_error(c.post("/v1/keys", json=body), 422, "validation_error")
    assert any(f == field or f.startswith(f"{field}[") for f in detail_fields(err)), err
    assert c.get("/v1/keys").json() == before


# --- pools ----------------------------------------------------------------------------------

def test_pool_name_with_nul_in_the_path(srv: ServerProcess, c: httpx.Client) -> None:
    """Pool bodies have no string fields; the one string a PUT carries is the name."""
    resp = raw(srv, "PUT", "/v1/pools/p%00ool", b'{"limit": 2}')
    refused(resp, "pool")
    assert c.get("/v1/pools", params={"prefix": "p"}).json()["pools"] == []


RELEASE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "header-value": ({"status": 429, "headers": {"retry-after": f"1{NUL}"}},
                     "headers.retry-after"),
    "header-name": ({"status": 200, "headers": {f"x-{NUL}": "1"}}, "headers"),
}


@pytest.mark.parametrize("case", RELEASE_CASES)
def test_slot_release_report_with_nul(c: httpx.Client, case: str) -> None:
    body, field = RELEASE_CASES[case]
    pool = unique_name("pool")
    assert c.put(f"/v1/pools/{pool}", json={"limit": 2}).status_code == 201
    got = c.post(f"/v1/pools/{pool}/lock/acquire", json={})
    assert got.status_code == 200, got.text
    slot = got.json()["slot_id"]
    refused(c.post(f"/v1/pools/{pool}/lock/{slot}/release", json=body), field)
    state = c.get(f"/v1/pools/{pool}").json()
    assert state["in_use"] == 1  # still held: nothing was released or reported
    assert state["stats"]["released"] == 0
    assert state["learned"]["last_hint"] is None
    done = c.post(f"/v1/pools/{pool}/lock/{slot}/release", json={"status": 200})
    assert done.status_code == 200 and done.json() == {"released": True}, done.text
