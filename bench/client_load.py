"""Client load: how many leases one Python process keeps alive.

    .venv/bin/python bench/client_load.py [--steps 500,1000,2000,4000] [--hold 25]
                                          [--ttl 10] [--renew-seconds 10]
                                          [--variant per-lease] [--results-dir bench/results]

Starts `fencepost serve` on SQLite (a temp dir, a free port), then with one
`AsyncClient` in this process:

- renewals/s: as many `renew_lock` calls as the client can make in
  `--renew-seconds` (64 tasks renewing 64 held leases), with the client's CPU
  time per renewal;
- leases held: for each step N, N tasks each acquire a lock (`ttl` seconds,
  `raise_on_loss=False`), all of them hold it together for `--hold` seconds
  once the last is granted, then release; the step passes when none is lost.
  Steps stop at the first one that loses a lease. Renewals that got through
  are counted with the client's `on_renewed` hook.

Writes bench/results/client-<timestamp>.json and .md (and client-latest.md).
How a step holds its leases is a `Variant`: `per-lease` renews each lease on
its own; a variant that holds them under one session adds itself to `VARIANTS`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fpbench import machine  # noqa: E402
from fpbench.systems import BENCH_KEY, Fencepost, venv_python  # noqa: E402

import fencepost  # noqa: E402
from fencepost.client.models import Lease  # noqa: E402
from fencepost.errors import FencepostError  # noqa: E402

RENEWERS = 64


@dataclass
class Step:
    """One step: `leases` held for `hold_s` seconds, and what became of them."""

    variant: str
    leases: int
    ttl: int
    hold_s: float
    lost: dict[str, int] = field(default_factory=dict)
    failed_to_acquire: int = 0
    acquire_errors: dict[str, int] = field(default_factory=dict)
    renewals: int = 0
    renewals_per_s: float = 0.0
    acquire_s: float = 0.0
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def held(self) -> bool:
        return not self.lost and self.failed_to_acquire == 0


# How one task holds one lease for a step: (client, key, ttl, while_held) ->
# the loss reason, or None when the lease was held throughout. It acquires the
# lease, awaits `while_held()` (which returns when the step ends: every lease
# of the step held at once for the step's time) and releases it.
WhileHeld = Callable[[], Awaitable[None]]
HoldOne = Callable[[fencepost.AsyncClient, str, int, WhileHeld], Awaitable[str | None]]


@dataclass(frozen=True)
class Variant:
    """A way of holding many leases from one client: `prepare` runs once per
    step with the client (e.g. to open a session) and returns how to hold one."""

    name: str
    describe: str
    prepare: Callable[[fencepost.AsyncClient, int], Awaitable[HoldOne]]


async def _per_lease(client: fencepost.AsyncClient, ttl: int) -> HoldOne:
    async def hold_one(client: fencepost.AsyncClient, key: str, ttl: int,
                       while_held: WhileHeld) -> str | None:
        async with client.lock(key, ttl=ttl, raise_on_loss=False) as hold:
            await while_held()
            return hold.loss.reason if hold.loss is not None else None

    return hold_one


async def _session(client: fencepost.AsyncClient, ttl: int) -> HoldOne:
    # One session for the step's leases, entered here and never exited: it
    # expires by itself once its step's client is closed (its heartbeat stops
    # with the task that entered it).
    session = client.session(ttl=ttl, raise_on_loss=False)
    await session.__aenter__()

    async def hold_one(client: fencepost.AsyncClient, key: str, ttl: int,
                       while_held: WhileHeld) -> str | None:
        async with session.lock(key) as hold:
            await while_held()
            return hold.loss.reason if hold.loss is not None else None

    return hold_one


VARIANTS: dict[str, Variant] = {
    "per-lease": Variant("per-lease", "each lease renewed on its own (a third of its TTL)",
                         _per_lease),
    "session": Variant("session", "every lease on one session, renewed once (a third of its "
                       "TTL)", _session),
}


async def renewal_rate(url: str, seconds: float) -> dict[str, float]:
    """Renewals per second one client makes, and its CPU time per renewal."""
    async with fencepost.AsyncClient(url, BENCH_KEY) as client:
        leases = await asyncio.gather(*(
            client.acquire_lock(f"renew-{os.getpid()}-{i}", ttl=60) for i in range(RENEWERS)))
        done = 0
        stop_at = time.monotonic() + seconds

        async def renew(lease: Lease) -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                await client.renew_lock(lease.key, lease.lock_token, ttl=60)
                done += 1

        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.gather(*(renew(lease) for lease in leases))
        cpu, elapsed = time.process_time() - cpu0, time.monotonic() - t0
        await asyncio.gather(*(client.release_lock(lease.key, lease.lock_token)
                               for lease in leases))
    return {"renewals_per_s": round(done / elapsed, 1),
            "client_cpu_us_per_renewal": round(1e6 * cpu / max(done, 1), 1)}


async def hold_step(url: str, variant: Variant, leases: int, ttl: int, hold_s: float) -> Step:
    """`leases` tasks each hold a lease for `hold_s` seconds from one client."""
    step = Step(variant.name, leases, ttl, hold_s)
    renewed = 0

    def count(_sent: float) -> None:
        nonlocal renewed
        renewed += 1

    async with fencepost.AsyncClient(url, BENCH_KEY, on_renewed=count) as client:
        hold_one = await variant.prepare(client, ttl)
        lost: collections.Counter[str] = collections.Counter()
        prefix = f"{variant.name}-{leases}-{os.getpid()}-{time.monotonic_ns()}"

        all_in = asyncio.Event()
        settled = 0
        t0 = time.monotonic()

        def settle() -> None:
            nonlocal settled
            settled += 1
            if settled == leases:
                step.acquire_s = round(time.monotonic() - t0, 1)
                all_in.set()

        async def while_held() -> None:
            settle()
            await all_in.wait()
            await asyncio.sleep(hold_s)

        async def one(i: int) -> None:
            try:
                reason = await hold_one(client, f"{prefix}-{i}", ttl, while_held)
            except FencepostError as exc:
                step.failed_to_acquire += 1
                step.acquire_errors[exc.code] = step.acquire_errors.get(exc.code, 0) + 1
                settle()
                return
            if reason is not None:
                lost[reason] += 1

        cpu0 = time.process_time()
        await asyncio.gather(*(one(i) for i in range(leases)))
        step.elapsed_s = round(time.monotonic() - t0, 1)
        step.client_cpu_s = round(time.process_time() - cpu0, 1)
    step.lost = {reason: n for reason, n in lost.items() if n}
    step.renewals = renewed
    step.renewals_per_s = round(renewed / max(step.elapsed_s, 0.001), 1)
    return step


def markdown(run: dict[str, Any]) -> str:
    m = run["machine"]
    lines = [
        f"# Client load, {run['started']}",
        "",
        f"One `AsyncClient` in one process against `fencepost serve` on SQLite, same machine: "
        f"{m['nproc']} x {m['cpu']}, {m['memory']}, {m['os']}, Python {m['python']}; "
        f"load average at start {m['load_average_at_start']}, "
        f"{m['background_cpu_pct']}% CPU busy before the run.",
        "",
        f"Renewals: {run['renewal_rate']['renewals_per_s']:.0f}/s "
        f"({run['renewal_rate']['client_cpu_us_per_renewal']:.0f} µs of client CPU each, "
        f"{RENEWERS} tasks).",
        "",
        "| variant | leases | TTL s | all held s | lost | renewals/s | acquiring all s "
        "| acquire+hold+release s | client CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in run["steps"]:
        lost = ", ".join(f"{n} {r}" for r, n in s["lost"].items()) or "0"
        if s["failed_to_acquire"]:
            lost += f" ({s['failed_to_acquire']} not acquired)"
        lines.append(f"| {s['variant']} | {s['leases']} | {s['ttl']} | {s['hold_s']:g} | {lost} "
                     f"| {s['renewals_per_s']:.0f} | {s['acquire_s']:g} | {s['elapsed_s']:g} "
                     f"| {s['client_cpu_s']:g} |")
    lines += ["", "Largest number held without loss: " + ", ".join(
        f"{name}: {n}" for name, n in run["held_without_loss"].items()), ""]
    return "\n".join(lines)


def write(run: dict[str, Any], results_dir: Path, started: dt.datetime) -> list[Path]:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    json_path, md_path = results_dir / f"client-{stamp}.json", results_dir / f"client-{stamp}.md"
    json_path.write_text(json.dumps(run, indent=2, default=str) + "\n")
    md_path.write_text(markdown(run))
    latest = results_dir / "client-latest.md"
    shutil.copyfile(md_path, latest)
    return [json_path, md_path, latest]


def run_client_load(steps: list[int], hold_s: float, ttl: int, renew_seconds: float,
                    variants: list[str], results_dir: Path,
                    say: Callable[[str], None] = print) -> dict[str, Any]:
    """Start a server, measure, write the results; returns the run."""
    started = dt.datetime.now(dt.UTC)
    run: dict[str, Any] = {"started": started.strftime("%Y-%m-%d %H:%M UTC"),
                           "machine": machine.describe(venv_python()), "steps": [],
                           "held_without_loss": {}}
    with tempfile.TemporaryDirectory(prefix="fencepost-client-load-") as tmp:
        server = Fencepost(name="fencepost-sqlite", store="sqlite")
        with server.running(Path(tmp)):
            run["server_version"] = server.version
            say(f"renewals for {renew_seconds:g} s ...")
            run["renewal_rate"] = asyncio.run(renewal_rate(server.base_url, renew_seconds))
            say(f"   {run['renewal_rate']}")
            for name in variants:
                variant = VARIANTS[name]
                run["held_without_loss"][name] = 0
                for leases in steps:
                    say(f"{name}: {leases} leases of {ttl} s held {hold_s:g} s ...")
                    step = asyncio.run(hold_step(server.base_url, variant, leases, ttl, hold_s))
                    run["steps"].append({**asdict(step), "held": step.held})
                    say(f"   lost {step.lost or 0}, not acquired {step.failed_to_acquire}, "
                        f"{step.renewals_per_s:.0f} renewals/s, {step.elapsed_s:g} s")
                    if not step.held:
                        break
                    run["held_without_loss"][name] = leases
    for path in write(run, results_dir, started):
        say(f"wrote {path}")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="500,1000,2000,4000",
                        help="lease counts to try, in order (default 500,1000,2000,4000)")
    parser.add_argument("--hold", type=float, default=25.0, help="seconds each step holds")
    parser.add_argument("--ttl", type=int, default=10, help="lease TTL, seconds (5..)")
    parser.add_argument("--renew-seconds", type=float, default=10.0,
                        help="length of the renewals/s measurement")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                        help="how leases are held (repeatable; default: all)")
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        parser.error("--steps takes comma-separated whole numbers")
    if not steps or min(steps) < 1 or args.ttl < 5 or args.hold <= 0:
        parser.error("--steps must be positive, --ttl at least 5, --hold positive")
    run_client_load(steps, args.hold, args.ttl, args.renew_seconds,
                    args.variant or sorted(VARIANTS), Path(args.results_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
