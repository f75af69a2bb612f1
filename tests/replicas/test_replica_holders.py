"""Who holds and who waits is the store's truth: any replica shows the holder
and the line, whichever replica granted the lease or parked the waiter."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from support import ServerProcess, lock_headers, new_token, unique_name


def test_any_replica_shows_holder_line_and_slots(
    start_replica: Callable[..., ServerProcess],
) -> None:
    a, b = start_replica("a"), start_replica("b")
    member = a.create_key("member", name="on-b")
    key, token = unique_name(), new_token()
    with a.client() as ca:
        assert ca.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                      json={"ttl_seconds": 60}).status_code == 201
        answer: dict[str, int] = {}

        def wait_on_b() -> None:
            with b.client(str(member["key"])) as cb:
                answer["status"] = cb.put(
                    f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                    json={"ttl_seconds": 30, "wait_seconds": 20},
                ).status_code

        waiter = threading.Thread(target=wait_on_b, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 10
        while (state := ca.get(f"/v1/locks/{key}").json())["waiters"] != 1:
            assert time.monotonic() < deadline, "the waiter on b never showed on a"
            time.sleep(0.05)
        assert state["holder"]["key_name"] == "bootstrap"
        assert [(w["key_id"], w["key_name"]) for w in state["line"]] == [(member["id"], "on-b")]
        ca.delete(f"/v1/locks/{key}/lease", headers=lock_headers(token))
        waiter.join(15)
        assert answer == {"status": 201}
        assert ca.get(f"/v1/locks/{key}").json()["holder"] == {
            "key_id": member["id"], "key_name": "on-b"
        }
        pool = unique_name("pool")
        assert ca.put(f"/v1/pools/{pool}", json={"limit": 2}).status_code == 201
    with b.client(str(member["key"])) as cb:
        grant = cb.post(f"/v1/pools/{pool}/lock/acquire").json()
    with a.client() as ca:
        [slot] = ca.get(f"/v1/pools/{pool}/slots").json()["slots"]
    assert slot["key_name"] == "on-b" and grant["slot_id"].startswith(slot["slot_id_prefix"])
