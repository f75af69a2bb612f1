"""Background state for workloads (e) and (f): what else the server carries
while workload (a) is measured.

(e) parked waiters: `python -m fpbench.background park URL KEY LOCKS WAITERS`
    holds LOCKS locks and then parks WAITERS requests in their lines (each a
    keep-alive connection with a PUT that waits 300 s), prints `parked N
    LOCK...` (how many are in line, then the locks' names) once the server
    shows them all in line, and keeps them there until killed.
(f) held locks: `preload_locks` writes N live leases straight into the store
    (one statement; through the API it would take minutes), as leases that
    outlive the measurement.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
import uuid
from urllib.parse import urlsplit
from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families

PARK_PREFIX = "park"
HELD_PREFIX = "held"
# Connections opened at once while parking (the server's accept backlog).
_OPEN_AT_ONCE = 500
_DAY_MS = 86_400_000
_SETTLE_S = 5.0


async def _request(host: str, port: int, raw: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(raw)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    writer.close()
    return status, body


def _put(key: str, lock: str, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"PUT /v1/locks/{lock}/lease HTTP/1.1\r\nHost: bench\r\n"
        f"Authorization: Bearer {key}\r\nX-Lock-Token: {uuid.uuid4()}\r\n"
        f"X-Request-Id: {uuid.uuid4()}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def _waiting(host: str, port: int, key: str, locks: list[str]) -> int:
    total = 0
    for lock in locks:
        raw = (f"GET /v1/locks/{lock} HTTP/1.1\r\nHost: bench\r\n"
               f"Authorization: Bearer {key}\r\n\r\n").encode()
        status, body = await _request(host, port, raw)
        if status == 200:
            total += int(json.loads(body).get("waiters", 0))
    return total


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


async def park(url: str, key: str, lock_count: int, waiters: int) -> None:
    host, port = _address(url)
    nonce = uuid.uuid4().hex[:8]
    locks = [f"{PARK_PREFIX}-{nonce}-{i}" for i in range(lock_count)]
    for lock in locks:
        status, body = await _request(host, port, _put(key, lock, {"ttl_seconds": 3600}))
        if status != 201:
            raise SystemExit(f"could not take {lock}: {status} {body[:200]!r}")
    held: list[asyncio.StreamWriter] = []

    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_put(key, locks[i % lock_count], {"ttl_seconds": 30, "wait_seconds": 300}))
        await writer.drain()
        held.append(writer)

    for start in range(0, waiters, _OPEN_AT_ONCE):
        await asyncio.gather(*(one(i) for i in range(start, min(start + _OPEN_AT_ONCE, waiters))))
    deadline = time.monotonic() + 120
    in_line = 0
    while time.monotonic() < deadline:
        in_line = await _waiting(host, port, key, locks)
        if in_line >= waiters:
            break
        await asyncio.sleep(0.5)
    # A waiter counts as in line once its join has committed; let the
    # server finish answering and parking the last of them before the
    # measurement starts.
    await asyncio.sleep(_SETTLE_S)
    print(f"parked {in_line} {' '.join(locks)}", flush=True)
    await asyncio.Event().wait()  # until killed


def parked_now(url: str) -> float | None:
    """The server's parked waiters (its `fencepost_waiters_parked` gauge), or
    None when /metrics does not answer."""
    try:
        with urlopen(f"{url}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "fencepost_waiters_parked":
            return sum(sample.value for sample in family.samples)
    return None


def wait_until_unparked(url: str, key: str, locks: list[str], timeout_s: float = 120.0) -> bool:
    """Once (e)'s parker is killed, its 10,000 connections close and the
    server takes each waiter out of line: wait for that, so that what runs
    next is not measured against the clean-up. Both halves of it: the
    server's parked gauge falls as each request is answered, and the store
    work of taking each place out of its line (10,000 operations) comes
    after; on PostgreSQL that went on for seconds into the next
    measurement."""
    deadline = time.monotonic() + timeout_s
    host, port = _address(url)
    while time.monotonic() < deadline:
        if parked_now(url) == 0 and asyncio.run(_waiting(host, port, key, locks)) == 0:
            return True
        time.sleep(0.25)
    return False


def preload_locks(store_url: str, count: int) -> None:
    """Write `count` live leases (expiring in a day) in project "default"."""
    now = int(time.time() * 1000)
    if store_url.startswith("sqlite:"):
        path = store_url.split("sqlite:///", 1)[1]
        with sqlite3.connect(path, timeout=30) as conn:
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                "INSERT INTO locks (project, key, lock_token, fencing_token, acquired_ms, "
                "expires_ms, deadline_ms, dies_ms, on_expiry, lock_delay_ms) "
                "SELECT 'default', ? || i, 'preloaded-' || i, i, ?, ?, ?, ?, 'release', 0 FROM n "
                "WHERE true ON CONFLICT (project, key, lock_token) DO NOTHING",
                (count, f"{HELD_PREFIX}-", now, now + _DAY_MS, now + 90 * _DAY_MS, now + _DAY_MS),
            )
            # As on PostgreSQL below: the steady state, not the bulk load's
            # aftermath (a write-ahead log the size of the table, which the
            # server's checkpointer would otherwise copy back during the run).
            # Committed first: a checkpoint cannot copy an open transaction.
            conn.commit()
            # A read in flight in the server (its reader, its own checkpointer)
            # makes a truncating checkpoint give up at once rather than wait:
            # such reads last milliseconds, so try again for a while.
            for _ in range(100):
                (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if not busy:
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("the preloaded locks' write-ahead log could not be checkpointed")
        return
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO locks (project, key, lock_token, fencing_token, acquired_ms, "
            "expires_ms, deadline_ms, dies_ms, on_expiry, lock_delay_ms) "
            "SELECT 'default', %s || i, 'preloaded-' || i, i, %s, %s, %s, %s, 'release', 0 "
            "FROM generate_series(1, %s) AS i ON CONFLICT (project, key, lock_token) DO NOTHING",
            (f"{HELD_PREFIX}-", now, now + _DAY_MS, now + 90 * _DAY_MS, now + _DAY_MS, count),
        )
    # Measure the steady state of a million held locks, not the bulk load's
    # aftermath (the insert-triggered vacuum, a checkpoint of its WAL).
    settle(store_url)


def settle(store_url: str) -> None:
    """On PostgreSQL, vacuum and analyze the locks table and checkpoint: the
    same start for (e) or (f) and for its pair (SQLite keeps no dead rows to
    vacuum)."""
    if not store_url.startswith("postgres"):
        return
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE locks")
        conn.execute("CHECKPOINT")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "park":
        asyncio.run(park(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
    else:
        raise SystemExit(__doc__)
