"""Authentication, roles, IP allowlists, quotas and key management (SPEC §2, §5, §7.6)."""

from __future__ import annotations

import math
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from support import (
    BOOTSTRAP_KEY,
    ServerProcess,
    assert_error,
    lock_headers,
    new_token,
    parse_at,
    true_within,
    unique_name,
)

KEY_FIELDS = {"id", "key", "role", "name", "project", "expires_at", "allow_ips", "rpm_quota",
              "created_at"}


def raw_client(server: ServerProcess, headers: dict[str, str] | None = None) -> httpx.Client:
    """A client with no credentials unless given explicitly."""
    return httpx.Client(base_url=server.base_url, headers=headers or {}, timeout=30)


def whoami(server: ServerProcess, key: str) -> httpx.Response:
    with server.client(key) as c:
        return c.get("/v1/whoami")


def lock_state(server: ServerProcess, name: str) -> dict[str, Any]:
    with server.client() as c:
        resp = c.get(f"/v1/locks/{name}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def acquire(server: ServerProcess, name: str, token: str, key: str | None = None,
            ttl: int = 60) -> httpx.Response:
    with server.client(key) as c:
        return c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": ttl})


def held_lock(server: ServerProcess, key: str | None = None) -> tuple[str, str, dict[str, Any]]:
    name, token = unique_name("auth"), new_token()
    resp = acquire(server, name, token, key)
    assert resp.status_code == 201, resp.text
    return name, token, dict(resp.json())


def list_keys(server: ServerProcess, key: str | None = None) -> httpx.Response:
    with server.client(key) as c:
        return c.get("/v1/keys")


@pytest.fixture(scope="module")
def role_keys(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return {role: server.create_key(role, name=f"{role}-{unique_name('k')}")
            for role in ("reader", "member", "admin")}


# --- authentication headers ------------------------------------------------------------------


@pytest.mark.parametrize("style", ["bearer", "x-api-key"])
def test_both_auth_header_styles_work(server: ServerProcess, style: str) -> None:
    headers = ({"Authorization": f"Bearer {server.admin_key}"} if style == "bearer"
               else {"X-Api-Key": server.admin_key})
    with raw_client(server, headers) as c:
        resp = c.get("/v1/whoami")
        assert resp.status_code == 200, resp.text
        assert resp.json()["role"] == "admin"
        name = unique_name("style")
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(), json={"ttl_seconds": 30})
        assert resp.status_code == 201, resp.text


def test_created_key_works_with_both_styles(server: ServerProcess) -> None:
    created = server.create_key("reader")
    for headers in ({"Authorization": f"Bearer {created['key']}"}, {"X-Api-Key": created["key"]}):
        with raw_client(server, headers) as c:
            resp = c.get("/v1/whoami")
        assert resp.status_code == 200, resp.text
        assert resp.json()["key_id"] == created["id"]


BAD_AUTH = {
    "missing": {},
    "bearer-empty": {"Authorization": "Bearer"},
    "basic-scheme": {"Authorization": "Basic dXNlcjpwYXNzd29yZA=="},
    "token-scheme": {"Authorization": f"Token {BOOTSTRAP_KEY}"},
    "no-scheme": {"Authorization": BOOTSTRAP_KEY},
    "bearer-two-words": {"Authorization": f"Bearer {BOOTSTRAP_KEY} extra"},
    "x-api-key-empty": {"X-Api-Key": ""},
    "unknown-bearer": {"Authorization": f"Bearer fp_{secrets.token_urlsafe(32)}"},
    "unknown-x-api-key": {"X-Api-Key": f"fp_{secrets.token_urlsafe(32)}"},
    "prefix-of-real-key": {"Authorization": f"Bearer {BOOTSTRAP_KEY[:-1]}"},
    "real-key-plus-char": {"X-Api-Key": BOOTSTRAP_KEY + "x"},
    "real-key-uppercased": {"X-Api-Key": BOOTSTRAP_KEY.upper()},
}


