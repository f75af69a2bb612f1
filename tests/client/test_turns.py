"""The client's turns to send (`turns.py`): never more than its size taken,
renewals first, and a waiter that gives up (timeout, cancellation) neither
keeps nor loses a turn."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.client.turns import Turns


async def test_no_more_than_its_size_at_once_then_in_order_renewals_first() -> None:
    turns = Turns(2)
    await turns.take(urgent=False, timeout=None)
    await turns.take(urgent=False, timeout=None)
    order: list[str] = []

    async def wait(name: str, urgent: bool) -> None:
        await turns.take(urgent=urgent, timeout=None)
        order.append(name)

    waiters = [asyncio.create_task(wait("acquire-1", False)),
               asyncio.create_task(wait("acquire-2", False)),
               asyncio.create_task(wait("renewal", True))]
    await asyncio.sleep(0.01)
    assert order == []  # both turns are taken
    turns.give_back()
    await asyncio.sleep(0.01)
    assert order == ["renewal"]
    turns.give_back()
    turns.give_back()
    await asyncio.gather(*waiters)
    assert order == ["renewal", "acquire-1", "acquire-2"]


async def test_a_waiter_that_times_out_takes_no_turn_and_the_next_one_gets_it() -> None:
    turns = Turns(1)
    await turns.take(urgent=False, timeout=None)
    with pytest.raises(TimeoutError):
        await turns.take(urgent=True, timeout=0.01)
    later = asyncio.create_task(turns.take(urgent=False, timeout=None))
    await asyncio.sleep(0.01)
    turns.give_back()  # skips the waiter that gave up
    await asyncio.wait_for(later, 1)
    turns.give_back()
    await asyncio.wait_for(turns.take(urgent=False, timeout=None), 1)  # one turn, free again


async def test_a_waiter_cancelled_after_being_handed_a_turn_passes_it_on() -> None:
    turns = Turns(1)
    await turns.take(urgent=False, timeout=None)
    first = asyncio.create_task(turns.take(urgent=False, timeout=None))
    second = asyncio.create_task(turns.take(urgent=False, timeout=None))
    await asyncio.sleep(0.01)
    turns.give_back()  # hands the turn to `first`...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the turn went on to `second`
