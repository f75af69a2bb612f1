"""Synchronous code run on the event loop, its waits awaited there
(store/on_loop.py): what PostgreSQL's batches run on."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.store.on_loop import run_on_loop, wait_for


async def test_the_code_gets_what_each_awaitable_gives_and_its_result_comes_back() -> None:
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    def add_doubles(a: int, b: int) -> int:
        return wait_for(double(a)) + wait_for(double(b))

    assert await run_on_loop(add_doubles, 3, 4) == 14


async def test_what_an_awaitable_raises_is_raised_where_the_code_waited() -> None:
    async def fail() -> None:
        await asyncio.sleep(0)
        raise KeyError("gone")

    def catch() -> str:
        try:
            wait_for(fail())
        except KeyError as exc:
            return f"caught {exc.args[0]}"
        return "not raised"

    assert await run_on_loop(catch) == "caught gone"


async def test_what_the_code_raises_reaches_the_caller() -> None:
    def fail_after_a_wait() -> None:
        wait_for(asyncio.sleep(0))
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await run_on_loop(fail_after_a_wait)


async def test_the_loop_serves_others_while_the_code_waits() -> None:
    """Two runs whose waits overlap interleave: neither blocks the loop."""
    order: list[str] = []
    first_waiting = asyncio.Event()
    second_done = asyncio.Event()

    def first() -> None:
        order.append("first starts")
        first_waiting.set()
        wait_for(second_done.wait())
        order.append("first resumes")

    def second() -> None:
        wait_for(first_waiting.wait())
        order.append("second runs")
        second_done.set()

    await asyncio.gather(run_on_loop(first), run_on_loop(second))
    assert order == ["first starts", "second runs", "first resumes"]


async def test_cancelling_the_caller_raises_in_the_code_where_it_waits() -> None:
    cleaned: list[bool] = []
    started = asyncio.Event()

    def wait_forever() -> None:
        started.set()
        try:
            wait_for(asyncio.Event().wait())
        finally:
            cleaned.append(True)

    task = asyncio.ensure_future(run_on_loop(wait_forever))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


async def test_waiting_outside_a_run_is_refused() -> None:
    async def never() -> None:  # pragma: no cover - closed unawaited
        raise AssertionError("awaited")

    with pytest.raises(RuntimeError, match="run_on_loop"):
        wait_for(never())
