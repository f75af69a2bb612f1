"""GET /v1/keys pages (`?limit=`, `?after=`) in the order keys were made, and
shows each key's `state` and `refreshed_from` (SPEC §5)."""

from __future__ import annotations

import time

import fencepost
from support import ServerProcess, unique_name


def test_keys_page_in_creation_order_with_their_state(server: ServerProcess) -> None:
    made = [server.create_key("reader", name=unique_name("paged")) for _ in range(5)]
    expiring = server.create_key("reader", expires_in_seconds=1)
    with server.client() as admin:
        assert admin.delete(f"/v1/keys/{made[1]['id']}").status_code == 200
        successor = admin.post("/v1/keys/refresh", headers={
            "Authorization": f"Bearer {made[2]['key']}"}).json()
        time.sleep(1.1)  # the expiring key's second runs out
        seen: list[dict[str, object]] = []
        after = None
        for _ in range(100):
            params = {"limit": "2", **({"after": after} if after else {})}
            page = admin.get("/v1/keys", params=params)
            assert page.status_code == 200, page.text
            body = page.json()
            assert len(body["keys"]) <= 2
            seen += body["keys"]
            after = body["next"]
            if after is None:
                break
        ids = [key["id"] for key in seen]
        assert len(ids) == len(set(ids))  # no key twice across pages
        everything = admin.get("/v1/keys", params={"limit": "1000"}).json()
        assert [k["id"] for k in everything["keys"]] == ids and everything["next"] is None
    by_id = {key["id"]: key for key in seen}
    assert [k for k in ids if k in {m["id"] for m in made}] == [m["id"] for m in made]
    assert by_id[made[1]["id"]]["state"] == "revoked"
    assert by_id[made[0]["id"]]["state"] == "active"
    assert by_id[expiring["id"]]["state"] == "expired"
    assert by_id[successor["id"]]["refreshed_from"] == made[2]["id"]
    assert by_id[made[2]["id"]]["refreshed_from"] is None
    # The client gathers every page.
    with fencepost.Client(server.base_url, server.admin_key) as client:
        assert [key.id for key in client.list_keys()] == ids


def test_bad_key_list_queries_are_refused(server: ServerProcess) -> None:
    with server.client() as admin:
        for params in ({"limit": "0"}, {"limit": "1001"}, {"limit": "x"},
                       {"prefix": "a"}, {"after": "not a cursor"}):
            resp = admin.get("/v1/keys", params=params)
            assert resp.status_code == 422, (params, resp.text)
        # A cursor that names no key of the project: an empty last page.
        empty = admin.get("/v1/keys", params={"after": "key_0000000000000000"}).json()
        assert empty == {"keys": [], "next": None}
