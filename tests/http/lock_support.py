"""Lock requests (SPEC §3) the HTTP tests send again and again, on an authenticated client."""

from __future__ import annotations

from typing import Any

import httpx

from support import lock_headers


def acquire(c: httpx.Client, key: str, token: str, ttl: int = 30, request_id: str | None = None,
            **body: Any) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token, request_id),
                 json={"ttl_seconds": ttl, **body})


def renew(c: httpx.Client, key: str, token: str, ttl: int) -> httpx.Response:
    return c.patch(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                   json={"ttl_seconds": ttl})


def release(c: httpx.Client, key: str, token: str) -> httpx.Response:
    return c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})
