"""SPEC §3.9: lock delay after expiry and force release, over HTTP."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from support import ServerProcess, lock_headers, new_token, unique_name


def at_ms(value: str) -> int:
    moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def acquire(c: httpx.Client, key: str, token: str | None = None, **body: Any) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token or new_token()),
                 json={"ttl_seconds": 30, **body})


def test_force_release_starts_the_delay_then_a_waiter_is_granted(
    member: httpx.Client, server: ServerProcess, member_key: str,
) -> None:
    key = unique_name("delay")
    first = acquire(member, key, lock_delay_seconds=2)
    assert first.status_code == 201, first.text
    forced = member.delete(f"/v1/locks/{key}").json()
    assert forced["released"] is True
    # On the server's clock: when the force release happened.
    forced_ms = at_ms(first.json()["acquired_at"]) + forced["age_ms"]

    refused = acquire(member, key)
    assert refused.status_code == 409, refused.text
    err = refused.json()["error"]
    assert err["code"] == "lock_held" and err["reason"] == "lock_delay"
    assert 0 < err["retry_after_ms"] <= 2_000
    assert refused.headers["Retry-After"] in {"1", "2"}

    # A waiter keeps its place and is granted once the delay is over.
    waited: dict[str, Any] = {}

    def wait() -> None:
        with server.client(member_key) as c:
            waited["resp"] = acquire(c, key, wait_seconds=10)

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(timeout=15)
    resp = waited["resp"]
    assert resp.status_code == 201, resp.text
    assert at_ms(resp.json()["acquired_at"]) >= forced_ms + 2_000  # never inside the delay
    assert resp.json()["fencing_token"] > first.json()["fencing_token"]


def test_expiry_starts_the_delay_and_a_release_does_not(member: httpx.Client) -> None:
    key, token = unique_name("delay"), new_token()
    assert acquire(member, key, token, lock_delay_seconds=60).status_code == 201
    assert member.delete(f"/v1/locks/{key}/lease", headers=lock_headers(token)).json() == \
        {"released": True}
    assert acquire(member, key).status_code == 201  # its holder released it: no delay

    key = unique_name("delay")
    granted = acquire(member, key, ttl_seconds=5, lock_delay_seconds=60)
    assert granted.status_code == 201
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        resp = acquire(member, key)
        assert resp.status_code == 409, resp.text
        if resp.json()["error"].get("reason") == "lock_delay":
            break
        time.sleep(0.2)
    else:
        pytest.fail("the expired lease never started its delay")
    assert resp.json()["error"]["retry_after_ms"] > 50_000


@pytest.mark.parametrize("value", [61, -1, "5", 1.5, None, True])
def test_bad_lock_delay_is_422(member: httpx.Client, value: Any) -> None:
    key = unique_name("delay")
    resp = acquire(member, key, lock_delay_seconds=value)
    assert resp.status_code == 422, resp.text
    assert "lock_delay_seconds" in {d["field"] for d in resp.json()["error"]["details"]}
    assert member.get(f"/v1/locks/{key}").json()["held"] is False