@pytest.mark.parametrize("case", sorted(BAD_AUTH))
@pytest.mark.parametrize("route", ["whoami", "list_locks", "get_lock", "acquire", "create_key"])
def test_bad_credentials_are_401(server: ServerProcess, case: str, route: str) -> None:
    name = unique_name("unauth")
    with raw_client(server, BAD_AUTH[case]) as c:
        if route == "whoami":
            resp = c.get("/v1/whoami")
        elif route == "list_locks":
            resp = c.get("/v1/locks")
        elif route == "get_lock":
            resp = c.get(f"/v1/locks/{name}")
        elif route == "acquire":
            resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                         json={"ttl_seconds": 30})
        else:
            resp = c.post("/v1/keys", json={"role": "admin"})
    assert_error(resp, 401, "unauthorized")
    assert resp.headers.get("x-request-id")
    if route == "acquire":
        assert lock_state(server, name)["held"] is False
    if route == "create_key":
        assert BOOTSTRAP_KEY not in resp.text


def test_expired_key_is_401(server: ServerProcess) -> None:
    created = server.create_key("member", expires_in_seconds=1)
    assert created["expires_at"] is not None
    lifetime = parse_at(created["expires_at"]) - parse_at(created["created_at"])
    assert abs(lifetime.total_seconds() - 1) <= 0.5, lifetime
    assert whoami(server, created["key"]).status_code == 200
    time.sleep(1.5)
    assert_error(whoami(server, created["key"]), 401, "unauthorized")
    name = unique_name("expired")
    assert_error(acquire(server, name, new_token(), created["key"]), 401, "unauthorized")
    assert lock_state(server, name)["held"] is False


def test_revoked_key_is_refused_within_two_seconds(server: ServerProcess) -> None:
    created = server.create_key("member")
    name, token, _ = held_lock(server, created["key"])
    assert whoami(server, created["key"]).status_code == 200
    with server.client() as admin:
        resp = admin.delete(f"/v1/keys/{created['id']}")
        revoked_at = time.monotonic()
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"revoked": True}
    assert true_within(lambda: whoami(server, created["key"]).status_code == 401,
                       revoked_at, 2.0), "revoked key still accepted 2 s after revocation (SPEC §5)"
    # it stays refused, on every route
    assert_error(whoami(server, created["key"]), 401, "unauthorized")
    with server.client(created["key"]) as c:
        assert_error(c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token}),
                     401, "unauthorized")
    assert lock_state(server, name)["held"] is True
    # the listing shows it revoked; revoking twice is still 200
    listed = {k["id"]: k for k in list_keys(server).json()["keys"]}
    assert listed[created["id"]]["revoked_at"] is not None
    parse_at(listed[created["id"]]["revoked_at"])
    with server.client() as admin:
        again = admin.delete(f"/v1/keys/{created['id']}")
    assert again.status_code == 200 and again.json() == {"revoked": True}, again.text


# --- roles -----------------------------------------------------------------------------------


def test_reader_may_read(server: ServerProcess, role_keys: dict[str, dict[str, Any]]) -> None:
    reader = role_keys["reader"]
    name, _, grant = held_lock(server)
    with server.client(reader["key"]) as c:
        one = c.get(f"/v1/locks/{name}")
        assert one.status_code == 200, one.text
        assert one.json()["held"] is True
        assert one.json()["fencing_token"] == grant["fencing_token"]
        many = c.get("/v1/locks", params={"prefix": name})
        assert many.status_code == 200, many.text
        assert [lock["key"] for lock in many.json()["locks"]] == [name]
        me = c.get("/v1/whoami")
        assert me.status_code == 200, me.text
        assert me.json() == {"project": "default", "key_id": reader["id"], "role": "reader",
                             "expires_at": reader["expires_at"]}


@pytest.mark.parametrize("op", ["acquire", "renew", "release", "force_release", "create_key",
                                "list_keys", "revoke_key"])
