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


def test_a_key_and_its_successors_share_the_thousand(server: ServerProcess) -> None:
    """SPEC §5: the bound is per lineage. A member key that refreshes itself
    cannot hold a thousand sessions with each successor."""
    first = server.create_key("member", name="lineage", expires_in_seconds=3600)["key"]
    with server.client(first) as c:
        successor = c.post("/v1/keys/refresh").json()["key"]
    half = MAX_LIVE_SESSIONS // 2
    with server.client(first) as c, server.client(successor) as s:
        made = [c.post("/v1/sessions", json={"ttl_seconds": 600}) for _ in range(half)]
        made += [s.post("/v1/sessions", json={"ttl_seconds": 600})
                 for _ in range(MAX_LIVE_SESSIONS - half)]
        assert {resp.status_code for resp in made} == {201}
        for key in (c, s):
            refused = key.post("/v1/sessions", json={"ttl_seconds": 600})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_sessions"
        # Retiring the first key ends none of them, and frees no room either:
        # the sessions are the lineage's.
        assert c.post(f"/v1/keys/{c.get('/v1/whoami').json()['key_id']}/retire").status_code == 200
        assert s.post("/v1/sessions", json={"ttl_seconds": 600}).status_code == 429
        # One ended (by the successor: a session belongs to the lineage) makes room.
        ended = made[0].json()["session_id"]
        assert s.delete(f"/v1/sessions/{ended}").json()["ended"] is True
        assert s.post("/v1/sessions", json={"ttl_seconds": 600}).status_code == 201
