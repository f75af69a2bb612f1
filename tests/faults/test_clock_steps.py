"""A step of the wall clock under a running server neither frees nor lengthens
a live lease (SPEC §2, "Time authority"): the server measures elapsed time on
its monotonic clock. Each backend runs under libfaketime, its wall clock moved
an hour forward and an hour back while a lease is held."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Iterator

import pytest

from pg_support import temporary_database
from support import ServerProcess, new_token, unique_name, wait_until

from .conftest import ROUNDS, WallClock, acquire, renew

HOUR = 3600


def logged_steps(server: ServerProcess) -> list[float]:
    text = server.stderr_path.read_text()
    return [float(x) for x in re.findall(r"wall clock is ([-+][0-9.]+) s from", text)]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None  # the server's own SQLite file
        return
    with temporary_database() as url:
        yield url


@pytest.mark.parametrize("step", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_wall_clock_step_neither_frees_nor_lengthens_a_lease(
    servers: Callable[..., ServerProcess], tmp_path: Path, store_url: str | None, step: int
) -> None:
    clock = WallClock(tmp_path)
    server = servers(store=store_url, extra_env=clock.env())
    for _ in range(ROUNDS):
        clock.step(0)
        key, holder = unique_name("step"), new_token()
        granted = acquire(server, key, holder, ttl=60)
        assert granted.status_code == 201, granted.text
        clock.step(step)
        # An hour ahead the lease would look long dead; an hour back, it would
        # look alive for an hour more. Neither: another caller is refused, and
        # told the holder's lease ends when it always did.
        refused = acquire(server, key, new_token())
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "lock_held"
        assert 0 < refused.json()["error"]["retry_after_ms"] <= 60_000
        renewed = renew(server, key, holder, ttl=60)
        assert renewed.status_code == 200, renewed.text
        assert renewed.json()["fencing_token"] == granted.json()["fencing_token"]
        with server.client() as c:
            state = c.get(f"/v1/locks/{key}").json()
        assert state["held"] is True
        # Stamped instants stay on the server's steady timeline, not the stepped one.
        moved = at(state["expires_at"]) - at(granted.json()["expires_at"])
        assert timedelta(0) <= moved < timedelta(minutes=1), state
        if store_url is None:  # the SQLite server says it saw the step
            wait_until(lambda s=server: any(abs(seen - step) < 5 for seen in logged_steps(s)),
                     "the step to be logged")
        clock.step(0)
        assert acquire(server, key, new_token()).status_code == 409
