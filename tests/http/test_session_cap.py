"""A key holds at most 1,000 live sessions (SPEC §5): the next is refused with
`429 too_many_sessions` and Retry-After until one ends or expires; another key
is not affected. On both stores, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fencepost.core.sessions import MAX_LIVE_SESSIONS
from pg_support import server_on
from support import ServerProcess


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    with server_on(request.param, tmp_path) as started:
        yield started


def test_a_key_holds_at_most_a_thousand_live_sessions(server: ServerProcess) -> None:
    flooder = server.create_key("member", name="flooder")["key"]
    other = server.create_key("member", name="other")["key"]
    with server.client(flooder) as c, server.client(other) as o:
        made = [c.post("/v1/sessions", json={"ttl_seconds": 600}) for _ in range(MAX_LIVE_SESSIONS)]
        assert {resp.status_code for resp in made} == {201}
        refused = c.post("/v1/sessions", json={"ttl_seconds": 600, "name": "one-too-many"})
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_sessions"
        assert 1 <= int(refused.headers["Retry-After"]) <= 600  # the soonest expiry
        # Another key is not affected.
        assert o.post("/v1/sessions", json={"ttl_seconds": 60}).status_code == 201
        # One ended makes room for one.
        first = made[0].json()["session_id"]
        assert c.delete(f"/v1/sessions/{first}").json()["ended"] is True
        assert c.post("/v1/sessions", json={"ttl_seconds": 600}).status_code == 201
        assert c.post("/v1/sessions", json={"ttl_seconds": 600}).status_code == 429
