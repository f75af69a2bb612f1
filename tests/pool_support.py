"""Pool requests (SPEC §4) the HTTP tests send again and again, on an authenticated client."""

from __future__ import annotations

from typing import Any

import httpx

from support import unique_name


def make_pool(c: httpx.Client, name: str | None = None, **config: Any) -> str:
    """A new pool (a fresh name unless given; a limit of 2 unless given); its name."""
    name = name or unique_name("pool")
    config.setdefault("limit", 2)
    resp = c.put(f"/v1/pools/{name}", json=config)
    assert resp.status_code == 201, resp.text
    return name


def pool_state(c: httpx.Client, pool: str) -> dict[str, Any]:
    resp = c.get(f"/v1/pools/{pool}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def acquire(c: httpx.Client, pool: str, **kwargs: Any) -> httpx.Response:
    return c.post(f"/v1/pools/{pool}/lock/acquire", **kwargs)


def renew(c: httpx.Client, pool: str, slot_id: str, **kwargs: Any) -> httpx.Response:
    return c.post(f"/v1/pools/{pool}/lock/{slot_id}/renew", **kwargs)


def release(c: httpx.Client, pool: str, slot_id: str, **kwargs: Any) -> httpx.Response:
    return c.post(f"/v1/pools/{pool}/lock/{slot_id}/release", **kwargs)
