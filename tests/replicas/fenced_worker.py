"""One holder process of the fenced-counter check (run by test_fenced_counter.py).

Loops until its deadline: takes a lock exclusively, shared, or several at once
(a lock set), through a random replica; registers each key's fencing token on
a shared resource (a SQLite file, the "thing the lock protects"); works a
little or stalls past its lease; then, for an exclusive holder, increments the
key's counter with a fenced write (refused when a higher token was
registered), and for a reader checks that the counter did not move. Finally it
asks the server whether its token is still current: if it is, and the
resource shows a holder it should have excluded (a higher token registered by
an incompatible holder, or a counter that moved under a reader), the two
leases overlapped. Every grant and every such overlap is a JSON line in its log.

Usage: fenced_worker.py LOG RESOURCE DEADLINE SEED API_KEY URL [URL...]
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import time
import uuid
from typing import Any

import httpx

KEYS = ("fc-a", "fc-b", "fc-c")
TTL = 5
STALL_S = TTL + 1.5  # past the lease: a paused holder


def resource(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 30000")
    return db


def register(db: sqlite3.Connection, key: str, token: int, mode: str) -> int:
    """Record the token on the resource; the counter as it is now."""
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO seen (key, token, mode) VALUES (?, ?, ?)", (key, token, mode))
    (value,) = db.execute("SELECT value FROM counter WHERE key = ?", (key,)).fetchone()
    db.execute("COMMIT")
    return int(value)


def fenced_increment(db: sqlite3.Connection, key: str, token: int, read: int) -> bool:
    """Write read + 1 unless a higher token was registered (the fence)."""
    db.execute("BEGIN IMMEDIATE")
    (highest,) = db.execute("SELECT MAX(token) FROM seen WHERE key = ?", (key,)).fetchone()
    accepted = highest <= token
    if accepted:
        db.execute("UPDATE counter SET value = ? WHERE key = ?", (read + 1, key))
    db.execute("COMMIT")
    return accepted


def excluded_since(db: sqlite3.Connection, key: str, token: int, mode: str) -> list[int]:
    """Tokens registered after ours (higher) by holders our lease excludes."""
    rows = db.execute(
        "SELECT token FROM seen WHERE key = ? AND token > ? AND (? = 'exclusive' OR "
        "mode = 'exclusive')", (key, token, mode)).fetchall()
    return [int(row[0]) for row in rows]


def main() -> None:
    log_path, resource_path, deadline, seed, api_key, *urls = sys.argv[1:]
    rng = random.Random(int(seed))
    db = resource(resource_path)
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def note(**record: Any) -> None:
        log.write(json.dumps(record) + "\n")

    clients = [httpx.Client(base_url=u, headers={"Authorization": f"Bearer {api_key}"},
                            timeout=30) for u in urls]
    while time.time() < float(deadline):
        client = rng.choice(clients)
        mode = rng.choice(["exclusive", "shared"])
        keys = rng.sample(KEYS, rng.choice([1, 1, 2, 3]))
        token = str(uuid.uuid4())
        headers = {"X-Lock-Token": token, "X-Request-Id": str(uuid.uuid4())}
        body = {"ttl_seconds": TTL, "mode": mode, "wait_seconds": rng.choice([0, 1, 3])}
        if len(keys) == 1:
            resp = client.put(f"/v1/locks/{keys[0]}/lease", headers=headers, json=body)
            grants = [resp.json()] if resp.status_code == 201 else []
        else:
            resp = client.post("/v1/lock-sets", headers=headers, json={"keys": keys, **body})
            grants = resp.json()["leases"] if resp.status_code == 201 else []
        if resp.status_code not in (201, 409):
            raise SystemExit(f"unexpected answer {resp.status_code}: {resp.text}")
        if not grants:
            continue
        for grant in grants:
            note(kind="grant", key=grant["key"], token=grant["fencing_token"], mode=mode,
                 acquired_at=grant["acquired_at"])
        reads = {g["key"]: register(db, g["key"], g["fencing_token"], mode) for g in grants}
        time.sleep(STALL_S if rng.random() < 0.1 else rng.uniform(0, 0.3))
        moved = {}
        for grant in grants:
            key, fence = grant["key"], grant["fencing_token"]
            if mode == "exclusive":
                fenced_increment(db, key, fence, reads[key])
            else:
                (now,) = db.execute("SELECT value FROM counter WHERE key = ?", (key,)).fetchone()
                moved[key] = now != reads[key]
        for grant in grants:
            key, fence = grant["key"], grant["fencing_token"]
            others = excluded_since(db, key, fence, mode)
            if not others and not moved.get(key):
                continue
            check = rng.choice(clients).get(f"/v1/locks/{key}/fence", params={"token": fence})
            if check.json()["current"]:  # still live, yet an excluded holder came in
                note(kind="overlap", key=key, token=fence, mode=mode, others=others,
                     moved=moved.get(key, False))
        for grant in grants:
            client.delete(f"/v1/locks/{grant['key']}/lease", headers={"X-Lock-Token": token})


if __name__ == "__main__":
    main()
