"""SPEC §5: retiring a key (`POST /v1/keys/{id}/retire`, and `POST /v1/keys/refresh`
with `retire_previous`) over HTTP, on both stores: the key stops working at once on
every route, the keys refreshed from it keep working, it is idempotent, shown as
`retired`, logged with its id and never its secret; only an admin of the project or
the key itself may; and bad input changes nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pg_support import server_on
from support import ServerProcess, assert_error, lock_headers, new_token

EVERY_KEY = {"limit": "1000"}


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    with server_on(request.param, tmp_path,
                   extra_args=["--event-log", str(tmp_path / "events.log")]) as started:
        yield started


def _states(server: ServerProcess) -> dict[str, dict[str, Any]]:
    with server.client() as admin:
        return {k["id"]: k for k in admin.get("/v1/keys", params=EVERY_KEY).json()["keys"]}


def _works(server: ServerProcess, key: str) -> bool:
    with server.client(key) as c:
        status = c.get("/v1/whoami").status_code
    assert status in (200, 401), status
    return status == 200


def _retire(server: ServerProcess, key_id: str, by: str | None = None) -> httpx.Response:
    with server.client(by) as c:
        return c.post(f"/v1/keys/{key_id}/retire")


def test_a_retired_key_stops_and_its_successor_goes_on(server: ServerProcess) -> None:
    first = server.create_key("member", name="worker")
    with server.client(first["key"]) as c:
        successor = c.post("/v1/keys/refresh").json()
    resp = _retire(server, first["id"])
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"id": first["id"], "retired": True, "state": "retired"}
    assert not _works(server, first["key"])
    assert _works(server, successor["key"])
    again = _retire(server, first["id"])  # idempotent
    assert again.status_code == 200 and again.json() == resp.json()
    states = _states(server)
    assert states[first["id"]]["state"] == "retired"
    assert states[first["id"]]["revoked_at"] is None
    assert (states[successor["id"]]["state"], states[successor["id"]]["refreshed_from"]) == \
        ("active", first["id"])
    # Revoking still follows the lineage: a leak takes the successors too.
    with server.client() as admin:
        assert admin.delete(f"/v1/keys/{first['id']}").json() == {"revoked": True}
    assert not _works(server, successor["key"])
    assert _states(server)[first["id"]]["state"] == "revoked"
    # Logged with the ids, never a secret.
    lines = [line for line in server.access_log_lines() if line.get("event") == "key.retire"]
    assert [line["retired_key_id"] for line in lines] == [first["id"], first["id"]]
    text = server.access_log.read_text() + (server.workdir.parent / "events.log").read_text()
    assert first["key"] not in text and successor["key"] not in text
    events = [json.loads(line) for line in
              (server.workdir.parent / "events.log").read_text().splitlines()]
    retired = [e for e in events if e.get("event") == "key.retired"]
    assert [e["target_key_id"] for e in retired] == [first["id"]]  # once, not per call


def test_a_retired_key_is_refused_on_every_route(server: ServerProcess) -> None:
    admin_of_its_own = server.create_key("admin", name="retiring-admin")
    assert _retire(server, admin_of_its_own["id"], by=admin_of_its_own["key"]).status_code == 200
    with server.client(admin_of_its_own["key"]) as c:
        for method, path, body in [
            ("GET", "/v1/whoami", None), ("GET", "/v1/keys", None),
            ("PUT", "/v1/locks/retired-lock/lease", {"ttl_seconds": 30}),
            ("GET", "/v1/locks", None), ("POST", "/v1/keys/refresh", None),
            ("POST", "/v1/keys", {"role": "reader"}), ("GET", "/v1/pools", None),
            ("POST", f"/v1/keys/{admin_of_its_own['id']}/retire", None),
        ]:
            resp = c.request(method, path, json=body, headers=lock_headers(new_token()))
            assert_error(resp, 401, "unauthorized")


def test_the_key_itself_or_an_admin_may_retire_it_nobody_else(server: ServerProcess) -> None:
    member = server.create_key("member")
    reader = server.create_key("reader")
    for by in (member, reader):  # not an admin, not the key: 403, nothing changed
        other = server.create_key("member")
        assert_error(_retire(server, other["id"], by=by["key"]), 403, "forbidden")
        assert _works(server, other["key"])
    for key in (member, reader):  # the key itself, whatever its role
        assert _retire(server, key["id"], by=key["key"]).json()["retired"] is True
        assert not _works(server, key["key"])


def test_unknown_and_other_projects_keys_are_not_found(server: ServerProcess,
                                                       tmp_path: Path) -> None:
    other_admin = server.create_project(f"other-{new_token()[:8]}")
    with server.client(other_admin) as c:
        theirs = c.post("/v1/keys", json={"role": "member"}).json()
    for key_id in (theirs["id"], "key_0000000000000000", "nonsense", "key_%00"):
        assert_error(_retire(server, key_id), 404, "not_found")
    assert _works(server, theirs["key"])


def test_a_revoked_key_stays_revoked(server: ServerProcess) -> None:
    key = server.create_key("member")
    with server.client() as admin:
        admin.delete(f"/v1/keys/{key['id']}")
    resp = _retire(server, key["id"])
    assert resp.status_code == 200
    assert resp.json() == {"id": key["id"], "retired": False, "state": "revoked"}


def test_a_refresh_can_retire_the_key_it_came_from(server: ServerProcess) -> None:
    first = server.create_key("member", expires_in_seconds=3600)
    with server.client(first["key"]) as c:
        resp = c.post("/v1/keys/refresh", json={"retire_previous": True})
    assert resp.status_code == 201, resp.text
    successor = resp.json()
    assert not _works(server, first["key"])  # at once, on this replica
    assert _works(server, successor["key"])
    states = _states(server)
    assert states[first["id"]]["state"] == "retired"
    assert states[successor["id"]]["refreshed_from"] == first["id"]
    (line,) = [line for line in server.access_log_lines()
               if line.get("event") == "key.refresh" and line["key_id"] == first["id"]]
    assert line["retired_key_id"] == first["id"] and line["new_key_id"] == successor["id"]


@pytest.mark.parametrize("body", [{"retire_previous": "yes"}, {"retire_previous": 1},
                                  {"retire_previous": None}, {"retire_previus": True}])
def test_a_bad_retire_previous_is_refused_and_changes_nothing(server: ServerProcess,
                                                              body: dict[str, Any]) -> None:
    key = server.create_key("member")
    with server.client(key["key"]) as c:
        resp = c.post("/v1/keys/refresh", json=body)
    assert_error(resp, 422, "validation_error")
    assert _works(server, key["key"])
    assert not [k for k in _states(server).values() if k["refreshed_from"] == key["id"]]


def test_a_retire_racing_a_refresh_never_mints_from_a_retired_key(server: ServerProcess) -> None:
    """Either the refresh came first (a successor that works, the key retired) or
    the retirement did (the refresh refused): never a refresh that succeeds on a
    key already retired."""
    for _ in range(5):
        key = server.create_key("member")
        answers: dict[str, httpx.Response] = {}

        def refresh(key: dict[str, Any] = key, answers: dict[str, Any] = answers) -> None:
            with server.client(key["key"]) as c:
                answers["refresh"] = c.post("/v1/keys/refresh")

        def retire(key: dict[str, Any] = key, answers: dict[str, Any] = answers) -> None:
            answers["retire"] = _retire(server, key["id"])

        threads = [threading.Thread(target=refresh), threading.Thread(target=retire)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert answers["retire"].json()["retired"] is True
        refreshed = answers["refresh"]
        assert refreshed.status_code in (201, 401), refreshed.text
        successors = [k for k in _states(server).values() if k["refreshed_from"] == key["id"]]
        if refreshed.status_code == 201:
            assert [s["id"] for s in successors] == [refreshed.json()["id"]]
            assert _works(server, refreshed.json()["key"])
        else:
            assert successors == []
        assert not _works(server, key["key"])
