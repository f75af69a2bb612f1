"""Client transports: the client process's CPU time per request, by HTTP stack.

    .venv/bin/python bench/client_transports.py [--requests 20000] [--rounds 3]

Starts `fencepost serve` on SQLite (a temp dir, a free port), acquires 8 locks,
then renews them (PATCH /v1/locks/{key}/lease, the request a lease keeper
sends most) `--requests` times, 8 at once (the `AsyncClient`'s turns), through
each stack in turn:

- `client, httpx`: `AsyncClient` given an httpx transport (its path before `wire.py`);
- `client, own`: `AsyncClient` as it is made by default (`wire.py`);
- `httpx`, `httpcore`, `aiohttp`, `own pool`: the same request through each
  library alone, without the client's layers above the transport (aiohttp
  only when installed: it is not a dependency).

CPU is `time.process_time()` of this process only: the server runs in another
process, and a busy machine stretches the wall clock but not the CPU a request
costs. Each stack is measured `--rounds` times, interleaved; the best round
counts (load from other processes only ever adds). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpcore
import httpx
import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fpbench import machine  # noqa: E402
from fpbench.systems import BENCH_KEY, Fencepost, venv_python  # noqa: E402

import fencepost  # noqa: E402
from fencepost.client.models import Lease  # noqa: E402
from fencepost.client.transport import USER_AGENT  # noqa: E402
from fencepost.client.wire import Pool  # noqa: E402

IN_FLIGHT = 8
TTL = 60
Renew = Callable[[Lease], Awaitable[None]]
Stack = Callable[[str, list[Lease], int], Awaitable[float]]


async def _renew_all(leases: list[Lease], requests: int, renew: Renew) -> float:
    """Renew `requests` times, one task per lease; the CPU seconds it took."""
    per_task = requests // len(leases)

    async def worker(lease: Lease, times: int) -> None:
        for _ in range(times):
            await renew(lease)

    await asyncio.gather(*(worker(lease, 5) for lease in leases))  # open the connections
    started = time.process_time()
    await asyncio.gather(*(worker(lease, per_task) for lease in leases))
    return (time.process_time() - started) / (per_task * len(leases))


def _headers(lease: Lease) -> dict[str, str]:
    return {"Authorization": f"Bearer {BENCH_KEY}", "X-Lock-Token": lease.lock_token,
            "User-Agent": USER_AGENT, "Accept": "application/json",
            "Content-Type": "application/json", "X-Request-Id": str(uuid.uuid4())}


def _path(lease: Lease) -> str:
    return f"/v1/locks/{lease.key}/lease"


BODY = msgspec.json.encode({"ttl_seconds": TTL})


async def client_httpx(url: str, leases: list[Lease], requests: int) -> float:
    async with fencepost.AsyncClient(url, BENCH_KEY,
                                     transport=httpx.AsyncHTTPTransport()) as client:
        return await _renew_all(leases, requests, lambda lease: _renew(client, lease))


async def client_own(url: str, leases: list[Lease], requests: int) -> float:
    async with fencepost.AsyncClient(url, BENCH_KEY) as client:
        return await _renew_all(leases, requests, lambda lease: _renew(client, lease))


async def _renew(client: fencepost.AsyncClient, lease: Lease) -> None:
    await client.renew_lock(lease.key, lease.lock_token, ttl=TTL)


async def plain_httpx(url: str, leases: list[Lease], requests: int) -> float:
    async with httpx.AsyncClient(base_url=url) as http:
        async def renew(lease: Lease) -> None:
            response = await http.patch(_path(lease), content=BODY, headers=_headers(lease))
            assert response.status_code == 200, response.text
        return await _renew_all(leases, requests, renew)


async def plain_httpcore(url: str, leases: list[Lease], requests: int) -> float:
    async with httpcore.AsyncConnectionPool(max_connections=100) as pool:
        async def renew(lease: Lease) -> None:
            response = await pool.request("PATCH", url + _path(lease), content=BODY,
                                          headers=_headers(lease))
            assert response.status == 200, response.content
        return await _renew_all(leases, requests, renew)


async def plain_aiohttp(url: str, leases: list[Lease], requests: int) -> float:
    import aiohttp

    async with aiohttp.ClientSession(url) as session:
        async def renew(lease: Lease) -> None:
            async with session.patch(_path(lease), data=BODY, headers=_headers(lease)) as r:
                await r.read()
                assert r.status == 200
        return await _renew_all(leases, requests, renew)


async def own_pool(url: str, leases: list[Lease], requests: int) -> float:
    pool = Pool(url, headers={}, size=100)
    try:
        async def renew(lease: Lease) -> None:
            reply = await pool.send("PATCH", _path(lease), params=None, headers=_headers(lease),
                                    body=BODY, connect_timeout=5, read_timeout=10)
            assert reply.status == 200, reply.content
        return await _renew_all(leases, requests, renew)
    finally:
        await pool.aclose()


def stacks() -> dict[str, Stack]:
    found: dict[str, Stack] = {"client, httpx": client_httpx, "client, own": client_own,
                               "httpx": plain_httpx, "httpcore": plain_httpcore,
                               "own pool": own_pool}
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return found
    return {**found, "aiohttp": plain_aiohttp}


async def _acquire(url: str, prefix: str) -> list[Lease]:
    async with fencepost.AsyncClient(url, BENCH_KEY) as client:
        return [await client.acquire_lock(f"{prefix}-{i}", ttl=TTL) for i in range(IN_FLIGHT)]


def measure(requests: int, rounds: int,
            say: Callable[[str], None] = print) -> dict[str, float]:
    """Start a server and measure every stack; the best CPU seconds per renewal of each."""
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fencepost-transports-") as tmp:
        server = Fencepost(name="fencepost-sqlite", store="sqlite")
        with server.running(Path(tmp)):
            leases = asyncio.run(_acquire(server.base_url, "transports"))
            for round_ in range(rounds):
                for name, stack in stacks().items():
                    cpu = asyncio.run(stack(server.base_url, leases, requests))
                    best[name] = min(cpu, best.get(name, cpu))
                    say(f"round {round_ + 1}: {name}: {cpu * 1e6:.0f} µs")
    return best


def markdown(best: dict[str, float]) -> str:
    lines = [str(machine.describe(venv_python())), "",
             "| stack | client CPU per renewal (µs) |", "|---|---|"]
    lines += [f"| {name} | {cpu * 1e6:.0f} |" for name, cpu in best.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="renewals per stack and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.requests < IN_FLIGHT or args.rounds < 1:
        parser.error(f"--requests at least {IN_FLIGHT}, --rounds at least 1")
    best = measure(args.requests, args.rounds, lambda line: print(line, file=sys.stderr))
    print(markdown(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
