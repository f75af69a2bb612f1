"""SPEC §5: POST /v1/keys/refresh over HTTP."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx
import pytest

import fencepost
from support import ServerProcess, unique_name, wait_until

EVERY_KEY = {"limit": "1000"}  # the key list's largest page: every key of a test module
KEY_FIELDS = {"id", "key", "role", "name", "project", "expires_at", "allow_ips", "rpm_quota",
              "created_at"}


def at(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")


def refresh(server: ServerProcess, key: str, **kwargs: Any) -> httpx.Response:
    with server.client(key) as c:
        return c.post("/v1/keys/refresh", **kwargs)


def whoami(server: ServerProcess, key: str) -> httpx.Response:
    with server.client(key) as c:
        return c.get("/v1/whoami")


@pytest.mark.parametrize("role", ["reader", "member", "admin"])
def test_any_role_mints_a_successor_with_its_terms(server: ServerProcess, role: str) -> None:
    name = unique_name("worker")
    original = server.create_key(role, name=name, expires_in_seconds=3600,
                                 allow_ips=["127.0.0.1/32"], rpm_quota=600)
    resp = refresh(server, original["key"])  # no body at all
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert set(body) == KEY_FIELDS
    assert body["id"] != original["id"] and body["key"] != original["key"]
    for field in ("role", "name", "project", "allow_ips", "rpm_quota"):
        assert body[field] == original[field], field
    lifetime = (at(body["expires_at"]) - at(body["created_at"])).total_seconds()
    assert lifetime == pytest.approx(3600, abs=0.01)  # the caller's own lifetime
    me = whoami(server, body["key"]).json()
    assert (me["key_id"], me["role"], me["expires_at"]) == (body["id"], role, body["expires_at"])
    assert whoami(server, original["key"]).status_code == 200  # keeps working


def test_a_shorter_lifetime_may_be_asked_a_longer_one_may_not(server: ServerProcess) -> None:
    original = server.create_key("member", expires_in_seconds=600)
    short = refresh(server, original["key"], json={"expires_in_seconds": 60})
    assert short.status_code == 201, short.text
    body = short.json()
    assert (at(body["expires_at"]) - at(body["created_at"])).total_seconds() == \
        pytest.approx(60, abs=0.01)
    # Nothing in the lineage may outlive what an admin granted the original
    # (judged before the lineage's minute; going back up to it is checked in
    # tests/store, where the clock can move on).
    too_long = refresh(server, body["key"], json={"expires_in_seconds": 601})
    assert too_long.status_code == 422, too_long.text
    assert too_long.json()["error"]["details"][0]["field"] == "expires_in_seconds"


@pytest.mark.parametrize(("content", "status"), [
    (b'{"expires_in_seconds": 0}', 422),
    (b'{"expires_in_seconds": "60"}', 422),
    (b'{"expires_in_seconds": 315360001}', 422),
    (b'{"expires": 60}', 422),
    (b'{"role": "admin"}', 422),
    (b'{"expires_in_seconds": 60', 400),
    (b'[]', 422),
])
def test_bad_refresh_bodies(server: ServerProcess, content: bytes, status: int) -> None:
    original = server.create_key("reader")
    with server.client() as admin:
        before = len(admin.get("/v1/keys", params=EVERY_KEY).json()["keys"])
    resp = refresh(server, original["key"], content=content,
                   headers={"Content-Type": "application/json"})
    assert resp.status_code == status, resp.text
    with server.client() as admin:
        after = admin.get("/v1/keys", params=EVERY_KEY).json()["keys"]
        assert len(after) == before  # nothing minted


def test_a_revoked_or_expired_key_cannot_refresh(server: ServerProcess) -> None:
    revoked = server.create_key("member")
    with server.client() as admin:
        assert admin.delete(f"/v1/keys/{revoked['id']}").status_code == 200
    assert refresh(server, revoked["key"]).status_code == 401
    expiring = server.create_key("member", expires_in_seconds=1)
    wait_until(lambda: whoami(server, expiring["key"]).status_code == 401,
               "the expiring key to be refused")
    assert refresh(server, expiring["key"]).status_code == 401
    assert refresh(server, "fp_not_a_key_0000000000000000000000").status_code == 401


def test_the_old_key_works_until_its_own_expiry(server: ServerProcess) -> None:
    original = server.create_key("member", expires_in_seconds=6)
    time.sleep(3)
    successor = refresh(server, original["key"]).json()  # lives 6 s from now
    assert whoami(server, original["key"]).status_code == 200
    wait_until(lambda: whoami(server, original["key"]).status_code == 401,
               "the original key to be refused")
    assert whoami(server, successor["key"]).status_code == 200


def test_a_leaked_key_that_refreshes_itself_dies_with_its_root(server: ServerProcess) -> None:
    leaked = server.create_key("member", expires_in_seconds=3600)
    first = refresh(server, leaked["key"]).json()
    # A second refresh in the lineage waits out the minute (tests/store follows
    # a longer chain with a moving clock).
    assert refresh(server, first["key"]).status_code == 429
    for key in (leaked, first):
        assert whoami(server, key["key"]).status_code == 200
    with server.client() as admin:
        assert admin.delete(f"/v1/keys/{leaked['id']}").status_code == 200
        listed = {k["id"]: k for k in admin.get("/v1/keys", params=EVERY_KEY).json()["keys"]}
    for key in (leaked, first):
        assert whoami(server, key["key"]).status_code == 401, key["id"]
        assert refresh(server, key["key"]).status_code == 401
        assert listed[key["id"]]["revoked_at"] is not None


def test_whoami_shows_the_expiry(server: ServerProcess) -> None:
    created = server.create_key("reader", expires_in_seconds=120)
    assert whoami(server, created["key"]).json()["expires_at"] == created["expires_at"]
    with server.client() as admin:
        assert admin.get("/v1/whoami").json()["expires_at"] is None


def test_successors_share_the_quota_of_their_chain(server: ServerProcess) -> None:
    original = server.create_key("reader", rpm_quota=3)
    successor = refresh(server, original["key"]).json()  # request 1 of 3
    assert whoami(server, successor["key"]).status_code == 200  # 2
    assert whoami(server, successor["key"]).status_code == 200  # 3
    over = whoami(server, successor["key"])
    assert over.status_code == 429, over.text
    assert over.json()["error"]["code"] == "quota_exceeded"
    assert whoami(server, original["key"]).status_code == 429
    # A refresh cannot mint a fresh budget either: it is itself over quota.
    assert refresh(server, original["key"]).status_code == 429


def test_a_lineage_refreshes_at_most_once_a_minute(server: ServerProcess) -> None:
    """A key that refreshes itself in a loop mints one successor a minute, not
    hundreds, and so do its successors together (SPEC §5: a lineage)."""
    original = server.create_key("reader", name=unique_name("looping"),
                                 expires_in_seconds=3600)
    other = server.create_key("reader", expires_in_seconds=3600)
    first = refresh(server, original["key"])
    assert first.status_code == 201, first.text
    for key in (original["key"], first.json()["key"]):
        again = refresh(server, key)
        assert again.status_code == 429, again.text
        assert again.json()["error"]["code"] == "quota_exceeded"
        assert "refreshed from the same first key" in again.json()["error"]["message"]
        assert 1 <= int(again.headers["Retry-After"]) <= 60
    assert refresh(server, other["key"]).status_code == 201  # another lineage
    with fencepost.Client(server.base_url, server.admin_key) as admin:  # every page
        minted = [k for k in admin.list_keys() if k.name == original["name"]]
    assert len(minted) == 2  # the original and its one successor


def test_successors_refreshing_at_once_mint_one_key(server: ServerProcess) -> None:
    """The hostile case: a key asked many times at the same moment mints one
    successor; then the key and its successor asking at once mint none."""
    original = server.create_key("member", name=unique_name("swarm"), expires_in_seconds=3600)
    with ThreadPoolExecutor(16) as pool:
        first = list(pool.map(lambda _: refresh(server, original["key"]), range(16)))
    assert sorted(r.status_code for r in first) == [201] + [429] * 15
    successor = next(r.json()["key"] for r in first if r.status_code == 201)
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda key: refresh(server, key).status_code,
                                 [original["key"], successor] * 8))
    assert statuses == [429] * 16
    with fencepost.Client(server.base_url, server.admin_key) as admin:
        minted = [k for k in admin.list_keys() if k.name == original["name"]]
    assert len(minted) == 2
