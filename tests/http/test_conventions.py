"""Conventions every endpoint follows: request IDs, error envelopes, health, OpenAPI, body
limits (SPEC §2, §6, §7.7)."""

from __future__ import annotations

import json
import re
import socket
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from fencepost.server.wire import REQUEST_READ_S
from support import ServerProcess, assert_error, lock_headers, new_token, parse_at, unique_name

MAX_BODY = 64 * 1024
def raw_exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 10.0
                 ) -> tuple[int, dict[str, str], bytes]:
    """Sends `head` and `body` on a fresh socket, never more; reads one response.

    The socket's write side stays open, so the server cannot learn the body ended early."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        return read_response(sock)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        rest = rest[:length]
    return status, headers, rest


def request_head(server: ServerProcess, method: str, path: str, extra: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}",
             f"Authorization: Bearer {server.admin_key}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def lock_state(server: ServerProcess, name: str) -> dict[str, Any]:
    with server.client() as c:
        resp = c.get(f"/v1/locks/{name}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def assert_still_serving(server: ServerProcess) -> None:
    name, token = unique_name("alive"), new_token()
    with server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": 30})
        assert resp.status_code == 201, resp.text
        resp = c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
        assert resp.status_code == 200 and resp.json() == {"released": True}, resp.text


# --- request IDs -----------------------------------------------------------------------------


def route_calls(name: str, token: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("PUT", f"/v1/locks/{name}/lease", {"json": {"ttl_seconds": 30}}),
        ("PATCH", f"/v1/locks/{name}/lease", {"json": {"ttl_seconds": 30}}),
        ("GET", f"/v1/locks/{name}", {}),
        ("GET", "/v1/locks", {}),
        ("DELETE", f"/v1/locks/{name}/lease", {}),
        ("DELETE", f"/v1/locks/{name}", {}),
        ("POST", "/v1/keys", {"json": {"role": "reader"}}),
        ("GET", "/v1/keys", {}),
        ("GET", "/v1/whoami", {}),
        ("GET", "/healthz", {}),
        ("GET", "/openapi.json", {}),
    ]


def test_request_id_is_echoed_on_every_route(server: ServerProcess) -> None:
    name, token = unique_name("rid"), new_token()
    with server.client() as c:
        for method, path, kwargs in route_calls(name, token):
            rid = str(uuid.uuid4())
            resp = c.request(method, path, headers={"X-Lock-Token": token, "X-Request-Id": rid},
                             **kwargs)
            assert resp.status_code < 500, (method, path, resp.text)
            assert resp.headers.get("x-request-id") == rid, (method, path, resp.headers)


def test_request_id_is_generated_when_absent(server: ServerProcess) -> None:
    seen = []
    with server.client() as c:
        for path in ("/healthz", "/v1/whoami", "/v1/locks", f"/v1/locks/{unique_name('g')}",
                     "/v1/keys", "/openapi.json", "/v1/no-such-route"):
            resp = c.get(path)
            rid = resp.headers.get("x-request-id")
            assert rid and rid.strip(), (path, resp.headers)
            seen.append(rid)
        # a route that requires the header still answers with a generated one
        resp = c.put(f"/v1/locks/{unique_name('g')}/lease", headers={"X-Lock-Token": new_token()},
                     json={"ttl_seconds": 30})
        assert resp.status_code == 400
        assert resp.headers.get("x-request-id")
        seen.append(resp.headers["x-request-id"])
    assert len(set(seen)) == len(seen), "generated request ids repeat"


@pytest.mark.parametrize("rid", ["job-42", "build:2026-11-29#7", "a"])
def test_free_form_request_id_is_echoed_where_no_uuid_is_required(server: ServerProcess,
                                                                   rid: str) -> None:
    with server.client() as c:
        for path in ("/v1/whoami", "/healthz", f"/v1/locks/{unique_name('free')}"):
            resp = c.get(path, headers={"X-Request-Id": rid})
            assert resp.status_code == 200, (path, resp.text)
            assert resp.headers.get("x-request-id") == rid


def test_request_id_is_echoed_on_errors(server: ServerProcess) -> None:
    rid = str(uuid.uuid4())
    plain = httpx.Client(base_url=server.base_url, timeout=30)
    with plain, server.client() as c:
        for resp in (
            plain.get("/v1/whoami", headers={"X-Request-Id": rid}),  # 401
            c.get("/v1/no-such-route", headers={"X-Request-Id": rid}),  # 404
            c.post("/v1/whoami", headers={"X-Request-Id": rid}),  # 405
            c.put(f"/v1/locks/{unique_name('e')}/lease",  # 422
                  headers=lock_headers(request_id=rid), json={"ttl_seconds": 4}),
            c.put(f"/v1/locks/{unique_name('e')}/lease",  # 400
                  headers=lock_headers(request_id=rid), content=b"{"),
        ):
            assert resp.status_code >= 400
            assert resp.headers.get("x-request-id") == rid, (resp.status_code, resp.headers)


# --- error envelopes -------------------------------------------------------------------------


def test_envelope_400(server: ServerProcess) -> None:
    with server.client() as c:
        resp = c.put(f"/v1/locks/{unique_name('e')}/lease", headers=lock_headers(),
                     content=b'{"ttl_seconds": ')
    assert_error(resp, 400, "invalid_request")


def test_envelope_401(server: ServerProcess) -> None:
    resp = httpx.get(f"{server.base_url}/v1/locks", timeout=30)
    assert_error(resp, 401, "unauthorized")


def test_envelope_403(server: ServerProcess) -> None:
    reader = server.create_key("reader")
    with server.client(reader["key"]) as c:
        resp = c.put(f"/v1/locks/{unique_name('e')}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30})
    assert_error(resp, 403, "forbidden")


@pytest.mark.parametrize("path", ["/v1/no-such-route", "/nope", "/v1", "/v1/locks/a/b/c",
                                  "/v1/locks/a/lease/extra", "/v2/locks", "/healthz/x",
                                  "/index.html", "/favicon.ico"])
def test_envelope_404_unknown_route(server: ServerProcess, path: str) -> None:
    with server.client() as c:
        resp = c.get(path)
    assert_error(resp, 404, "not_found")


def unknown_key_id(server: ServerProcess) -> str:
    """An id shaped like a real one (same length and character classes) that names no key."""
    real = server.create_key("reader")["id"]
    last = real[-1]
    swap = "0" if last.isdigit() and last != "0" else "1" if last.isdigit() else (
        "a" if last != "a" and last.islower() else "b" if last.islower() else
        "A" if last != "A" and last.isupper() else "B" if last.isupper() else "0")
    return real[:-1] + swap


def test_envelope_404_unknown_key_id(server: ServerProcess) -> None:
    with server.client() as c:
        resp = c.delete(f"/v1/keys/{unknown_key_id(server)}")
    assert_error(resp, 404, "not_found")


@pytest.mark.parametrize("method,path", [
    ("POST", "/v1/locks/{name}"), ("PUT", "/v1/locks/{name}"), ("PATCH", "/v1/locks/{name}"),
    ("GET", "/v1/locks/{name}/lease"), ("POST", "/v1/locks/{name}/lease"),
    ("POST", "/v1/locks"), ("DELETE", "/v1/locks"),
    ("PUT", "/v1/keys"), ("DELETE", "/v1/keys"), ("GET", "/v1/keys/{name}"),
    ("POST", "/v1/whoami"), ("DELETE", "/v1/whoami"), ("POST", "/healthz"),
    ("DELETE", "/openapi.json"),
])
def test_envelope_405_wrong_method(server: ServerProcess, method: str, path: str) -> None:
    name = unique_name("m")
    with server.client() as c:
        resp = c.request(method, path.format(name=name), headers=lock_headers(),
                         json={"ttl_seconds": 30} if method in ("POST", "PUT", "PATCH") else None)
    assert_error(resp, 405, "method_not_allowed")
    assert lock_state(server, name)["held"] is False


@pytest.mark.parametrize("method,path,expected", [
    ("POST", "/v1/locks/some-lock", {"GET", "DELETE"}),
    ("GET", "/v1/locks/some-lock/lease", {"PUT", "PATCH", "DELETE"}),
    ("DELETE", "/v1/whoami", {"GET"}),
])
def test_405_names_the_allowed_methods(server: ServerProcess, method: str, path: str,
                                       expected: set[str]) -> None:
    """RFC 9110 §15.5.6: a 405 response MUST carry an Allow header."""
    with server.client() as c:
        resp = c.request(method, path)
    assert resp.status_code == 405, resp.text
    allowed = {m.strip().upper() for m in resp.headers.get("allow", "").split(",") if m.strip()}
    assert expected <= allowed and method not in allowed, f"Allow header: {allowed or None}"


def test_envelope_409_lock_held_with_retry_after(server: ServerProcess) -> None:
    name = unique_name("busy")
    with server.client() as c:
        first = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                      json={"ttl_seconds": 30, "operation": "deploy"})
        assert first.status_code == 201, first.text
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(), json={"ttl_seconds": 30})
    err = assert_error(resp, 409, "lock_held")
    assert err["operation"] == "deploy"
    assert isinstance(err["expires_in_ms"], int) and 0 < err["expires_in_ms"] <= 30_000
    retry_after = resp.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit(), resp.headers
    assert isinstance(err.get("retry_after_ms"), int) and err["retry_after_ms"] > 0, err
    assert int(retry_after) == -(-err["retry_after_ms"] // 1000), (retry_after, err)
    assert 1 <= int(retry_after) <= 30


def test_envelope_413(server: ServerProcess) -> None:
    name = unique_name("big")
    body = json.dumps({"ttl_seconds": 30, "metadata": {"pad": "x" * (MAX_BODY + 10)}})
    with server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(), content=body.encode())
    assert_error(resp, 413, "payload_too_large")
    assert lock_state(server, name)["held"] is False


def test_envelope_422(server: ServerProcess) -> None:
    with server.client() as c:
        resp = c.put(f"/v1/locks/{unique_name('e')}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 4})
    err = assert_error(resp, 422, "validation_error")
    assert isinstance(err.get("details"), list) and err["details"], err


def test_envelope_429(server: ServerProcess) -> None:
    limited = server.create_key("reader", rpm_quota=1)
    with server.client(limited["key"]) as c:
        assert c.get("/v1/whoami").status_code == 200
        resp = c.get("/v1/whoami")
    err = assert_error(resp, 429, "quota_exceeded")
    retry_after = resp.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1
    assert isinstance(err.get("retry_after_ms"), int) and err["retry_after_ms"] > 0


# --- health and OpenAPI ----------------------------------------------------------------------


def test_healthz_needs_no_key(server: ServerProcess) -> None:
    resp = httpx.get(f"{server.base_url}/healthz", timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers.get("content-type", "").startswith("application/json")
    assert resp.json()["status"] == "ok"
    assert resp.headers.get("x-request-id")


REQUIRED_ROUTES = {
    "/v1/locks/{}/lease": {"put", "patch", "delete"},
    "/v1/locks/{}": {"get", "delete"},
    "/v1/locks": {"get"},
    "/v1/keys": {"post", "get"},
    "/v1/keys/{}": {"delete"},
    "/v1/whoami": {"get"},
    "/healthz": {"get"},
}
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def resolve_pointer(doc: Any, ref: str) -> Any:
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"unresolvable $ref {ref}"
        node = node[part]
    return node


def all_refs(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.append(value)
            else:
                found += all_refs(value)
    elif isinstance(node, list):
        for value in node:
            found += all_refs(value)
    return found


def test_openapi_lists_every_route(server: ServerProcess) -> None:
    resp = httpx.get(f"{server.base_url}/openapi.json", timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers.get("content-type", "").startswith("application/json")
    doc = resp.json()
    version = doc.get("openapi")
    assert isinstance(version, str) and re.match(r"^3\.\d+\.\d+$", version), version
    assert isinstance(doc.get("info"), dict)
    assert isinstance(doc["info"].get("title"), str) and doc["info"]["title"]
    assert isinstance(doc["info"].get("version"), str) and doc["info"]["version"]
    paths = doc.get("paths")
    assert isinstance(paths, dict)
    normalized: dict[str, set[str]] = {}
    for template, item in paths.items():
        assert template.startswith("/"), template
        normalized[re.sub(r"\{[^}]+\}", "{}", template)] = {m for m in item if m in HTTP_METHODS}
    for route, methods in REQUIRED_ROUTES.items():
        assert route in normalized, f"{route} missing from /openapi.json paths"
        assert methods <= normalized[route], (route, normalized[route])
    for template, item in paths.items():
        params = set(re.findall(r"\{([^}]+)\}", template))
        for method, op in item.items():
            if method not in HTTP_METHODS:
                continue
            assert isinstance(op.get("responses"), dict) and op["responses"], (template, method)
            declared = {
                p["name"] for p in [*item.get("parameters", []), *op.get("parameters", [])]
                if isinstance(p, dict) and p.get("in") == "path"
            }
            assert params <= declared, f"{method} {template} does not declare {params - declared}"
    for ref in all_refs(doc):
        assert ref.startswith("#/"), ref
        resolve_pointer(doc, ref)
    assert "ttl_seconds" in resp.text and "x-lock-token" in resp.text.lower()


def test_openapi_and_healthz_ignore_bad_credentials(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30,
                      headers={"Authorization": "Bearer not-a-real-key"}) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/openapi.json").status_code == 200


# --- times -----------------------------------------------------------------------------------


def test_time_fields_are_rfc3339_ms_z(server: ServerProcess) -> None:
    name = unique_name("time")
    with server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(), json={"ttl_seconds": 30})
        assert resp.status_code == 201, resp.text
        body = resp.json()
        acquired, expires, deadline = (parse_at(body[f]) for f in
                                       ("acquired_at", "expires_at", "deadline_at"))
        assert abs(expires - acquired - timedelta(seconds=30)) <= timedelta(milliseconds=1)
        assert abs(deadline - acquired - timedelta(days=90)) <= timedelta(milliseconds=1)
        assert abs((acquired - datetime.now(UTC)).total_seconds()) < 60
        state = c.get(f"/v1/locks/{name}").json()
        for field in ("acquired_at", "expires_at", "deadline_at"):
            assert state[field] == body[field]
        made = c.post("/v1/keys", json={"role": "reader", "expires_in_seconds": 60}).json()
        parse_at(made["created_at"])
        parse_at(made["expires_at"])


# --- body size limit -------------------------------------------------------------------------


def padded_acquire_body(size: int) -> bytes:
    body = json.dumps({"ttl_seconds": 30}).encode()
    return body + b" " * (size - len(body))


def test_body_of_exactly_64_kib_is_accepted(server: ServerProcess) -> None:
    name = unique_name("edge")
    with server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     content=padded_acquire_body(MAX_BODY))
    assert resp.status_code == 201, resp.text
    assert lock_state(server, name)["held"] is True


def test_body_one_byte_over_64_kib_is_413(server: ServerProcess) -> None:
    name = unique_name("edge")
    with server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     content=padded_acquire_body(MAX_BODY + 1))
    assert_error(resp, 413, "payload_too_large")
    assert lock_state(server, name)["held"] is False
    assert_still_serving(server)


@pytest.mark.parametrize("method,path", [("PUT", "/v1/locks/{name}/lease"),
                                         ("PATCH", "/v1/locks/{name}/lease"),
                                         ("POST", "/v1/keys")])
def test_large_body_is_413_on_body_routes(server: ServerProcess, method: str, path: str) -> None:
    name = unique_name("big")
    with server.client() as c:
        before = len(c.get("/v1/keys", params={"limit": "1000"}).json()["keys"])
    body = json.dumps({"ttl_seconds": 30, "role": "reader", "name": "x" * (200 * 1024)}).encode()
    with server.client() as c:
        resp = c.request(method, path.format(name=name), headers=lock_headers(), content=body)
        assert_error(resp, 413, "payload_too_large")
        assert len(c.get("/v1/keys", params={"limit": "1000"}).json()["keys"]) == before
    assert lock_state(server, name)["held"] is False


def test_huge_announced_body_is_refused_without_reading_it(server: ServerProcess) -> None:
    name = unique_name("huge")
    rid = str(uuid.uuid4())
    head = request_head(server, "PUT", f"/v1/locks/{name}/lease",
                        {"X-Lock-Token": new_token(), "X-Request-Id": rid,
                         "Content-Length": "100000000"})
    # Answered with the body still unsent: a server that read the body first
    # would answer only when its read deadline ends the request, after this
    # socket has given up (an exception).
    status, headers, body = raw_exchange(server.port, head, b'{"ttl_seconds": 30, "metadata": {',
                                         timeout=REQUEST_READ_S * 0.8)
    assert status == 413, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), headers
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert headers.get("x-request-id") == rid
    assert lock_state(server, name)["held"] is False
    assert_still_serving(server)


def test_huge_announced_body_on_keys_route(server: ServerProcess) -> None:
    head = request_head(server, "POST", "/v1/keys", {"Content-Length": "100000000"})
    status, _, body = raw_exchange(server.port, head, b'{"role": "reader", ')
    assert status == 413, (status, body[:300])
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert_still_serving(server)


def test_chunked_body_over_limit_is_refused_before_it_ends(server: ServerProcess) -> None:
    name = unique_name("chunked")
    head = request_head(server, "PUT", f"/v1/locks/{name}/lease",
                        {**lock_headers(), "Transfer-Encoding": "chunked"})
    piece = b" " * 8192
    chunks = b'7\r\n{"ttl_s\r\n' + b"".join(
        f"{len(piece):x}\r\n".encode() + piece + b"\r\n" for _ in range(10))
    # 80 KiB sent, no terminating chunk: the server must answer without waiting for the end
    status, headers, body = raw_exchange(server.port, head, chunks)
    assert status == 413, (status, body[:300])
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert lock_state(server, name)["held"] is False
    assert_still_serving(server)


def test_many_huge_announced_bodies_do_not_stall_the_server(server: ServerProcess) -> None:
    socks = []
    try:
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(request_head(server, "PUT", f"/v1/locks/{unique_name('h')}/lease",
                                      {**lock_headers(), "Content-Length": "50000000"}) + b"{")
            socks.append(sock)
        for sock in socks:
            status, _, _ = read_response(sock)
            assert status == 413
    finally:
        for sock in socks:
            sock.close()
    assert_still_serving(server)
