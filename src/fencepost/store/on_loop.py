"""Synchronous store code run on the event loop, its round trips awaited.

The batch writer and the SQL modules are synchronous: an operation calls
`tx.execute` and reads the answer. On PostgreSQL each statement is a round
trip. Run on writer threads, every answer arrived on a thread that then had to
wait for the event loop to let go of the interpreter lock before it could read
it. Here a batch runs in a greenlet on the loop's own thread instead: where it
would wait for the database, it hands the awaitable to the loop (`wait_for`),
which serves other requests until the answer is in and then resumes the batch
where it stood. The greenlet library does the switching (SQLAlchemy's asyncio
layer runs its synchronous core over asynchronous drivers the same way).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable, Generator, Generic, Protocol, TypeVar

import greenlet  # type: ignore[import-untyped]

T = TypeVar("T")


class _OnLoop(greenlet.greenlet):  # type: ignore[misc]
    """A greenlet run by `run_on_loop`: only its code may call `wait_for`."""


class Watched(Protocol):
    """Told when the code run by `run_on_loop` waits for an answer: `since`
    is the monotonic instant the awaited answer was asked for, None while
    nothing is awaited (a watchdog gives up on what waits too long)."""

    since: float | None


class Unwatched(Generic[T]):
    """An awaitable that `run_on_loop` waits for without counting the wait
    against a watchdog (a test's fault-injection hold, say)."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[T]) -> None:
        self.awaitable = awaitable

    def __await__(self) -> Generator[Any, None, T]:
        return self.awaitable.__await__()


async def run_on_loop(fn: Callable[..., T], *args: Any, watch: Watched | None = None) -> T:
    """`fn(*args)`, run here, each `wait_for` inside it awaited on this loop;
    `watch.since` says from when an answer is being waited for."""
    child = _OnLoop(fn, parent=greenlet.getcurrent())
    asked = child.switch(*args)
    while not child.dead:
        if isinstance(asked, Unwatched):
            asked = asked.awaitable
        elif watch is not None:
            watch.since = time.monotonic()
        try:
            answer = await asked
        except BaseException as exc:  # noqa: BLE001 - raised where it waited
            if watch is not None:
                watch.since = None
            asked = child.throw(exc)
        else:
            if watch is not None:
                watch.since = None
            asked = child.switch(answer)
    return asked  # type: ignore[no-any-return]


def wait_for(awaitable: Awaitable[T]) -> T:
    """What `awaitable` gives, awaited by the loop running this code's
    `run_on_loop`; what it raises is raised here."""
    current = greenlet.getcurrent()
    if not isinstance(current, _OnLoop):
        if hasattr(awaitable, "close"):
            awaitable.close()  # a coroutine never awaited would warn
        raise RuntimeError("wait_for runs only inside run_on_loop")
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]
