"""The client shows who holds and who waits (LockInfo.holder and .line,
list_slots), from a real server."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import httpx
import pytest

import fencepost
from fencepost.client import KeyHolder, SlotHolder
from fencepost.errors import NotFound
from support import ServerProcess, unique_name


class WaitsSent(httpx.AsyncHTTPTransport):
    """Notes the `wait_seconds` of every acquire sent through it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.waits.append(json.loads(request.content)["wait_seconds"])
        return await super().handle_async_request(request)


async def test_get_lock_names_the_holder_and_the_line(server: ServerProcess) -> None:
    key = unique_name()
    waiter_key = server.create_key("member", name="client-waiter")
    sent = WaitsSent()
    async with fencepost.AsyncClient(server.base_url, server.admin_key) as admin, \
            fencepost.AsyncClient(server.base_url, str(waiter_key["key"]),
                                  transport=sent) as waiter:
        me = await admin.whoami()
        lease = await admin.acquire_lock(key, ttl=30)
        waiting = asyncio.create_task(waiter.acquire_lock(key, ttl=30, wait=20))
        for _ in range(200):
            info = await admin.get_lock(key)
            if info.waiters:
                break
            await asyncio.sleep(0.05)
        assert info.holder == KeyHolder(key_id=me.key_id, key_name="bootstrap")
        [place] = info.line
        assert (place.key_id, place.key_name) == (waiter_key["id"], "client-waiter")
        assert place.since_at is not None and place.gives_up_at is not None
        # The line shows the wait the server was asked for: the client sends
        # what is left of its 20 s when the request leaves (a little less,
        # measured on its own clock), which the server rounds to milliseconds.
        assert sent.waits and all(0 < w <= 20 for w in sent.waits), sent.waits
        wait_seconds = sent.waits[-1]  # (one request, unless the client had to retry)
        assert place.gives_up_at - place.since_at == timedelta(
            milliseconds=round(wait_seconds * 1000))
        assert info.to_dict()["line"][0]["since_at"].endswith("Z")
        [listed] = (await admin.list_locks(prefix=key)).locks
        assert listed.holder == info.holder and listed.line == info.line
        await admin.release_lock(key, lease.lock_token)
        granted = await asyncio.wait_for(waiting, 10)
        after = await admin.get_lock(key)
        assert after.holder is not None and after.holder.key_id == waiter_key["id"]
        assert after.line == []
        await waiter.release_lock(key, granted.lock_token)
        assert (await admin.get_lock(key)).holder is None


def test_list_slots_shows_holders_not_slot_ids(server: ServerProcess) -> None:
    name = unique_name("pool")
    with fencepost.Client(server.base_url, server.admin_key) as c:
        c.set_pool(name, limit=2)
        assert c.list_slots(name) == []
        grant = c.acquire_slot(name)
        [slot] = c.list_slots(name)
        assert isinstance(slot, SlotHolder)
        assert grant.slot_id.startswith(slot.slot_id_prefix)
        assert slot.slot_id_prefix != grant.slot_id
        assert slot.key_id == c.whoami().key_id
        assert (slot.lease_deadline, slot.request_deadline) == (
            grant.lease_deadline, grant.request_deadline
        )
        c.delete_pool(name)
        with pytest.raises(NotFound):
            c.list_slots(name)
