"""The fenced-counter check over three PostgreSQL replicas: many holder
processes take locks exclusively, shared and as lock sets, some stall past
their leases, some are killed with SIGKILL mid-hold; see fenced_worker.py for
what each checks. Afterwards: no exclusive lease overlapped any other lease of
its lock, and per lock the fencing tokens only rose with the grants' times and
were never issued twice."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from support import track

WORKER = Path(__file__).with_name("fenced_worker.py")
KEYS = ("fc-a", "fc-b", "fc-c")
WORKERS = 6
RUN_S = 30
KILL_EVERY_S = 3.0


def start_worker(number: int, folder: Path, resource: Path, deadline: float, urls: list[str],
                 api_key: str) -> subprocess.Popen[bytes]:
    return track(subprocess.Popen(
        [sys.executable, str(WORKER), str(folder / f"worker-{number}.log"), str(resource),
         str(deadline), str(number), api_key, *urls],
        stdout=subprocess.DEVNULL, stderr=open(folder / f"worker-{number}.err", "w"),  # noqa: SIM115
    ))


def test_no_exclusive_overlap_and_no_token_regression(replicas, tmp_path: Path) -> None:
    resource = tmp_path / "resource.db"
    with sqlite3.connect(resource) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE seen (key TEXT, token INTEGER, mode TEXT)")
        db.execute("CREATE INDEX seen_by_key ON seen (key, token)")
        db.execute("CREATE TABLE counter (key TEXT PRIMARY KEY, value INTEGER)")
        db.executemany("INSERT INTO counter VALUES (?, 0)", [(k,) for k in KEYS])
    member = replicas[0].create_key("member", name="fenced-counter")["key"]
    urls = [r.base_url for r in replicas]
    rng = random.Random(7)
    deadline = time.time() + RUN_S
    running = {n: start_worker(n, tmp_path, resource, deadline, urls, member)
               for n in range(WORKERS)}
    started, killed = WORKERS, 0
    while time.time() < deadline - KILL_EVERY_S:
        time.sleep(KILL_EVERY_S)
        victim = rng.choice(sorted(running))
        running[victim].send_signal(signal.SIGKILL)  # mid-hold, most likely
        running[victim].wait(30)
        killed += 1
        running[started] = start_worker(started, tmp_path, resource, deadline, urls, member)
        del running[victim]
        started += 1
    for number, proc in running.items():
        assert proc.wait(RUN_S + 60) == 0, (tmp_path / f"worker-{number}.err").read_text()

    grants, overlaps = [], []
    for log in tmp_path.glob("worker-*.log"):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            (grants if record["kind"] == "grant" else overlaps).append(record)
    assert overlaps == [], overlaps
    assert killed >= 5
    modes = {g["mode"] for g in grants}
    assert modes == {"exclusive", "shared"} and len(grants) > 50, (modes, len(grants))
    tokens = [g["token"] for g in grants]
    assert len(tokens) == len(set(tokens)), "a fencing token was issued twice"
    by_key: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for grant in grants:
        by_key[grant["key"]].append((grant["acquired_at"], grant["token"]))
    for key, seen in by_key.items():
        seen.sort(key=lambda pair: pair[1])  # by token
        times = [at for at, _ in seen]
        assert times == sorted(times), f"{key}: a later token was granted earlier"
    with sqlite3.connect(resource) as db:
        shared_together = db.execute(
            "SELECT COUNT(*) FROM seen WHERE mode = 'shared'").fetchone()[0]
    assert shared_together > 0
