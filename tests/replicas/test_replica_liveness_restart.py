"""A restart of PostgreSQL ends every replica's sessions at once; the live
replicas connect again one by one. A replica that reconnected first must not
take the others for dead and throw their waiters out of line (SPEC §3.1: a
waiter keeps its place); once a replica has connected to the restarted
database, its death is noticed again (§7.4).

Store objects in this process stand for replicas, on a private PostgreSQL
cluster that the test restarts."""

from __future__ import annotations

import asyncio
import uuid

from pg_private import PrivatePostgres

from fencepost.core.leases import AcquireRequest, Granted
from fencepost.errors import StoreUnavailable
from fencepost.store.postgresql import PostgresStore
from pg_support import sessions_gone

P = "default"


def req() -> AcquireRequest:
    return AcquireRequest(str(uuid.uuid4()), 30)


async def answered(step):
    """What `step` returns once the store answers again (a broken connection
    fails its batch once; a new one is made half a second later)."""
    for _ in range(100):
        try:
            return await step()
        except StoreUnavailable:
            await asyncio.sleep(0.1)
    raise AssertionError("the store did not come back")


async def test_after_a_database_restart_nobody_is_judged_before_reconnecting(
    private_pg: PrivatePostgres,
) -> None:
    a, b = PostgresStore(private_pg.url), PostgresStore(private_pg.url)
    await a.open()
    await b.open()
    try:
        holder = req()
        assert isinstance((await a.acquire_lock(P, "k", holder, wait_alive_ms=None)).outcome,
                          Granted)
        assert (await b.acquire_lock(P, "k", req(), wait_alive_ms=60_000)).ticket is not None
        # B stays silent after the restart: no listener reconnecting in the
        # background, no batch of its own until the test asks for one.
        assert b._listener is not None
        await b._listener.stop()
        private_pg.stop()
        private_pg.start()
        await answered(a.reap)
        for _ in range(3):
            await a.reap()
        view = await answered(lambda: a.get_lock(P, "k"))
        assert view.waiters == 1  # B may be alive: its waiter keeps its place

        await answered(b.reap)  # B is back, and known to this run of the database
        await b.close()  # then dies
        await sessions_gone(private_pg.url, b)
        await a.reap()
        assert (await a.get_lock(P, "k")).waiters == 0
    finally:
        await b.close()
        await a.close()