def test_reader_is_forbidden_to_write(server: ServerProcess, role_keys: dict[str, dict[str, Any]],
                                      op: str) -> None:
    reader = role_keys["reader"]
    name, token, grant = held_lock(server)
    free = unique_name("free")
    victim = server.create_key("member")
    before_keys = len(list_keys(server).json()["keys"])
    with server.client(reader["key"]) as c:
        if op == "acquire":
            resp = c.put(f"/v1/locks/{free}/lease", headers=lock_headers(),
                         json={"ttl_seconds": 30})
        elif op == "renew":
            resp = c.patch(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                           json={"ttl_seconds": 3600})
        elif op == "release":
            resp = c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
        elif op == "force_release":
            resp = c.delete(f"/v1/locks/{name}")
        elif op == "create_key":
            resp = c.post("/v1/keys", json={"role": "reader"})
        elif op == "list_keys":
            resp = c.get("/v1/keys")
        else:
            resp = c.delete(f"/v1/keys/{victim['id']}")
    assert_error(resp, 403, "forbidden")
    assert victim["key"] not in resp.text
    state = lock_state(server, name)
    assert state["held"] is True
    assert state["fencing_token"] == grant["fencing_token"]
    assert state["expires_at"] == grant["expires_at"]
    assert lock_state(server, free)["held"] is False
    assert len(list_keys(server).json()["keys"]) == before_keys
    assert whoami(server, victim["key"]).status_code == 200


def test_member_can_acquire_renew_release(server: ServerProcess,
                                          role_keys: dict[str, dict[str, Any]]) -> None:
    member = role_keys["member"]
    name, token = unique_name("member"), new_token()
    with server.client(member["key"]) as c:
        got = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                    json={"ttl_seconds": 30})
        assert got.status_code == 201, got.text
        renewed = c.patch(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                          json={"ttl_seconds": 120})
        assert renewed.status_code == 200, renewed.text
        assert renewed.json()["fencing_token"] == got.json()["fencing_token"]
        released = c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
        assert released.status_code == 200, released.text
        assert released.json() == {"released": True}
        assert c.get(f"/v1/locks/{name}").json()["held"] is False


@pytest.mark.parametrize("op", ["force_release", "create_key", "list_keys", "revoke_key"])
def test_member_is_forbidden_admin_routes(server: ServerProcess,
                                          role_keys: dict[str, dict[str, Any]], op: str) -> None:
    member = role_keys["member"]
    # Held by another key (the admin's): a member may force-release only the
    # leases its own key took (SPEC §3.5).
    name, _, grant = held_lock(server)
    victim = server.create_key("reader")
    before_keys = len(list_keys(server).json()["keys"])
    with server.client(member["key"]) as c:
        if op == "force_release":
            resp = c.delete(f"/v1/locks/{name}")
        elif op == "create_key":
            resp = c.post("/v1/keys", json={"role": "admin"})
        elif op == "list_keys":
            resp = c.get("/v1/keys")
        else:
            resp = c.delete(f"/v1/keys/{victim['id']}")
    assert_error(resp, 403, "forbidden")
    assert victim["key"] not in resp.text
    state = lock_state(server, name)
    assert state["held"] is True and state["fencing_token"] == grant["fencing_token"]
    assert len(list_keys(server).json()["keys"]) == before_keys
    assert whoami(server, victim["key"]).status_code == 200


