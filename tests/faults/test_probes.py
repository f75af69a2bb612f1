"""Probes (SPEC §6): /livez answers while the process serves and never asks
the store; /readyz (and its old name /healthz) answers while the store answers
and takes writes. None needs a key."""

from __future__ import annotations

from typing import Callable

import httpx
import psycopg

from pg_support import ADMIN_URL, temporary_database
from support import ServerProcess, wait_until

from .conftest import get

PROBES = ("/livez", "/readyz", "/healthz")


def test_probes_need_no_key_and_say_ok(servers: Callable[..., ServerProcess]) -> None:
    server = servers("server")
    for path in PROBES:
        for headers in ({}, {"Authorization": "Bearer not-a-real-key"}):
            resp = httpx.get(f"{server.base_url}{path}", headers=headers, timeout=10)
            assert resp.status_code == 200, (path, resp.text)
            assert resp.json()["status"] == "ok"
            assert resp.json()["store"] == "sqlite"
        assert httpx.head(f"{server.base_url}{path}", timeout=10).status_code == 200
    paths = httpx.get(f"{server.base_url}/openapi.json", timeout=10).json()["paths"]
    assert all("get" in paths[path] for path in PROBES)


def allow_connections(url: str, allowed: bool) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {allowed}')
        if not allowed:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))


def test_livez_stays_up_while_the_database_is_away(
    servers: Callable[..., ServerProcess],
) -> None:
    with temporary_database() as url:
        replica = servers("replica", store=url)
        try:
            allow_connections(url, False)
            wait_until(lambda: get(replica, "/readyz").status_code == 503, "/readyz to turn off")
            assert get(replica, "/readyz").json()["error"]["code"] == "store_unavailable"
            assert get(replica, "/healthz").status_code == 503
            # A database outage must not get the replicas restarted.
            assert get(replica, "/livez").status_code == 200
        finally:
            allow_connections(url, True)
        wait_until(lambda: get(replica, "/readyz").status_code == 200, "/readyz to come back")
        replica.stop()
