"""SPEC §3.8: GET /v1/locks/{key}/fence?token=N over HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from support import ServerProcess, lock_headers, new_token, unique_name

FIELDS = {"key", "token", "current", "live_token", "reason"}


def acquire(c: httpx.Client, key: str, token: str, ttl: int = 30) -> dict[str, Any]:
    resp = c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token), json={"ttl_seconds": ttl})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def check(c: httpx.Client, key: str, token: Any) -> dict[str, Any]:
    resp = c.get(f"/v1/locks/{key}/fence", params={"token": token})
    assert resp.status_code == 200, resp.text
    body = dict(resp.json())
    assert set(body) == FIELDS, body
    assert body["key"] == key
    return body


def test_current_then_released_then_superseded(member: httpx.Client, reader: httpx.Client,
                                               server: ServerProcess) -> None:
    key, a = unique_name("fence"), new_token()
    first = acquire(member, key, a)["fencing_token"]
    body = check(reader, key, first)
    assert body == {"key": key, "token": first, "current": True, "live_token": first,
                    "reason": None}
    assert member.delete(f"/v1/locks/{key}/lease", headers=lock_headers(a)).json()["released"]
    assert check(reader, key, first) == {"key": key, "token": first, "current": False,
                                         "live_token": None, "reason": "released"}
    second = acquire(member, key, new_token())["fencing_token"]
    assert check(reader, key, first)["live_token"] == second
    with server.client() as admin:
        assert admin.delete(f"/v1/locks/{key}").json()["released"] is True
    body = check(reader, key, second)
    assert (body["current"], body["reason"]) == (False, "force_released")


def test_a_token_never_issued_for_the_lock_is_unknown(member: httpx.Client,
                                                      reader: httpx.Client) -> None:
    key = unique_name("fence")
    other = acquire(member, unique_name("fence-other"), new_token())["fencing_token"]
    body = check(reader, key, other)
    assert (body["current"], body["live_token"], body["reason"]) == (False, None, "unknown")
    assert check(reader, key, 0)["reason"] == "unknown"
    assert check(reader, key, 2**53 - 1)["token"] == 2**53 - 1


@pytest.mark.parametrize("query", [
    "", "token=", "token=abc", "token=-1", "token=1.5", "token=1e3", f"token={2**53}",
    "token=99999999999999999999999", "token=%C2%B2", "token=1&token=1", "token=1&x=2",
    "tokn=1", "token=+1", "token=%201",
])
def test_bad_token_query_is_422(reader: httpx.Client, query: str) -> None:
    resp = reader.get(f"/v1/locks/{unique_name('fence')}/fence?{query}")
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["code"] == "validation_error"
    assert err["details"], err


def test_bad_key_is_422(reader: httpx.Client) -> None:
    resp = reader.get("/v1/locks/-bad/fence", params={"token": 1})
    assert resp.status_code == 422, resp.text
    assert "key" in {d["field"] for d in resp.json()["error"]["details"]}


def test_needs_a_key(server: ServerProcess) -> None:
    resp = httpx.get(f"{server.base_url}/v1/locks/k/fence?token=1")
    assert resp.status_code == 401