def test_admin_can_do_everything(server: ServerProcess,
                                 role_keys: dict[str, dict[str, Any]]) -> None:
    admin = role_keys["admin"]
    name, token = unique_name("admin"), new_token()
    with server.client(admin["key"]) as c:
        assert c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": 30}).status_code == 201
        assert c.patch(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                       json={"ttl_seconds": 60}).status_code == 200
        assert c.get(f"/v1/locks/{name}").status_code == 200
        assert c.get("/v1/locks").status_code == 200
        forced = c.delete(f"/v1/locks/{name}")
        assert forced.status_code == 200 and forced.json()["released"] is True, forced.text
        released = c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
        assert released.status_code == 200 and released.json() == {"released": False}
        made = c.post("/v1/keys", json={"role": "reader"})
        assert made.status_code == 201, made.text
        listed = c.get("/v1/keys")
        assert listed.status_code == 200, listed.text
        assert made.json()["id"] in {k["id"] for k in listed.json()["keys"]}
        revoked = c.delete(f"/v1/keys/{made.json()['id']}")
        assert revoked.status_code == 200 and revoked.json() == {"revoked": True}
        assert c.get("/v1/whoami").json()["role"] == "admin"


# --- IP allowlists ---------------------------------------------------------------------------


@pytest.mark.parametrize("allow", [["10.0.0.0/8"], ["192.168.1.7"], ["10.0.0.0/8", "::1/128"],
                                   ["127.0.0.2/32"]])
def test_ip_outside_allowlist_is_403(server: ServerProcess, allow: list[str]) -> None:
    created = server.create_key("member", allow_ips=allow)
    assert_error(whoami(server, created["key"]), 403, "forbidden")
    name = unique_name("ip")
    assert_error(acquire(server, name, new_token(), created["key"]), 403, "forbidden")
    assert lock_state(server, name)["held"] is False


@pytest.mark.parametrize("allow", [["127.0.0.1/32"], ["127.0.0.1"], ["10.0.0.0/8", "127.0.0.0/8"],
                                   ["0.0.0.0/0"]])
def test_ip_inside_allowlist_works(server: ServerProcess, allow: list[str]) -> None:
    created = server.create_key("member", allow_ips=allow)
    resp = whoami(server, created["key"])
    assert resp.status_code == 200, resp.text
    assert acquire(server, unique_name("ip"), new_token(), created["key"]).status_code == 201


@pytest.mark.parametrize("allow,forwarded,expected", [
    (["10.0.0.0/8"], "10.1.2.3", 403),
    (["10.0.0.0/8"], "127.0.0.1, 10.1.2.3", 403),
    (["127.0.0.1/32"], "10.1.2.3", 200),
])
def test_forwarded_headers_do_not_change_the_caller_ip(server: ServerProcess, allow: list[str],
                                                       forwarded: str, expected: int) -> None:
    """The caller is the peer of the TCP connection (127.0.0.1 here). The server is not
    configured to sit behind a proxy, so a header the caller writes itself must neither
    open nor close the allowlist."""
    created = server.create_key("member", allow_ips=allow)
    with server.client(created["key"]) as c:
        resp = c.get("/v1/whoami", headers={"X-Forwarded-For": forwarded,
                                            "Forwarded": f"for={forwarded.split(',')[-1].strip()}",
                                            "X-Real-IP": forwarded.split(",")[-1].strip()})
    assert resp.status_code == expected, resp.text


# --- quotas ----------------------------------------------------------------------------------


def assert_quota_exceeded(resp: httpx.Response) -> None:
    err = assert_error(resp, 429, "quota_exceeded")
    retry_after = resp.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit(), resp.headers
    assert 1 <= int(retry_after) <= 60, retry_after
    ms = err.get("retry_after_ms")
    assert isinstance(ms, int) and not isinstance(ms, bool) and 0 < ms <= 60_000, err
    assert int(retry_after) == math.ceil(ms / 1000), (retry_after, ms)
    assert resp.headers.get("x-request-id")


def test_rpm_quota_fourth_request_is_429(server: ServerProcess) -> None:
    created = server.create_key("member", rpm_quota=3)
    assert created["rpm_quota"] == 3
    with server.client(created["key"]) as c:
        for _ in range(3):
            resp = c.get("/v1/whoami")
            assert resp.status_code == 200, resp.text
        assert_quota_exceeded(c.get("/v1/whoami"))
        # over quota is over quota for writes too
        name = unique_name("quota")
        assert_quota_exceeded(c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                                    json={"ttl_seconds": 30}))
    assert lock_state(server, name)["held"] is False
    # other keys are not affected
    assert whoami(server, server.admin_key).status_code == 200


