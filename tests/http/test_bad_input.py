"""Bad, malformed and hostile input on every route: the right 4xx, never a 500, no state
change, and the server keeps serving (SPEC §2, §3, §5, §7.7)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import uuid
from datetime import datetime
from typing import Any, Iterator

import httpx
import pytest

from support import ServerProcess, assert_error, detail_fields, lock_headers, new_token, unique_name

# --- helpers ---------------------------------------------------------------------------------

# One kept-alive client per key: building an httpx.Client (its TLS context) costs more than
# the requests these tests send.
_CLIENTS: dict[tuple[str, str], httpx.Client] = {}


def api(server: ServerProcess, key: str | None = None) -> contextlib.nullcontext[httpx.Client]:
    """A shared client for `key` (the bootstrap admin by default); `with` does not close it."""
    ident = (server.base_url, key or server.admin_key)
    if ident not in _CLIENTS:
        _CLIENTS[ident] = server.client(key)
    return contextlib.nullcontext(_CLIENTS[ident])


@pytest.fixture(scope="module", autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for client in _CLIENTS.values():
        client.close()
    _CLIENTS.clear()



def assert_invalid(resp: httpx.Response) -> None:
    assert_error(resp, 400, "invalid_request")


def assert_validation(resp: httpx.Response, *fields: str) -> set[str]:
    err = assert_error(resp, 422, "validation_error")
    named = detail_fields(err)
    for field in fields:
        assert field in named, f"details do not name {field!r}: {err['details']}"
    return named


def assert_4xx(resp: httpx.Response) -> None:
    assert 400 <= resp.status_code < 500, f"{resp.status_code}: {resp.text[:300]}"
    assert_error(resp, resp.status_code)


def raw_request(server: ServerProcess, method: str, path: str,
                headers: dict[str, str] | None = None, body: bytes | None = None
                ) -> httpx.Response:
    """Sends `path` exactly as written (no normalisation of `..` or percent escapes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        sent = {"Authorization": f"Bearer {server.admin_key}"}
        if body is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        return httpx.Response(resp.status, headers=resp.getheaders(), content=resp.read())
    finally:
        conn.close()


def state(server: ServerProcess, name: str) -> dict[str, Any]:
    with api(server) as c:
        resp = c.get(f"/v1/locks/{name}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def key_listing(server: ServerProcess) -> list[dict[str, Any]]:
    with api(server) as c:
        resp = c.get("/v1/keys", params={"limit": "1000"})  # the largest page: all of them
    assert resp.status_code == 200, resp.text
    return list(resp.json()["keys"])


class Held:
    """A lock held by a known owner; checks that bad requests leave it untouched."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.name, self.token = unique_name("held"), new_token()
        with api(server) as c:
            resp = c.put(f"/v1/locks/{self.name}/lease", headers=lock_headers(self.token),
                         json={"ttl_seconds": 600, "operation": "owner",
                               "metadata": {"who": "owner"}})
        assert resp.status_code == 201, resp.text
        self.before = state(server, self.name)

    def assert_unchanged(self) -> None:
        now = state(self.server, self.name)
        assert now["held"] is True, "a bad request released the lock"
        for field in ("fencing_token", "expires_at", "acquired_at", "operation", "metadata",
                      "on_expiry"):
            assert now[field] == self.before[field], (field, self.before[field], now[field])


@pytest.fixture
def held(server: ServerProcess) -> Held:
    return Held(server)


@pytest.fixture
def free(server: ServerProcess) -> Iterator[str]:
    name = unique_name("free")
    yield name
    assert state(server, name)["held"] is False, "a bad request took the lock"


@pytest.fixture(autouse=True)
def keeps_serving(server: ServerProcess) -> Iterator[None]:
    yield
    name, token = unique_name("alive"), new_token()
    with api(server) as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": 30})
        assert resp.status_code == 201, f"server stopped serving: {resp.status_code} {resp.text}"
        resp = c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
        assert resp.status_code == 200 and resp.json() == {"released": True}, resp.text


# --- required headers ------------------------------------------------------------------------

MISSING = object()
BAD_UUIDS = {
    "missing": MISSING,
    "empty": "",
    "word": "not-a-uuid",
    "number": "12345",
    "non-hex": "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
    "too-long": str(uuid.uuid4()) + "0",
    "too-short": str(uuid.uuid4())[:-1],
    "sql": "' OR 1=1 --",
    "huge": "a" * 8192,
    "two-uuids": f"{uuid.uuid4()}, {uuid.uuid4()}",
}


def with_header(headers: dict[str, str], name: str, value: object) -> dict[str, str]:
    out = dict(headers)
    if value is MISSING:
        out.pop(name, None)
    else:
        assert isinstance(value, str)
        out[name] = value
    return out


@pytest.mark.parametrize("bad", sorted(BAD_UUIDS))
@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_bad_lock_token_on_held_lock_is_400(server: ServerProcess, held: Held, method: str,
                                            bad: str) -> None:
    headers = with_header(lock_headers(held.token), "X-Lock-Token", BAD_UUIDS[bad])
    body = {"ttl_seconds": 3600} if method != "DELETE" else None
    with api(server) as c:
        resp = c.request(method, f"/v1/locks/{held.name}/lease", headers=headers, json=body)
    assert_invalid(resp)
    held.assert_unchanged()


@pytest.mark.parametrize("bad", sorted(BAD_UUIDS))
def test_bad_lock_token_on_free_lock_is_400(server: ServerProcess, free: str, bad: str) -> None:
    headers = with_header(lock_headers(), "X-Lock-Token", BAD_UUIDS[bad])
    with api(server) as c:
        resp = c.put(f"/v1/locks/{free}/lease", headers=headers, json={"ttl_seconds": 30})
    assert_invalid(resp)


@pytest.mark.parametrize("bad", sorted(BAD_UUIDS))
@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_bad_request_id_from_the_owner_is_400(server: ServerProcess, held: Held, method: str,
                                              bad: str) -> None:
    headers = with_header(lock_headers(held.token), "X-Request-Id", BAD_UUIDS[bad])
    with api(server) as c:
        resp = c.request(method, f"/v1/locks/{held.name}/lease", headers=headers,
                         json={"ttl_seconds": 3600})
    assert_invalid(resp)
    held.assert_unchanged()


@pytest.mark.parametrize("bad", sorted(BAD_UUIDS))
def test_bad_request_id_on_free_lock_is_400(server: ServerProcess, free: str, bad: str) -> None:
    headers = with_header(lock_headers(), "X-Request-Id", BAD_UUIDS[bad])
    with api(server) as c:
        resp = c.put(f"/v1/locks/{free}/lease", headers=headers, json={"ttl_seconds": 30})
    assert_invalid(resp)


# --- malformed JSON --------------------------------------------------------------------------

BAD_JSON = {
    "empty": b"",
    "whitespace": b"   ",
    "open-brace": b"{",
    "close-brace": b"}",
    "truncated": b'{"ttl_seconds": ',
    "single-quotes": b"{'ttl_seconds': 30}",
    "form-encoded": b"ttl_seconds=30",
    "trailing-comma": b'{"ttl_seconds": 30,}',
    "missing-colon": b'{"ttl_seconds" 30}',
    "nan": b'{"ttl_seconds": NaN}',
    "infinity": b'{"ttl_seconds": Infinity}',
    "leading-zero": b'{"ttl_seconds": 030}',
    "hex": b'{"ttl_seconds": 0x1e}',
    "plus-sign": b'{"ttl_seconds": +30}',
    "two-documents": b'{"ttl_seconds": 30} {"ttl_seconds": 30}',
    "trailing-garbage": b'{"ttl_seconds": 30}garbage',
    "invalid-utf8": b'{"ttl_seconds": 30, "operation": "\xff\xfe"}',
    "nul": b"\x00",
    # Not JSON whitespace (RFC 8259 allows only space, tab, LF and CR), though
    # Python's bytes.strip() takes them for it.
    "vertical-tab": b"\x0b",
    "form-feed": b"\x0c",
    "object-after-form-feed": b'\x0c{"ttl_seconds": 30}',
    "unterminated-string": b'{"ttl_seconds": 30, "operation": "dep',
    "comment": b'{"ttl_seconds": 30 /* ttl */}',
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_malformed_json_acquire_is_400(server: ServerProcess, free: str, case: str) -> None:
    with api(server) as c:
        resp = c.put(f"/v1/locks/{free}/lease", headers=lock_headers(),
                     content=BAD_JSON[case], )
    assert_invalid(resp)


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_malformed_json_renew_is_400(server: ServerProcess, held: Held, case: str) -> None:
    with api(server) as c:
        resp = c.patch(f"/v1/locks/{held.name}/lease", headers=lock_headers(held.token),
                       content=BAD_JSON[case].replace(b"30", b"3600"))
    assert_invalid(resp)
    held.assert_unchanged()


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_malformed_json_create_key_is_400(server: ServerProcess, case: str) -> None:
    before = key_listing(server)
    body = BAD_JSON[case].replace(b'"ttl_seconds": 30', b'"role": "admin"')
    with api(server) as c:
        resp = c.post("/v1/keys", content=body, headers={"Content-Type": "application/json"})
    assert_invalid(resp)
    assert key_listing(server) == before


# --- validation of acquire -------------------------------------------------------------------

T = {"ttl_seconds": 30}
ACQUIRE_422: dict[str, tuple[dict[str, Any] | bytes, tuple[str, ...]]] = {
    "ttl-missing": ({}, ("ttl_seconds",)),
    "ttl-string": ({"ttl_seconds": "30"}, ("ttl_seconds",)),
    "ttl-bool": ({"ttl_seconds": True}, ("ttl_seconds",)),
    "ttl-float": ({"ttl_seconds": 5.5}, ("ttl_seconds",)),
    "ttl-null": ({"ttl_seconds": None}, ("ttl_seconds",)),
    "ttl-list": ({"ttl_seconds": [30]}, ("ttl_seconds",)),
    "ttl-object": ({"ttl_seconds": {"s": 30}}, ("ttl_seconds",)),
    "ttl-4": ({"ttl_seconds": 4}, ("ttl_seconds",)),
    "ttl-0": ({"ttl_seconds": 0}, ("ttl_seconds",)),
    "ttl-negative": ({"ttl_seconds": -30}, ("ttl_seconds",)),
    "ttl-7776001": ({"ttl_seconds": 7776001}, ("ttl_seconds",)),
    "ttl-10e30": ({"ttl_seconds": 10**30}, ("ttl_seconds",)),
    "ttl-minus-10e30": ({"ttl_seconds": -(10**30)}, ("ttl_seconds",)),
    "ttl-2e64": ({"ttl_seconds": 2**64}, ("ttl_seconds",)),
    "ttl-1e400": (b'{"ttl_seconds": 1e400}', ("ttl_seconds",)),
    "wait-negative": ({**T, "wait_seconds": -1}, ("wait_seconds",)),
    "wait-tiny-negative": ({**T, "wait_seconds": -0.001}, ("wait_seconds",)),
    "wait-301": ({**T, "wait_seconds": 301}, ("wait_seconds",)),
    "wait-300.5": ({**T, "wait_seconds": 300.5}, ("wait_seconds",)),
    "wait-string": ({**T, "wait_seconds": "5"}, ("wait_seconds",)),
    "wait-bool": ({**T, "wait_seconds": True}, ("wait_seconds",)),
    "wait-list": ({**T, "wait_seconds": [1]}, ("wait_seconds",)),
    "wait-1e400": (b'{"ttl_seconds": 30, "wait_seconds": 1e400}', ("wait_seconds",)),
    "wait-minus-1e400": (b'{"ttl_seconds": 30, "wait_seconds": -1e400}', ("wait_seconds",)),
    "operation-empty": ({**T, "operation": ""}, ("operation",)),
    "operation-65": ({**T, "operation": "x" * 65}, ("operation",)),
    "operation-65-unicode": ({**T, "operation": "\u00e9" * 65}, ("operation",)),
    "operation-int": ({**T, "operation": 5}, ("operation",)),
    "operation-list": ({**T, "operation": ["deploy"]}, ("operation",)),
    "operation-object": ({**T, "operation": {"name": "deploy"}}, ("operation",)),
    "metadata-string": ({**T, "metadata": "host=a"}, ("metadata",)),
    "metadata-list": ({**T, "metadata": [1, 2]}, ("metadata",)),
    "metadata-int": ({**T, "metadata": 5}, ("metadata",)),
    "metadata-bool": ({**T, "metadata": True}, ("metadata",)),
    "metadata-big-string": ({**T, "metadata": {"pad": "x" * 4200}}, ("metadata",)),
    "metadata-many-keys": ({**T, "metadata": {f"k{i:04d}": i for i in range(600)}},
                           ("metadata",)),
    "metadata-big-unicode": ({**T, "metadata": {"pad": "\u20ac" * 1500}}, ("metadata",)),
    "on-expiry-word": ({**T, "on_expiry": "forever"}, ("on_expiry",)),
    "on-expiry-empty": ({**T, "on_expiry": ""}, ("on_expiry",)),
    "on-expiry-upper": ({**T, "on_expiry": "RELEASE"}, ("on_expiry",)),
    "on-expiry-int": ({**T, "on_expiry": 1}, ("on_expiry",)),
    "on-expiry-bool": ({**T, "on_expiry": True}, ("on_expiry",)),
    "unknown-ttl-alone": ({"ttl": 30}, ("ttl",)),
    "unknown-ttl-extra": ({**T, "ttl": 30}, ("ttl",)),
    "unknown-camel": ({**T, "waitSeconds": 5}, ("waitSeconds",)),
    "unknown-typo": ({**T, "metdata": {}}, ("metdata",)),
    "unknown-lock-token": ({**T, "lock_token": str(uuid.uuid4())}, ("lock_token",)),
    "unknown-fencing-token": ({**T, "fencing_token": 1}, ("fencing_token",)),
    "two-range": ({"ttl_seconds": 4, "wait_seconds": 301}, ("ttl_seconds", "wait_seconds")),
    "two-type": ({"ttl_seconds": "x", "operation": ""}, ("ttl_seconds", "operation")),
    "two-unknown": ({**T, "ttl": 1, "wait": 2}, ("ttl", "wait")),
    "four-mixed": ({"ttl_seconds": 30, "ttl": 30, "on_expiry": "never", "metadata": [],
                    "operation": 7}, ("ttl", "on_expiry", "metadata", "operation")),
}


def encode(body: dict[str, Any] | bytes) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.mark.parametrize("case", sorted(ACQUIRE_422))
def test_acquire_validation_on_free_lock(server: ServerProcess, free: str, case: str) -> None:
    body, fields = ACQUIRE_422[case]
    with api(server) as c:
        resp = c.put(f"/v1/locks/{free}/lease", headers=lock_headers(), content=encode(body))
    assert_validation(resp, *fields)


@pytest.mark.parametrize("who", ["owner", "other"])
@pytest.mark.parametrize("case", ["ttl-string", "ttl-4", "ttl-1e400", "wait-301",
                                  "operation-65", "metadata-list", "on-expiry-word",
                                  "unknown-ttl-extra", "four-mixed"])
def test_acquire_validation_on_held_lock(server: ServerProcess, held: Held, case: str,
                                         who: str) -> None:
    body, fields = ACQUIRE_422[case]
    token = held.token if who == "owner" else new_token()
    with api(server) as c:
        resp = c.put(f"/v1/locks/{held.name}/lease", headers=lock_headers(token),
                     content=encode(body))
    assert_validation(resp, *fields)
    held.assert_unchanged()


ACQUIRE_OK = {
    "ttl-5": {"ttl_seconds": 5},
    "ttl-7776000": {"ttl_seconds": 7776000},
    "wait-0": {**T, "wait_seconds": 0},
    "wait-300": {**T, "wait_seconds": 300},
    "wait-fraction": {**T, "wait_seconds": 0.25},
    "operation-1": {**T, "operation": "d"},
    "operation-64": {**T, "operation": "x" * 64},
    "operation-64-unicode": {**T, "operation": "\u00e9" * 64},
    "metadata-empty": {**T, "metadata": {}},
    "metadata-3000": {**T, "metadata": {"host": "h" * 3000, "pid": 1, "nested": {"a": [1]}}},
    "on-expiry-keep": {**T, "on_expiry": "keep"},
    "on-expiry-release": {**T, "on_expiry": "release"},
    "all-fields": {"ttl_seconds": 60, "wait_seconds": 1, "operation": "deploy",
                   "metadata": {"job": "https://ci/1"}, "on_expiry": "keep"},
}


@pytest.mark.parametrize("case", sorted(ACQUIRE_OK))
def test_acquire_accepts_boundary_values(server: ServerProcess, case: str) -> None:
    """The other side of every bound: validation must not over-reject."""
    name, token = unique_name("ok"), new_token()
    with api(server) as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json=ACQUIRE_OK[case])
        assert resp.status_code == 201, resp.text
        got = c.get(f"/v1/locks/{name}").json()
        assert got["held"] is True
        if "metadata" in ACQUIRE_OK[case]:
            assert got["metadata"] == ACQUIRE_OK[case]["metadata"]
        if "operation" in ACQUIRE_OK[case]:
            assert got["operation"] == ACQUIRE_OK[case]["operation"]
        c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})


NON_OBJECT_BODIES = {"array": b"[]", "array-of-body": b'[{"ttl_seconds": 30}]', "string": b'"x"',
                     "number": b"30", "null": b"null", "true": b"true"}


@pytest.mark.parametrize("case", sorted(NON_OBJECT_BODIES))
def test_non_object_json_body_acquire(server: ServerProcess, free: str, case: str) -> None:
    with api(server) as c:
        resp = c.put(f"/v1/locks/{free}/lease", headers=lock_headers(),
                     content=NON_OBJECT_BODIES[case])
    assert_error(resp, (400, 422))


@pytest.mark.parametrize("case", sorted(NON_OBJECT_BODIES))
def test_non_object_json_body_renew(server: ServerProcess, held: Held, case: str) -> None:
    with api(server) as c:
        resp = c.patch(f"/v1/locks/{held.name}/lease", headers=lock_headers(held.token),
                       content=NON_OBJECT_BODIES[case])
    assert_error(resp, (400, 422))
    held.assert_unchanged()


@pytest.mark.parametrize("case", sorted(NON_OBJECT_BODIES))
def test_non_object_json_body_create_key(server: ServerProcess, case: str) -> None:
    before = key_listing(server)
    with api(server) as c:
        resp = c.post("/v1/keys", content=NON_OBJECT_BODIES[case].replace(
            b'{"ttl_seconds": 30}', b'{"role": "admin"}'),
            headers={"Content-Type": "application/json"})
    assert_error(resp, (400, 422))
    assert key_listing(server) == before


# --- validation of renew ---------------------------------------------------------------------

RENEW_422: dict[str, tuple[dict[str, Any] | bytes, tuple[str, ...]]] = {
    "missing": ({}, ("ttl_seconds",)),
    "string": ({"ttl_seconds": "3600"}, ("ttl_seconds",)),
    "bool": ({"ttl_seconds": True}, ("ttl_seconds",)),
    "float": ({"ttl_seconds": 5.5}, ("ttl_seconds",)),
    "null": ({"ttl_seconds": None}, ("ttl_seconds",)),
    "4": ({"ttl_seconds": 4}, ("ttl_seconds",)),
    "0": ({"ttl_seconds": 0}, ("ttl_seconds",)),
    "negative": ({"ttl_seconds": -1}, ("ttl_seconds",)),
    "7776001": ({"ttl_seconds": 7776001}, ("ttl_seconds",)),
    "10e30": ({"ttl_seconds": 10**30}, ("ttl_seconds",)),
    "1e400": (b'{"ttl_seconds": 1e400}', ("ttl_seconds",)),
    "unknown-ttl": ({"ttl": 3600}, ("ttl",)),
    "unknown-extra": ({"ttl_seconds": 3600, "ttl": 3600}, ("ttl",)),
    "unknown-extend": ({"ttl_seconds": 3600, "extend_by": 10}, ("extend_by",)),
    "two": ({"ttl_seconds": 4, "ttl": 3600}, ("ttl_seconds", "ttl")),
}


@pytest.mark.parametrize("case", sorted(RENEW_422))
def test_renew_validation(server: ServerProcess, held: Held, case: str) -> None:
    body, fields = RENEW_422[case]
    with api(server) as c:
        resp = c.patch(f"/v1/locks/{held.name}/lease", headers=lock_headers(held.token),
                       content=encode(body))
    assert_validation(resp, *fields)
    held.assert_unchanged()


# --- names -----------------------------------------------------------------------------------

# {u} is replaced by a fresh valid name, so that a wrongly accepted name can be found again.
BAD_NAMES = {
    "too-long-129": "a" * 129,
    "too-long-129-unique": "{u}" + "x" * 129,
    "leading-dot": ".{u}",
    "leading-dash": "-{u}",
    "leading-underscore": "_{u}",
    "leading-colon": ":{u}",
    "dot": ".",
    "dot-dot": "..",
    "encoded-dot-dot": "%2E%2E",
    "space": "{u}%20b",
    "only-space": "%20",
    "leading-space": "%20{u}",
    "tab": "{u}%09",
    "newline": "{u}%0Ab",
    "trailing-newline": "{u}%0A",
    "crlf": "{u}%0D%0AX-Injected:%201",
    "nul": "{u}%00",
    "unicode": "{u}-%C3%BCber",
    "unicode-leading": "%C3%BCber-{u}",
    "arabic-digit": "%D9%A3{u}",
    "fullwidth-letter": "%EF%BC%A1{u}",
    "percent": "{u}%25",
    "question": "{u}%3Fx",
    "hash": "{u}%23x",
    "star": "{u}*",
    "at": "{u}@x",
    "plus": "{u}+x",
    "comma": "{u},x",
    "tilde": "{u}~x",
    "quote": "{u}%22",
    "backslash": "{u}%5Cx",
    "semicolon": "{u};x",
    "equals": "{u}=x",
}
BAD_NAMES_404_OK = {
    "encoded-slash": "{u}%2Fb",
    "empty": "",
    "encoded-traversal": "..%2F..%2Fkeys",
}
NAME_ROUTES = ["PUT lease", "PATCH lease", "DELETE lease", "GET lock", "DELETE lock"]


def name_request(server: ServerProcess, route: str, segment: str, token: str) -> httpx.Response:
    method, what = route.split()
    path = f"/v1/locks/{segment}" + ("/lease" if what == "lease" else "")
    headers: dict[str, str] = {}
    body = None
    if what == "lease":
        headers = lock_headers(token) if method != "DELETE" else {"X-Lock-Token": token}
        if method != "DELETE":
            body = json.dumps({"ttl_seconds": 60}).encode()
    return raw_request(server, method, path, headers, body)


def nothing_under(server: ServerProcess, prefix: str) -> None:
    with api(server) as c:
        resp = c.get("/v1/locks", params={"prefix": prefix})
    assert resp.status_code == 200, resp.text
    assert resp.json()["locks"] == [], f"a lock was created from a bad name: {resp.json()}"


@pytest.mark.parametrize("case", sorted(BAD_NAMES))
@pytest.mark.parametrize("route", NAME_ROUTES)
def test_bad_name_is_422(server: ServerProcess, held: Held, route: str, case: str) -> None:
    u = unique_name("n")
    resp = name_request(server, route, BAD_NAMES[case].format(u=u), held.token)
    assert_validation(resp, "key")
    nothing_under(server, u)
    held.assert_unchanged()


@pytest.mark.parametrize("case", sorted(BAD_NAMES_404_OK))
@pytest.mark.parametrize("route", NAME_ROUTES)
def test_unroutable_name_is_404_or_422(server: ServerProcess, held: Held, route: str,
                                       case: str) -> None:
    u = unique_name("n")
    resp = name_request(server, route, BAD_NAMES_404_OK[case].format(u=u), held.token)
    assert_error(resp, (404, 422))
    nothing_under(server, u)
    held.assert_unchanged()


GOOD_NAMES = ["a" * 128, "A", "0", "9-._:", "a.b:c-d_e", "x..y", "trailing.", "Z:"]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_are_accepted(server: ServerProcess, name: str) -> None:
    token = new_token()
    suffix = uuid.uuid4().hex[:8] if len(name) < 100 else ""
    full = name + suffix if name[-1] not in ".:" else name
    resp = name_request(server, "GET lock", full, token)
    assert resp.status_code == 200, resp.text
    assert resp.json()["held"] is False and resp.json()["key"] == full
    resp = name_request(server, "PUT lease", full, token)
    assert resp.status_code in (201, 409), resp.text  # 409: fixed name held by an earlier run
    if resp.status_code == 201:
        assert resp.json()["key"] == full
        resp = name_request(server, "DELETE lease", full, token)
        assert resp.status_code == 200 and resp.json() == {"released": True}, resp.text


# --- listing ---------------------------------------------------------------------------------

LIST_422 = {
    "limit-0": ({"limit": "0"}, "limit"),
    "limit-1001": ({"limit": "1001"}, "limit"),
    "limit-negative": ({"limit": "-5"}, "limit"),
    "limit-word": ({"limit": "abc"}, "limit"),
    "limit-float": ({"limit": "1.5"}, "limit"),
    "limit-empty": ({"limit": ""}, "limit"),
    "limit-huge": ({"limit": str(10**30)}, "limit"),
    "unknown-param": ({"foo": "1"}, "foo"),
    "unknown-case": ({"Limit": "5"}, "Limit"),
    "unknown-typo": ({"prefx": "a"}, "prefx"),
}


@pytest.mark.parametrize("case", sorted(LIST_422))
def test_list_bad_query_is_422(server: ServerProcess, held: Held, case: str) -> None:
    params, field = LIST_422[case]
    with api(server) as c:
        resp = c.get("/v1/locks", params=params)
    assert_validation(resp, field)
    held.assert_unchanged()


@pytest.mark.parametrize("after", ["%%%", "x" * 5000, "\x00", "'; DROP TABLE locks; --",
                                   "\u00fc", "-1", "null"])
def test_list_garbage_cursor_is_4xx_or_ignored(server: ServerProcess, after: str) -> None:
    with api(server) as c:
        resp = c.get("/v1/locks", params={"after": after})
    if resp.status_code != 200:
        assert_error(resp, (400, 422))


@pytest.mark.parametrize("prefix", ["x" * 5000, "\x00", "%", "_", "a%", "\u00fc"])
def test_list_odd_prefix_never_500(server: ServerProcess, held: Held, prefix: str) -> None:
    with api(server) as c:
        resp = c.get("/v1/locks", params={"prefix": prefix})
    if resp.status_code == 200:
        assert all(lock["key"].startswith(prefix) for lock in resp.json()["locks"]), \
            "prefix treated as a pattern (LIKE wildcard?)"
    else:
        assert_error(resp, (400, 422))


@pytest.mark.parametrize("limit", ["1", "1000"])
def test_list_limit_bounds_accepted(server: ServerProcess, held: Held, limit: str) -> None:
    with api(server) as c:
        resp = c.get("/v1/locks", params={"limit": limit})
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["locks"]) <= int(limit)


# --- keys ------------------------------------------------------------------------------------

R = {"role": "reader"}
KEYS_422: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "role-missing": ({}, ("role",)),
    "role-unknown": ({"role": "root"}, ("role",)),
    "role-case": ({"role": "Admin"}, ("role",)),
    "role-int": ({"role": 1}, ("role",)),
    "role-null": ({"role": None}, ("role",)),
    "role-list": ({"role": ["admin"]}, ("role",)),
    "name-empty": ({**R, "name": ""}, ("name",)),
    "name-129": ({**R, "name": "n" * 129}, ("name",)),
    "name-int": ({**R, "name": 5}, ("name",)),
    "expires-0": ({**R, "expires_in_seconds": 0}, ("expires_in_seconds",)),
    "expires-negative": ({**R, "expires_in_seconds": -1}, ("expires_in_seconds",)),
    "expires-string": ({**R, "expires_in_seconds": "60"}, ("expires_in_seconds",)),
    "expires-float": ({**R, "expires_in_seconds": 1.5}, ("expires_in_seconds",)),
    "expires-bool": ({**R, "expires_in_seconds": True}, ("expires_in_seconds",)),
    "expires-too-big": ({**R, "expires_in_seconds": 315360001}, ("expires_in_seconds",)),
    "expires-10e30": ({**R, "expires_in_seconds": 10**30}, ("expires_in_seconds",)),
    "allow-string": ({**R, "allow_ips": "10.0.0.0/8"}, ("allow_ips",)),
    "allow-garbage": ({**R, "allow_ips": ["not-an-ip"]}, ("allow_ips",)),
    "allow-prefix-33": ({**R, "allow_ips": ["10.0.0.0/33"]}, ("allow_ips",)),
    "allow-octet-300": ({**R, "allow_ips": ["300.1.1.1"]}, ("allow_ips",)),
    "allow-v6-129": ({**R, "allow_ips": ["::1/129"]}, ("allow_ips",)),
    "allow-int": ({**R, "allow_ips": [5]}, ("allow_ips",)),
    "allow-object": ({**R, "allow_ips": {"ip": "10.0.0.1"}}, ("allow_ips",)),
    "allow-empty-string": ({**R, "allow_ips": [""]}, ("allow_ips",)),
    "allow-65": ({**R, "allow_ips": [f"10.0.{i}.0/24" for i in range(65)]}, ("allow_ips",)),
    "quota-0": ({**R, "rpm_quota": 0}, ("rpm_quota",)),
    "quota-negative": ({**R, "rpm_quota": -1}, ("rpm_quota",)),
    "quota-too-big": ({**R, "rpm_quota": 1000001}, ("rpm_quota",)),
    "quota-float": ({**R, "rpm_quota": 1.5}, ("rpm_quota",)),
    "quota-string": ({**R, "rpm_quota": "5"}, ("rpm_quota",)),
    "quota-bool": ({**R, "rpm_quota": True}, ("rpm_quota",)),
    "unknown-project": ({**R, "project": "other"}, ("project",)),
    "unknown-rpm": ({**R, "rpm": 5}, ("rpm",)),
    "unknown-expires": ({**R, "expires_in": 60}, ("expires_in",)),
    "unknown-key": ({**R, "key": "fp_chosen_secret_0123456789abcdef0123"}, ("key",)),
    "unknown-id": ({**R, "id": "x"}, ("id",)),
    "two": ({"role": "god", "rpm_quota": 0}, ("role", "rpm_quota")),
    "three": ({"role": "reader", "name": "", "expires_in_seconds": -5, "allow_ip": []},
              ("name", "expires_in_seconds", "allow_ip")),
}


@pytest.mark.parametrize("case", sorted(KEYS_422))
def test_create_key_validation(server: ServerProcess, case: str) -> None:
    body, fields = KEYS_422[case]
    before = key_listing(server)
    with api(server) as c:
        resp = c.post("/v1/keys", json=body)
    assert_validation(resp, *fields)
    assert key_listing(server) == before


KEYS_OK = {
    "name-128": {**R, "name": "n" * 128},
    "expires-max": {**R, "expires_in_seconds": 315360000},
    "expires-1": {**R, "expires_in_seconds": 1},
    "quota-1": {**R, "rpm_quota": 1},
    "quota-max": {**R, "rpm_quota": 1000000},
    "allow-64": {**R, "allow_ips": [f"10.0.{i}.0/24" for i in range(64)]},
    "allow-v6": {**R, "allow_ips": ["2001:db8::/32", "::1"]},
    "all-roles-admin": {"role": "admin"},
    "all-roles-member": {"role": "member"},
}


@pytest.mark.parametrize("case", sorted(KEYS_OK))
def test_create_key_accepts_boundary_values(server: ServerProcess, case: str) -> None:
    with api(server) as c:
        resp = c.post("/v1/keys", json=KEYS_OK[case])
        assert resp.status_code == 201, resp.text
        assert resp.json()["role"] == KEYS_OK[case]["role"]
        assert c.delete(f"/v1/keys/{resp.json()['id']}").status_code == 200


BAD_KEY_IDS = ["a" * 300, "%00", "..", "%2E%2E", "%20", "'%20OR%201=1%20--", "%C3%BC",
               "-1", "0", "%25", "*", "null"]


@pytest.mark.parametrize("key_id", BAD_KEY_IDS)
def test_revoke_bad_key_id_is_404_or_422(server: ServerProcess, key_id: str) -> None:
    before = key_listing(server)
    resp = raw_request(server, "DELETE", f"/v1/keys/{key_id}")
    err = assert_error(resp, (404, 422))
    if resp.status_code == 422:
        assert "id" in detail_fields(err)
    assert key_listing(server) == before


def test_revoke_unknown_key_id_is_404(server: ServerProcess) -> None:
    real = server.create_key("reader")
    other = real["id"][:-1] + ("1" if real["id"][-1] != "1" else "2")
    before = key_listing(server)
    with api(server) as c:
        assert_error(c.delete(f"/v1/keys/{other}"), 404, "not_found")
    assert key_listing(server) == before
    with api(server, real["key"]) as c:
        assert c.get("/v1/whoami").status_code == 200


# --- hostile input ---------------------------------------------------------------------------

ROUTES = ["PUT lease", "PATCH lease", "DELETE lease", "GET lock", "DELETE lock", "GET locks",
          "POST keys", "GET keys", "DELETE key"]


def route_request(c: httpx.Client, route: str, name: str, token: str, key_id: str,
                  headers: dict[str, str]) -> httpx.Response:
    if route == "PUT lease":
        return c.put(f"/v1/locks/{name}/lease", headers={**lock_headers(token), **headers},
                     json={"ttl_seconds": 3600})
    if route == "PATCH lease":
        return c.patch(f"/v1/locks/{name}/lease", headers={**lock_headers(token), **headers},
                       json={"ttl_seconds": 3600})
    if route == "DELETE lease":
        return c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token, **headers})
    if route == "GET lock":
        return c.get(f"/v1/locks/{name}", headers=headers)
    if route == "DELETE lock":
        return c.request("DELETE", f"/v1/locks/{name}", headers=headers)
    if route == "GET locks":
        return c.get("/v1/locks", headers=headers)
    if route == "POST keys":
        return c.post("/v1/keys", headers=headers, json={"role": "reader"})
    if route == "GET keys":
        return c.get("/v1/keys", headers=headers)
    return c.delete(f"/v1/keys/{key_id}", headers=headers)


@pytest.mark.parametrize("route", ROUTES)
def test_long_authorization_header_is_401(server: ServerProcess, held: Held, route: str) -> None:
    victim = server.create_key("reader")
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        resp = route_request(c, route, held.name, held.token, victim["id"],
                             {"Authorization": "Bearer " + "k" * 8000})
    assert_error(resp, 401, "unauthorized")
    held.assert_unchanged()
    with api(server, victim["key"]) as c:
        assert c.get("/v1/whoami").status_code == 200


@pytest.mark.parametrize("route", ROUTES)
def test_long_request_id_never_500(server: ServerProcess, held: Held, route: str) -> None:
    """8 KB X-Request-Id: a UUID-only route says 400; elsewhere any non-5xx answer."""
    # only the renew targets the held lock; a release or force release may rightly succeed
    name = held.name if route == "PATCH lease" else unique_name("rid")
    token = held.token if route == "PATCH lease" else new_token()
    with api(server) as c:
        resp = route_request(c, route, name, token, "no-such-id", {"X-Request-Id": "r" * 8000})
    assert resp.status_code < 500, resp.text
    if route in ("PUT lease", "PATCH lease"):
        assert_invalid(resp)
    held.assert_unchanged()


def test_oversized_header_block_is_4xx(server: ServerProcess, held: Held) -> None:
    head = (f"PATCH /v1/locks/{held.name}/lease HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {server.admin_key}\r\nX-Lock-Token: {held.token}\r\n"
            f"X-Request-Id: {'r' * 200_000}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 21\r\n\r\n" + '{"ttl_seconds": 3600}').encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may refuse before reading everything; its answer is still due
        data = b""
        while b"\r\n" not in data:
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                break  # reset before (or instead of) an answer
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 4"), f"no 4xx answer: {data[:200]!r}"
    held.assert_unchanged()


@pytest.mark.parametrize("field", ["operation", "metadata-value", "metadata-key"])
def test_nul_bytes_in_json_strings(server: ServerProcess, field: str) -> None:
    name, token = unique_name("nul"), new_token()
    body: dict[str, Any] = {"ttl_seconds": 30}
    if field == "operation":
        body["operation"] = "de\u0000ploy"
    elif field == "metadata-value":
        body["metadata"] = {"host": "a\u0000b"}
    else:
        body["metadata"] = {"a\u0000b": 1}
    with api(server) as c:
        # SPEC §2: U+0000 in any string is 422 on both stores (tests/http/test_nul_strings.py
        # runs every such field on both).
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token), json=body)
        assert_error(resp, 422, "validation_error")
        assert state(server, name)["held"] is False


@pytest.mark.parametrize("case", ["lone-surrogate-operation", "lone-surrogate-metadata"])
def test_lone_surrogates_never_500(server: ServerProcess, case: str) -> None:
    name, token = unique_name("sur"), new_token()
    body = (b'{"ttl_seconds": 30, "operation": "a\\ud800b"}' if case.endswith("operation")
            else b'{"ttl_seconds": 30, "metadata": {"k": "\\udfff"}}')
    with api(server) as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token), content=body)
        if resp.status_code == 201:
            got = c.get(f"/v1/locks/{name}")
            assert got.status_code == 200, got.text
            c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
        else:
            assert_error(resp, (400, 422))


DEEP = 10_000
HOSTILE_BODIES = {
    "deep-metadata-objects": b'{"ttl_seconds": 30, "metadata": ' + b'{"a":' * DEEP + b"1"
                             + b"}" * DEEP + b"}",
    "deep-metadata-arrays": b'{"ttl_seconds": 30, "metadata": {"a": ' + b"[" * DEEP
                            + b"]" * DEEP + b"}}",
    "deep-top-level": b"[" * DEEP + b"]" * DEEP,
    "deep-unterminated": b"[" * 30_000,
    "huge-integer": b'{"ttl_seconds": 1' + b"0" * 5000 + b"}",
    "huge-exponent": b'{"ttl_seconds": 1e999999999999}',
    "many-unknown-fields": json.dumps({"ttl_seconds": 30,
                                       **{f"f{i}": i for i in range(3000)}}).encode(),
    "array-body": b'[{"ttl_seconds": 30}]',
    "deep-operation": b'{"ttl_seconds": 30, "operation": ' + b"[" * DEEP + b"]" * DEEP + b"}",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_BODIES))
@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_hostile_lease_bodies_are_4xx(server: ServerProcess, held: Held, method: str,
                                      case: str) -> None:
    body = HOSTILE_BODIES[case]
    assert len(body) <= 64 * 1024
    name = unique_name("hostile") if method == "PUT" else held.name
    with api(server) as c:
        resp = c.request(method, f"/v1/locks/{name}/lease", headers=lock_headers(held.token),
                         content=body)
    assert_4xx(resp)
    if resp.status_code == 422:
        detail_fields(assert_error(resp, 422))
    held.assert_unchanged()
    if method == "PUT":
        assert state(server, name)["held"] is False


@pytest.mark.parametrize("case", sorted(HOSTILE_BODIES))
def test_hostile_key_bodies_are_4xx(server: ServerProcess, case: str) -> None:
    before = key_listing(server)
    body = HOSTILE_BODIES[case].replace(b'"ttl_seconds": 30', b'"role": "admin"')
    with api(server) as c:
        resp = c.post("/v1/keys", content=body, headers={"Content-Type": "application/json"})
    assert_4xx(resp)
    assert key_listing(server) == before


def test_long_but_valid_number_literal_is_accepted_or_4xx(server: ServerProcess) -> None:
    """wait_seconds = 0.000…01 (5000 digits) is in range: accepted, or refused as a 4xx."""
    name, token = unique_name("digits"), new_token()
    body = b'{"ttl_seconds": 30, "wait_seconds": 0.' + b"0" * 5000 + b"1}"
    with api(server) as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token), content=body)
        if resp.status_code == 201:
            assert state(server, name)["held"] is True
            c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
        else:
            assert_4xx(resp)


def test_many_bad_requests_in_a_row_do_not_break_the_server(server: ServerProcess,
                                                            held: Held) -> None:
    with api(server) as c:
        for i in range(200):
            body = list(BAD_JSON.values())[i % len(BAD_JSON)]
            resp = c.patch(f"/v1/locks/{held.name}/lease", headers=lock_headers(held.token),
                           content=body)
            assert resp.status_code == 400, resp.text
    held.assert_unchanged()


# --- integral numbers and repeated keys (SPEC §2 "Bad input") --------------------------------


def pool_config(server: ServerProcess, name: str) -> dict[str, Any]:
    with api(server) as c:
        resp = c.get(f"/v1/pools/{name}")
    assert resp.status_code == 200, resp.text
    body = dict(resp.json())
    return {k: body[k] for k in ("limit", "queue_size", "queue_timeout_ms", "term_ms",
                                 "renew_interval_ms", "request_timeout_ms", "rpm", "adaptive",
                                 "min_limit")}


def pool_stats(server: ServerProcess, name: str) -> tuple[int, dict[str, Any]]:
    with api(server) as c:
        resp = c.get(f"/v1/pools/{name}")
    assert resp.status_code == 200, resp.text
    return int(resp.json()["in_use"]), dict(resp.json()["stats"])


@pytest.fixture
def pool(server: ServerProcess) -> str:
    name = unique_name("pool")
    with api(server) as c:
        resp = c.put(f"/v1/pools/{name}", json={"limit": 2})
    assert resp.status_code == 201, resp.text
    return name


def take_slot(server: ServerProcess, pool: str) -> str:
    with api(server) as c:
        resp = c.post(f"/v1/pools/{pool}/lock/acquire")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["slot_id"])


@pytest.mark.parametrize("number", ["60.0", "6e1", "6.0E+1", "600e-1"])
def test_integral_number_is_an_integer_on_acquire_and_renew(server: ServerProcess,
                                                            number: str) -> None:
    name, token = unique_name("integral"), new_token()
    with api(server) as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     content=b'{"ttl_seconds": %s, "wait_seconds": 0}' % number.encode())
        assert resp.status_code == 201, resp.text
        granted = resp.json()
        assert _seconds_between(granted["acquired_at"], granted["expires_at"]) == 60
        resp = c.patch(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                       content=b'{"ttl_seconds": 1%s}' % number.encode().replace(b"6", b"2", 1))
        assert resp.status_code == 200, resp.text  # 120 seconds from now
        assert state(server, name)["expires_at"] == resp.json()["expires_at"]
        c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})


def _seconds_between(start: str, end: str) -> float:
    def parse(at: str) -> datetime:
        return datetime.fromisoformat(at.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()


@pytest.mark.parametrize("number", ["60.5", "6.01e1", "60.000001"])
def test_non_integral_number_is_still_422(server: ServerProcess, held: Held, free: str,
                                          number: str) -> None:
    body = b'{"ttl_seconds": %s}' % number.encode()
    with api(server) as c:
        assert_validation(c.put(f"/v1/locks/{free}/lease", headers=lock_headers(), content=body),
                          "ttl_seconds")
        assert_validation(c.patch(f"/v1/locks/{held.name}/lease",
                                  headers=lock_headers(held.token), content=body), "ttl_seconds")
    held.assert_unchanged()


def test_integral_numbers_on_pool_keys_and_slot_routes(server: ServerProcess) -> None:
    name = unique_name("intpool")
    with api(server) as c:
        resp = c.put(f"/v1/pools/{name}", content=b'{"limit": 3.0, "term_ms": 4.5e4, '
                                                  b'"queue_size": 1e1}')
        assert resp.status_code == 201, resp.text
        config = pool_config(server, name)
        assert (config["limit"], config["term_ms"], config["queue_size"]) == (3, 45_000, 10)
        resp = c.post(f"/v1/pools/{name}/lock/acquire", content=b'{"wait_ms": 1e2}')
        assert resp.status_code == 200, resp.text
        slot = resp.json()["slot_id"]
        resp = c.post(f"/v1/pools/{name}/lock/{slot}/release",
                      content=b'{"status": 429.0, "throttled": 1.0, '
                              b'"rate": {"limit": 1e2, "remaining": 0.0}}')
        assert resp.status_code == 200 and resp.json() == {"released": True}, resp.text
        stats = pool_stats(server, name)[1]
        assert stats["status_429"] == 1 and stats["throttled"] == 1, stats
        resp = c.post("/v1/keys", content=b'{"role": "reader", "rpm_quota": 6e1, '
                                          b'"expires_in_seconds": 3600.0}')
        assert resp.status_code == 201, resp.text
        assert resp.json()["rpm_quota"] == 60
        assert c.delete(f"/v1/keys/{resp.json()['id']}").status_code == 200


# Each body repeats one key, at the top or nested; the rest of it would be valid.
REPEATED_ACQUIRE = {
    "top": b'{"ttl_seconds": 5, "ttl_seconds": 3000}',
    "top-same-value": b'{"ttl_seconds": 30, "ttl_seconds": 30}',
    "top-apart": b'{"ttl_seconds": 30, "operation": "a", "on_expiry": "keep", "operation": "b"}',
    "metadata": b'{"ttl_seconds": 30, "metadata": {"host": "a", "host": "b"}}',
    "metadata-deep": b'{"ttl_seconds": 30, "metadata": {"a": [{"b": {"c": 1, "c": 1}}]}}',
    "metadata-url": b'{"ttl_seconds": 30, "metadata": {"job": "https://ci/1", "job": "x"}}',
    "whole-metadata": b'{"ttl_seconds": 30, "metadata": {"a": 1}, "metadata": {"a": 1}}',
    "with-bad-field": b'{"ttl_seconds": 4, "ttl_seconds": 30}',
    "with-unknown-field": b'{"ttl": 30, "ttl_seconds": 30, "ttl": 30}',
    "escaped-spelling": b'{"ttl_seconds": 30, "ttl_second\\u0073": 3000}',
    "integral": b'{"ttl_seconds": 30.0, "ttl_seconds": 6e1}',
}


def assert_repeated_key(resp: httpx.Response) -> None:
    err = assert_error(resp, 400, "invalid_request")
    assert "repeat" in err["message"], err


@pytest.mark.parametrize("case", sorted(REPEATED_ACQUIRE))
def test_repeated_key_on_acquire_is_400(server: ServerProcess, free: str, held: Held,
                                        case: str) -> None:
    with api(server) as c:
        assert_repeated_key(c.put(f"/v1/locks/{free}/lease", headers=lock_headers(),
                                  content=REPEATED_ACQUIRE[case]))
        # the owner's retried acquire must not change its lease either
        assert_repeated_key(c.put(f"/v1/locks/{held.name}/lease",
                                  headers=lock_headers(held.token),
                                  content=REPEATED_ACQUIRE[case]))
    held.assert_unchanged()


@pytest.mark.parametrize("body", [b'{"ttl_seconds": 5, "ttl_seconds": 3000}',
                                  b'{"ttl_seconds": 3000, "ttl_seconds": 3000}',
                                  b'{"ttl_seconds": 3000, "ttl_seconds": 30.5}'])
def test_repeated_key_on_renew_is_400(server: ServerProcess, held: Held, body: bytes) -> None:
    with api(server) as c:
        assert_repeated_key(c.patch(f"/v1/locks/{held.name}/lease",
                                    headers=lock_headers(held.token), content=body))
    held.assert_unchanged()


@pytest.mark.parametrize("body", [
    b'{"limit": 5, "limit": 1}',
    b'{"limit": 1, "queue_size": 0, "adaptive": true, "queue_size": 0}',
    b'{"limit": 1, "rpm": 60, "rpm": null}',
])
def test_repeated_key_on_pool_put_is_400(server: ServerProcess, pool: str, body: bytes) -> None:
    before = pool_config(server, pool)
    with api(server) as c:
        assert_repeated_key(c.put(f"/v1/pools/{pool}", content=body))
        fresh = unique_name("pool")
        assert_repeated_key(c.put(f"/v1/pools/{fresh}", content=body))
        assert_error(c.get(f"/v1/pools/{fresh}"), 404, "not_found")
    assert pool_config(server, pool) == before


@pytest.mark.parametrize("body", [
    b'{"status": 200, "status": 429}',
    b'{"rate": {"remaining": 5, "remaining": 0}}',
    b'{"headers": {"retry-after": "1", "retry-after": "600"}}',
    b'{"status": 429, "rate": {"limit": 1}, "rate": {"limit": 1}}',
])
def test_repeated_key_on_slot_release_is_400(server: ServerProcess, pool: str,
                                             body: bytes) -> None:
    slot = take_slot(server, pool)
    before = pool_stats(server, pool)
    with api(server) as c:
        assert_repeated_key(c.post(f"/v1/pools/{pool}/lock/{slot}/release", content=body))
        assert pool_stats(server, pool) == before, "a refused release changed the pool"
        resp = c.post(f"/v1/pools/{pool}/lock/{slot}/renew")
        assert resp.status_code == 200, "the slot was released by a refused request"
        assert c.post(f"/v1/pools/{pool}/lock/{slot}/release").json() == {"released": True}


def test_repeated_key_on_slot_acquire_is_400(server: ServerProcess, pool: str) -> None:
    with api(server) as c:
        assert_repeated_key(c.post(f"/v1/pools/{pool}/lock/acquire",
                                   content=b'{"wait_ms": 0, "wait_ms": 1000}'))
    assert pool_stats(server, pool)[0] == 0, "a refused acquire took a slot"


@pytest.mark.parametrize("body", [
    b'{"role": "reader", "role": "admin"}',
    b'{"role": "admin", "name": "a", "name": "b"}',
    b'{"role": "reader", "allow_ips": ["10.0.0.0/8"], "allow_ips": []}',
    b'{"role": "reader", "rpm_quota": 5.0, "rpm_quota": 5}',
])
def test_repeated_key_on_create_key_is_400(server: ServerProcess, body: bytes) -> None:
    before = key_listing(server)
    with api(server) as c:
        assert_repeated_key(c.post("/v1/keys", content=body,
                                   headers={"Content-Type": "application/json"}))
    assert key_listing(server) == before


def test_colons_inside_strings_are_not_repeats(server: ServerProcess) -> None:
    """The cheap count that skips the exact parse must not refuse a body whose strings
    hold colons."""
    name, token = unique_name("colons"), new_token()
    metadata = {"job": "https://ci/1", "at": "12:30:00", "k:e:y": ["a:b", {"c:": ":"}]}
    with api(server) as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": 30, "operation": "a:b", "metadata": metadata})
        assert resp.status_code == 201, resp.text
        assert state(server, name)["metadata"] == metadata
        c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})


# Routes whose body may be left out: only an empty body is one left out; any
# other, whitespace included, must be JSON, and is refused before it acts.
NOT_A_BODY = [b" ", b" \t\r\n", b"\x0b", b"\x0c", b" \x0b ", b"\x1c", b"\xa0"]


@pytest.mark.parametrize("body", NOT_A_BODY)
def test_a_body_that_only_looks_blank_is_malformed_on_optional_body_routes(
        server: ServerProcess, pool: str, body: bytes) -> None:
    slot = take_slot(server, pool)
    before = pool_stats(server, pool)
    with api(server) as c:
        assert_invalid(c.post(f"/v1/pools/{pool}/lock/{slot}/release", content=body))
        assert_invalid(c.post(f"/v1/pools/{pool}/lock/{slot}/renew", content=body))
        assert_invalid(c.post(f"/v1/pools/{pool}/lock/acquire", content=body))
        assert_invalid(c.post("/v1/keys/refresh", content=body))
        assert pool_stats(server, pool) == before, "a refused request changed the pool"
        assert c.post(f"/v1/pools/{pool}/lock/{slot}/renew", content=b"").status_code == 200
        assert c.post(f"/v1/pools/{pool}/lock/{slot}/release",
                      content=b"").json() == {"released": True}
