"""Projects are isolated: no key reads or changes anything of another project (SPEC §1, §7.6)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from support import ServerProcess, lock_headers, new_token, unique_name


@dataclass
class Project:
    name: str
    admin_key: str
    server: ServerProcess

    def client(self, key: str | None = None) -> httpx.Client:
        return self.server.client(key or self.admin_key)


def wait_accepted(server: ServerProcess, key: str, timeout: float = 3.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        with server.client(key) as c:
            resp = c.get("/v1/whoami")
        if resp.status_code == 200 or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


@pytest.fixture(scope="module")
def project_a(server: ServerProcess) -> Project:
    return Project("default", server.admin_key, server)


@pytest.fixture(scope="module")
def project_b(server: ServerProcess) -> Project:
    name = unique_name("proj")
    key = server.create_project(name)
    assert key and len(key.split()) == 1, key
    resp = wait_accepted(server, key)
    assert resp.status_code == 200, resp.text
    return Project(name, key, server)


def acquire(project: Project, name: str, token: str, **body: Any) -> httpx.Response:
    with project.client() as c:
        return c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": 600, **body})


def get_lock(project: Project, name: str) -> dict[str, Any]:
    with project.client() as c:
        resp = c.get(f"/v1/locks/{name}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def all_held(project: Project, prefix: str | None = None) -> list[dict[str, Any]]:
    locks: list[dict[str, Any]] = []
    after = None
    with project.client() as c:
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if prefix is not None:
                params["prefix"] = prefix
            if after is not None:
                params["after"] = after
            resp = c.get("/v1/locks", params=params)
            assert resp.status_code == 200, resp.text
            locks += resp.json()["locks"]
            after = resp.json()["next"]
            if after is None:
                return locks


@pytest.fixture
def a_lock(project_a: Project) -> tuple[str, str, dict[str, Any]]:
    """A lock held in project A, with an operation and metadata B must never see."""
    name, token = unique_name("secret-lock"), new_token()
    resp = acquire(project_a, name, token, operation="migrate-a",
                   metadata={"host": "a-host", "pid": 4242})
    assert resp.status_code == 201, resp.text
    return name, token, get_lock(project_a, name)


def assert_a_untouched(project_a: Project, name: str, before: dict[str, Any]) -> None:
    now = get_lock(project_a, name)
    assert now["held"] is True, "project B changed project A's lock"
    for field in ("fencing_token", "expires_at", "operation", "metadata", "acquired_at"):
        assert now[field] == before[field], field


def test_whoami_reports_each_project(project_a: Project, project_b: Project) -> None:
    with project_a.client() as c:
        assert c.get("/v1/whoami").json()["project"] == "default"
    with project_b.client() as c:
        me = c.get("/v1/whoami").json()
    assert me["project"] == project_b.name
    assert me["role"] == "admin"
    member = None
    with project_b.client() as c:
        made = c.post("/v1/keys", json={"role": "member"})
        assert made.status_code == 201, made.text
        member = made.json()
    assert member["project"] == project_b.name
    with project_b.client(member["key"]) as c:
        assert c.get("/v1/whoami").json() == {"project": project_b.name,
                                              "key_id": member["id"], "role": "member",
                                              "expires_at": None}


def test_same_name_is_two_independent_locks(project_a: Project, project_b: Project) -> None:
    name = unique_name("same")
    token_a, token_b = new_token(), new_token()
    got_a = acquire(project_a, name, token_a, operation="in-a")
    assert got_a.status_code == 201, got_a.text
    got_b = acquire(project_b, name, token_b, operation="in-b")
    assert got_b.status_code == 201, f"project A's lock blocked project B: {got_b.text}"
    assert got_b.json()["fencing_token"] > got_a.json()["fencing_token"]  # one counter per store
    seen_a, seen_b = get_lock(project_a, name), get_lock(project_b, name)
    assert seen_a["operation"] == "in-a" and seen_b["operation"] == "in-b"
    assert seen_a["fencing_token"] == got_a.json()["fencing_token"]
    assert seen_b["fencing_token"] == got_b.json()["fencing_token"]
    # each project's holder can retry, renew and release only its own
    with project_a.client() as c:
        assert c.put(f"/v1/locks/{name}/lease", headers=lock_headers(token_b),
                     json={"ttl_seconds": 600}).status_code == 409
        released = c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token_a})
        assert released.json() == {"released": True}
    assert get_lock(project_a, name)["held"] is False
    assert get_lock(project_b, name)["held"] is True
    assert get_lock(project_b, name)["fencing_token"] == got_b.json()["fencing_token"]


def test_same_lock_token_in_both_projects(project_a: Project, project_b: Project) -> None:
    """A's lock token, presented by B on the same name, starts B's own lease."""
    name, token = unique_name("tok"), new_token()
    assert acquire(project_a, name, token).status_code == 201
    before = get_lock(project_a, name)
    got_b = acquire(project_b, name, token)
    assert got_b.status_code == 201, f"B's acquire with A's token taken as a retry: {got_b.text}"
    assert got_b.json()["fencing_token"] != before["fencing_token"]
    with project_b.client() as c:
        assert c.delete(f"/v1/locks/{name}/lease",
                        headers={"X-Lock-Token": token}).json() == {"released": True}
    assert_a_untouched(project_a, name, before)


def test_b_cannot_see_a_lock(project_b: Project, a_lock: tuple[str, str, dict[str, Any]]) -> None:
    name, _, _ = a_lock
    with project_b.client() as c:
        resp = c.get(f"/v1/locks/{name}")
    assert resp.status_code == 200, resp.text  # to B it is a lock never held (SPEC §3.4)
    seen = resp.json()
    assert seen["key"] == name and seen["held"] is False
    for field in ("fencing_token", "operation", "acquired_at", "expires_at", "deadline_at",
                  "metadata"):
        assert seen[field] is None, field
    assert "migrate-a" not in resp.text and "a-host" not in resp.text


def test_b_cannot_list_a_locks(project_a: Project, project_b: Project,
                               a_lock: tuple[str, str, dict[str, Any]]) -> None:
    name, _, _ = a_lock
    assert name in {lock["key"] for lock in all_held(project_a, prefix=name)}
    assert all_held(project_b, prefix=name) == []
    b_locks = all_held(project_b)
    assert name not in {lock["key"] for lock in b_locks}
    assert all(lock["operation"] != "migrate-a" for lock in b_locks)
    with project_b.client() as c:
        text = c.get("/v1/locks", params={"limit": 1000}).text
    assert "migrate-a" not in text and "a-host" not in text


def test_b_locks_are_not_listed_in_a(project_a: Project, project_b: Project) -> None:
    name = unique_name("b-only")
    assert acquire(project_b, name, new_token()).status_code == 201
    assert [lock["key"] for lock in all_held(project_b, prefix=name)] == [name]
    assert all_held(project_a, prefix=name) == []
    assert get_lock(project_a, name)["held"] is False


def test_b_cannot_release_a_lease(project_a: Project, project_b: Project,
                                  a_lock: tuple[str, str, dict[str, Any]]) -> None:
    name, token, before = a_lock
    with project_b.client() as c:
        resp = c.delete(f"/v1/locks/{name}/lease", headers={"X-Lock-Token": token})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"released": False}
    assert_a_untouched(project_a, name, before)


def test_b_cannot_renew_a_lease(project_a: Project, project_b: Project,
                                a_lock: tuple[str, str, dict[str, Any]]) -> None:
    name, token, before = a_lock
    with project_b.client() as c:
        resp = c.patch(f"/v1/locks/{name}/lease", headers=lock_headers(token),
                       json={"ttl_seconds": 7776000})
    assert resp.status_code == 409, resp.text
    assert resp.json()["error"]["code"] == "lease_lost"
    assert "migrate-a" not in resp.text
    assert_a_untouched(project_a, name, before)


def test_b_cannot_force_release_a_lock(project_a: Project, project_b: Project,
                                       a_lock: tuple[str, str, dict[str, Any]]) -> None:
    name, _, before = a_lock
    with project_b.client() as c:
        resp = c.delete(f"/v1/locks/{name}")
    assert resp.status_code == 200, resp.text
    assert resp.json()["released"] is False
    assert "migrate-a" not in resp.text
    assert_a_untouched(project_a, name, before)


def test_b_acquire_does_not_wait_on_a(project_a: Project, project_b: Project,
                                      a_lock: tuple[str, str, dict[str, Any]]) -> None:
    name, _, before = a_lock
    with project_b.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30, "wait_seconds": 5})
    assert resp.status_code == 201, resp.text
    assert get_lock(project_a, name)["waiters"] == 0
    assert_a_untouched(project_a, name, before)


def test_keys_are_listed_per_project(project_a: Project, project_b: Project) -> None:
    a_key = project_a.server.create_key("reader", name=unique_name("a-key"))
    with project_b.client() as c:
        b_key = c.post("/v1/keys", json={"role": "reader", "name": unique_name("b-key")}).json()
        b_list = c.get("/v1/keys", params={"limit": "1000"})
    assert b_list.status_code == 200, b_list.text
    b_ids = {k["id"] for k in b_list.json()["keys"]}
    assert b_key["id"] in b_ids and a_key["id"] not in b_ids
    assert all(k["project"] == project_b.name for k in b_list.json()["keys"])
    assert a_key["name"] not in b_list.text
    with project_a.client() as c:
        a_list = c.get("/v1/keys", params={"limit": "1000"})
    a_ids = {k["id"] for k in a_list.json()["keys"]}
    assert a_key["id"] in a_ids and b_key["id"] not in a_ids
    assert not a_ids & b_ids
    assert all(k["project"] == "default" for k in a_list.json()["keys"])


def test_b_cannot_revoke_a_key(project_a: Project, project_b: Project) -> None:
    a_key = project_a.server.create_key("member")
    with project_b.client() as c:
        resp = c.delete(f"/v1/keys/{a_key['id']}")
    assert resp.status_code == 404, resp.text
    assert resp.json()["error"]["code"] == "not_found"
    with project_a.client() as c:
        page = c.get("/v1/keys", params={"limit": "1000"}).json()
        listed = {k["id"]: k for k in page["keys"]}
    assert listed[a_key["id"]]["revoked_at"] is None
    with project_a.client(a_key["key"]) as c:
        assert c.get("/v1/whoami").status_code == 200


def test_a_cannot_revoke_b_key(project_a: Project, project_b: Project) -> None:
    with project_b.client() as c:
        b_key = c.post("/v1/keys", json={"role": "member"}).json()
    with project_a.client() as c:
        resp = c.delete(f"/v1/keys/{b_key['id']}")
    assert resp.status_code == 404, resp.text
    assert resp.json()["error"]["code"] == "not_found"
    with project_b.client(b_key["key"]) as c:
        assert c.get("/v1/whoami").status_code == 200


def test_b_member_key_is_confined_to_b(project_a: Project, project_b: Project,
                                       a_lock: tuple[str, str, dict[str, Any]]) -> None:
    name, token, before = a_lock
    with project_b.client() as c:
        member = c.post("/v1/keys", json={"role": "member"}).json()
    with project_b.client(member["key"]) as c:
        assert c.get(f"/v1/locks/{name}").json()["held"] is False
        assert c.delete(f"/v1/locks/{name}/lease",
                        headers={"X-Lock-Token": token}).json() == {"released": False}
        got = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(), json={"ttl_seconds": 30})
        assert got.status_code == 201, got.text
    assert_a_untouched(project_a, name, before)


def test_cli_created_project_admin_cannot_touch_default(server: ServerProcess,
                                                        project_a: Project) -> None:
    """A second freshly created project, to check the CLI's keys are confined too."""
    other = Project(unique_name("proj"), "", server)
    other.admin_key = server.create_project(other.name)
    assert wait_accepted(server, other.admin_key).status_code == 200
    assert other.admin_key != server.admin_key
    with other.client() as c:
        me = c.get("/v1/whoami").json()
        keys = c.get("/v1/keys", params={"limit": "1000"}).json()["keys"]
    assert me["project"] == other.name
    assert [k["id"] for k in keys] == [me["key_id"]]
    assert all(k["project"] == other.name for k in keys)