def test_rpm_quota_counts_retries_with_reused_request_id(server: ServerProcess) -> None:
    created = server.create_key("member", rpm_quota=3)
    name, token = unique_name("quota"), new_token()
    headers = lock_headers(token)  # one request id, reused on every retry
    with server.client(created["key"]) as c:
        first = c.put(f"/v1/locks/{name}/lease", headers=headers, json={"ttl_seconds": 60})
        assert first.status_code == 201, first.text
        for _ in range(2):
            retry = c.put(f"/v1/locks/{name}/lease", headers=headers, json={"ttl_seconds": 60})
            assert retry.status_code == 200, retry.text
            assert retry.json()["fencing_token"] == first.json()["fencing_token"]
        assert_quota_exceeded(c.put(f"/v1/locks/{name}/lease", headers=headers,
                                    json={"ttl_seconds": 60}))
    state = lock_state(server, name)
    assert state["held"] is True and state["fencing_token"] == first.json()["fencing_token"]


# --- key management --------------------------------------------------------------------------


def test_create_key_response_fields(server: ServerProcess) -> None:
    name = unique_name("named")
    with server.client() as c:
        resp = c.post("/v1/keys", json={"role": "member", "name": name,
                                        "expires_in_seconds": 3600,
                                        "allow_ips": ["127.0.0.1/32", "10.0.0.0/8"],
                                        "rpm_quota": 500})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert set(body) == KEY_FIELDS, body
    assert isinstance(body["id"], str) and body["id"]
    assert isinstance(body["key"], str) and len(body["key"]) >= 22
    assert body["key"] != body["id"] and body["key"] not in body["id"]
    assert body["role"] == "member"
    assert body["name"] == name
    assert body["project"] == "default"
    assert body["allow_ips"] == ["127.0.0.1/32", "10.0.0.0/8"]
    assert body["rpm_quota"] == 500
    created_at, expires_at = parse_at(body["created_at"]), parse_at(body["expires_at"])
    assert abs((created_at - datetime.now(UTC)).total_seconds()) < 60
    assert abs((expires_at - created_at).total_seconds() - 3600) <= 2, (created_at, expires_at)
    me = whoami(server, body["key"]).json()
    assert me == {"project": "default", "key_id": body["id"], "role": "member",
                  "expires_at": body["expires_at"]}


def test_create_key_minimal_defaults(server: ServerProcess) -> None:
    a, b = server.create_key("reader"), server.create_key("reader")
    for body in (a, b):
        assert set(body) == KEY_FIELDS, body
        assert body["role"] == "reader"
        assert body["expires_at"] is None
        assert body["rpm_quota"] is None
        assert body["allow_ips"] in (None, [])
        parse_at(body["created_at"])
    assert a["id"] != b["id"] and a["key"] != b["key"]


def test_list_keys_never_contains_secrets(server: ServerProcess) -> None:
    made = [server.create_key(role, name=unique_name(role))
            for role in ("admin", "member", "reader")]
    revoked = server.create_key("member")
    with server.client() as c:
        assert c.delete(f"/v1/keys/{revoked['id']}").status_code == 200
        resp = c.get("/v1/keys")
    assert resp.status_code == 200, resp.text
    text = resp.text
    for secret in [k["key"] for k in made] + [revoked["key"], BOOTSTRAP_KEY]:
        assert secret not in text
    keys = resp.json()["keys"]
    by_id = {k["id"]: k for k in keys}
    for created in made + [revoked]:
        listed = by_id[created["id"]]
        assert "key" not in listed, listed
        listed_fields = (KEY_FIELDS - {"key"}) | {"revoked_at", "refreshed_from", "state"}
        assert set(listed) == listed_fields, listed
        for field in ("role", "name", "project", "expires_at", "allow_ips", "rpm_quota",
                      "created_at"):
            assert listed[field] == created[field], field
    assert by_id[revoked["id"]]["revoked_at"] is not None
    assert all(by_id[k["id"]]["revoked_at"] is None for k in made)
    for k in keys:
        assert k["project"] == "default"


