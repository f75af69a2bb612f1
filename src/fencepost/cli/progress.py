"""Progress for long waits: one line on a terminal, redrawn every second, saying
who holds what and for how long. Silent when stderr is not a terminal."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TextIO, TypeVar

from fencepost.cli.render import duration, relative
from fencepost.client import AsyncClient
from fencepost.errors import FencepostError

T = TypeVar("T")
POLL_S = 1.0


class ProgressLine:
    """A single status line on a terminal stream."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self._shown = False

    def show(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
            self._shown = True

    def clear(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


async def while_waiting(
    work: Awaitable[T], describe: Callable[[float], Awaitable[str]], line: ProgressLine
) -> T:
    """Await `work`; meanwhile, on a terminal, show `describe(waited_s)` every second."""
    if not line.enabled:
        return await work
    task = asyncio.ensure_future(work)
    started = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait([task], timeout=POLL_S)
            if done:
                return task.result()
            line.show(await describe(time.monotonic() - started))
    finally:
        line.clear()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])


def lock_waiting(client: AsyncClient, key: str) -> Callable[[float], Awaitable[str]]:
    """Describes a wait for lock `key`: the holder's operation, age and expiry."""

    async def describe(waited: float) -> str:
        head = f"waiting for lock {key} ({duration(waited)})"
        try:
            info = await client.get_lock(key)
        except FencepostError:
            return head + "…"
        if not info.held:
            return f"{head}: in line"
        holder = f"held by {info.operation!r}" if info.operation else "held"
        since = ""
        if info.acquired_at is not None:
            since = f" for {relative(info.acquired_at).removesuffix(' ago')}"
        expiry = ""
        if info.expires_at is not None:
            expiry = ", overdue" if info.overdue else f", expires {relative(info.expires_at)}"
        waiters = f"; {info.waiters} waiting" if info.waiters else ""
        return f"{head}: {holder}{since}{expiry}{waiters}"

    return describe


def slot_waiting(client: AsyncClient, pool: str) -> Callable[[float], Awaitable[str]]:
    """Describes a wait for a slot of `pool`: how many are in use and queued."""

    async def describe(waited: float) -> str:
        head = f"waiting for a slot of pool {pool} ({duration(waited)})"
        try:
            info = await client.get_pool(pool)
        except FencepostError:
            return head + "…"
        limit = info.effective_limit if info.effective_limit is not None else info.limit
        return f"{head}: {info.in_use}/{limit} in use, {info.queued} queued"

    return describe


__all__ = ["ProgressLine", "lock_waiting", "slot_waiting", "while_waiting"]
