"""Who holds and who waits over HTTP (SPEC §3.4 holder and line, §4.1 pool slots)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from support import ServerProcess, lock_headers, new_token, parse_at, unique_name, wait_for


def acquire(c: httpx.Client, key: str, token: str, **body: Any) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                 json={"ttl_seconds": 60, **body})


class Keys:
    def __init__(self, server: ServerProcess) -> None:
        self.alice = server.create_key("member", name="alice")
        self.bob = server.create_key("member", name="bob")
        self.nameless = server.create_key("member")
        self.reader = server.create_key("reader", name="watcher")


@pytest.fixture(scope="module")
def keys(server: ServerProcess) -> Keys:
    return Keys(server)


@pytest.fixture(scope="module")
def other_project_key(server: ServerProcess) -> str:
    secret = server.create_project(unique_name("proj"))
    # Running servers accept a project made in the store within 2 s.
    assert wait_for(lambda: server.client(secret).get("/v1/whoami").status_code == 200)
    return secret


@pytest.fixture
def client_of(server: ServerProcess) -> Iterator[Callable[[dict[str, Any]], httpx.Client]]:
    opened: list[httpx.Client] = []

    def make(key: dict[str, Any]) -> httpx.Client:
        opened.append(server.client(str(key["key"])))
        return opened[-1]

    yield make
    for c in opened:
        c.close()


def park(client: httpx.Client, key: str, token: str, wait_seconds: float) -> threading.Thread:
    """An acquire that waits in line in a thread; its response lands in `thread.result`."""
    def run() -> None:
        thread.result = acquire(client, key, token, wait_seconds=wait_seconds)  # type: ignore[attr-defined]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_holder_and_line_name_keys_never_tokens(keys: Keys, client_of: Any) -> None:
    key = unique_name()
    alice, bob, nameless = client_of(keys.alice), client_of(keys.bob), client_of(keys.nameless)
    reader = client_of(keys.reader)
    holder_token, bob_token, nameless_token = new_token(), new_token(), new_token()
    assert acquire(alice, key, holder_token).status_code == 201
    bob_waits = park(bob, key, bob_token, 30)
    assert wait_for(lambda: reader.get(f"/v1/locks/{key}").json()["waiters"] == 1)
    nameless_waits = park(nameless, key, nameless_token, 5)
    assert wait_for(lambda: reader.get(f"/v1/locks/{key}").json()["waiters"] == 2)
    resp = reader.get(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    state = resp.json()
    assert state["holder"] == {"key_id": keys.alice["id"], "key_name": "alice"}
    first, second = state["line"]
    assert set(first) == {"key_id", "key_name", "since_at", "gives_up_at"}
    assert (first["key_id"], first["key_name"]) == (keys.bob["id"], "bob")
    assert (second["key_id"], second["key_name"]) == (keys.nameless["id"], None)
    assert parse_at(first["since_at"]) <= parse_at(second["since_at"])
    # Each waiter gives up when its own wait ends.
    bob_wait = parse_at(first["gives_up_at"]) - parse_at(first["since_at"])
    nameless_wait = parse_at(second["gives_up_at"]) - parse_at(second["since_at"])
    assert bob_wait.total_seconds() == 30 and nameless_wait.total_seconds() == 5
    for token in (holder_token, bob_token, nameless_token):
        assert token not in resp.text
    listed = reader.get("/v1/locks", params={"prefix": key}).json()["locks"]
    assert [(lk["key"], lk["holder"], lk["line"]) for lk in listed] == [
        (key, state["holder"], state["line"])
    ]
    # The line moves: the head is granted and leaves the line.
    assert alice.delete(f"/v1/locks/{key}/lease", headers=lock_headers(holder_token)).json() == {
        "released": True
    }
    bob_waits.join(10)
    assert bob_waits.result.status_code == 201  # type: ignore[attr-defined]
    state = reader.get(f"/v1/locks/{key}").json()
    assert state["holder"] == {"key_id": keys.bob["id"], "key_name": "bob"}
    assert [w["key_id"] for w in state["line"]] == [keys.nameless["id"]]
    bob.delete(f"/v1/locks/{key}/lease", headers=lock_headers(bob_token))
    nameless_waits.join(10)
    assert nameless_waits.result.status_code == 201  # type: ignore[attr-defined]
    nameless.delete(f"/v1/locks/{key}/lease", headers=lock_headers(nameless_token))
    state = reader.get(f"/v1/locks/{key}").json()
    assert state["held"] is False and state["holder"] is None and state["line"] == []


def test_free_lock_shows_no_holder(keys: Keys, client_of: Any) -> None:
    state = client_of(keys.reader).get(f"/v1/locks/{unique_name()}").json()
    assert state["holder"] is None and state["line"] == [] and state["waiters"] == 0


def test_another_project_sees_no_holder_or_line(
    server: ServerProcess, keys: Keys, client_of: Any, other_project_key: str
) -> None:
    key = unique_name()
    token = new_token()
    alice = client_of(keys.alice)
    assert acquire(alice, key, token).status_code == 201
    with server.client(other_project_key) as other:
        state = other.get(f"/v1/locks/{key}").json()
        assert state["held"] is False and state["holder"] is None and state["line"] == []
        assert other.get("/v1/locks", params={"prefix": key}).json()["locks"] == []
    alice.delete(f"/v1/locks/{key}/lease", headers=lock_headers(token))


def test_inspect_refuses_unknown_query_parameters(keys: Keys, client_of: Any) -> None:
    resp = client_of(keys.reader).get(f"/v1/locks/{unique_name()}", params={"holder": "1"})
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["details"] == [
        {"field": "holder", "message": "unknown query parameter"}
    ]


# --- pool slots ------------------------------------------------------------------


@pytest.fixture
def pool(server: ServerProcess) -> Iterator[str]:
    name = unique_name("pool")
    with server.client() as admin:
        assert admin.put(f"/v1/pools/{name}", json={"limit": 3}).status_code == 201
        yield name
        admin.delete(f"/v1/pools/{name}")


def take_slot(client: httpx.Client, pool: str) -> dict[str, Any]:
    resp = client.post(f"/v1/pools/{pool}/lock/acquire")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_slots_show_holders_and_only_a_prefix_of_each_id(
    keys: Keys, client_of: Any, pool: str
) -> None:
    alice, bob, reader = client_of(keys.alice), client_of(keys.bob), client_of(keys.reader)
    assert reader.get(f"/v1/pools/{pool}/slots").json() == {"slots": []}
    mine, theirs = take_slot(alice, pool), take_slot(bob, pool)
    resp = reader.get(f"/v1/pools/{pool}/slots")
    assert resp.status_code == 200, resp.text
    slots = resp.json()["slots"]
    assert [(s["key_id"], s["key_name"]) for s in slots] == [
        (keys.alice["id"], "alice"), (keys.bob["id"], "bob")
    ]
    for shown, granted in zip(slots, (mine, theirs), strict=True):
        assert set(shown) == {
            "slot_id_prefix", "key_id", "key_name", "acquired_at", "lease_deadline",
            "request_deadline",
        }
        assert granted["slot_id"].startswith(shown["slot_id_prefix"])
        assert granted["slot_id"] not in resp.text
        assert shown["lease_deadline"] == granted["lease_deadline"]
        assert shown["request_deadline"] == granted["request_deadline"]
        parse_at(shown["acquired_at"])
    released = alice.post(f"/v1/pools/{pool}/lock/{mine['slot_id']}/release")
    assert released.json() == {"released": True}
    assert [s["key_name"] for s in reader.get(f"/v1/pools/{pool}/slots").json()["slots"]] == [
        "bob"
    ]


def test_slots_of_unknown_or_foreign_pool_are_404(
    server: ServerProcess, keys: Keys, client_of: Any, pool: str, other_project_key: str
) -> None:
    take_slot(client_of(keys.alice), pool)
    resp = client_of(keys.reader).get(f"/v1/pools/{unique_name('nope')}/slots")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    with server.client(other_project_key) as other:
        resp = other.get(f"/v1/pools/{pool}/slots")
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_slots_bad_input(server: ServerProcess, keys: Keys, client_of: Any, pool: str) -> None:
    reader = client_of(keys.reader)
    resp = reader.get(f"/v1/pools/{pool}/slots", params={"limit": "5"})
    assert resp.status_code == 422 and resp.json()["error"]["details"] == [
        {"field": "limit", "message": "unknown query parameter"}
    ]
    resp = reader.get("/v1/pools/bad%20name/slots")
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "validation_error"
    with httpx.Client(base_url=server.base_url) as anonymous:
        assert anonymous.get(f"/v1/pools/{pool}/slots").status_code == 401