@pytest.mark.parametrize("role", ["admin", "member", "reader"])
def test_whoami(server: ServerProcess, role: str) -> None:
    created = server.create_key(role)
    resp = whoami(server, created["key"])
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"project": "default", "key_id": created["id"], "role": role,
                           "expires_at": None}


def test_whoami_bootstrap_admin(server: ServerProcess) -> None:
    resp = whoami(server, server.admin_key)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"project", "key_id", "role", "expires_at"}
    assert body["project"] == "default" and body["role"] == "admin"
    assert body["expires_at"] is None  # the bootstrap key never expires
    assert isinstance(body["key_id"], str) and body["key_id"]
    assert BOOTSTRAP_KEY not in resp.text


# --- secrets never in logs -------------------------------------------------------------------


def exercise_keys(srv: ServerProcess) -> list[dict[str, Any]]:
    """Creates keys and uses them in every way; returns the 201 bodies of the keys made."""
    made = [srv.create_key(role, name=unique_name(role)) for role in ("admin", "member", "reader")]
    member, reader = made[1], made[2]
    name, token = unique_name("log"), new_token()
    with raw_client(srv, {"X-Api-Key": member["key"]}) as c:
        assert c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": 30}).status_code == 201
        assert c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30}).status_code == 409
        assert c.patch(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                       json={"ttl_seconds": 60}).status_code == 200
        assert c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 4}).status_code == 422
    with srv.client(reader["key"]) as c:
        assert c.get(f"/v1/locks/{name}").status_code == 200
        assert c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30}).status_code == 403
    with srv.client(made[0]["key"]) as c:
        assert c.delete(f"/v1/locks/{name}").status_code == 200
        assert c.delete(f"/v1/keys/{member['id']}").status_code == 200
    deadline = time.monotonic() + 3
    while whoami(srv, member["key"]).status_code != 401 and time.monotonic() < deadline:
        time.sleep(0.1)
    with raw_client(srv, {"X-Api-Key": member["key"]}) as c:
        c.put(f"/v1/locks/{name}/lease", headers=lock_headers(), json={"ttl_seconds": 30})
    return made


def test_secrets_never_in_logs_or_output(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    made = exercise_keys(srv)
    secrets_used = [k["key"] for k in made] + [srv.admin_key]
    assert srv.terminate() == 0  # flushes every log
    log = srv.access_log.read_text() if srv.access_log.exists() else ""
    assert log.strip(), "the access log is empty: nothing to check"
    lines = srv.access_log_lines()
    forced = [line for line in lines if line.get("event") == "lock.force_release"]
    assert [line.get("key_id") for line in forced] == [made[0]["id"]], forced
    outputs = {"access log": log, "stdout": srv.stdout_path.read_text(),
               "stderr": srv.stderr_path.read_text()}
    for where, text in outputs.items():
        for secret in secrets_used:
            assert secret not in text, f"a key secret appears in the server's {where}"


def test_presented_unknown_keys_are_not_logged(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    attempted = [f"fp_{secrets.token_urlsafe(32)}" for _ in range(2)]
    with raw_client(srv, {"Authorization": f"Bearer {attempted[0]}"}) as c:
        assert c.put(f"/v1/locks/{unique_name('x')}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30}).status_code == 401
    with raw_client(srv, {"X-Api-Key": attempted[1]}) as c:
        assert c.get("/v1/whoami").status_code == 401
    assert srv.terminate() == 0
    for path in (srv.access_log, srv.stdout_path, srv.stderr_path):
        text = path.read_text() if path.exists() else ""
        for secret in attempted:
            assert secret not in text, f"a presented key appears in {path.name}"
