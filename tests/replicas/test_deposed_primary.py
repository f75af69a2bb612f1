"""A deposed primary that wakes up (SPEC §7.9): the primary freezes (SIGSTOP,
as a paused VM or a stalled disk), its standby is promoted meanwhile, and the
old primary then resumes still taking writes, its token sequence far behind
the promoted one's. libpq, given both hosts, may connect to either.

Each phase runs under a load whose every grant is checked (tests/grants.py):
no token twice, none at or below one already answered for that lock.

1. frozen: fencepost follows the promoted standby by itself;
2. woken: its sessions on the promoted standby end, and libpq's first host is
   the old primary, which answers as a primary: fencepost passes it over for
   the promoted one (a newer timeline), says so, and /readyz stays `ok`;
3. the promoted one dies: only the old primary answers. fencepost writes to
   it with its tokens above every one answered, and says so as an error: in
   the log, the event log, the metric, and /readyz (`degraded`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from grants import LockLoad
from prometheus_client.parser import text_string_to_metric_families

from replicas.standby_pair import Pair
from support import ServerProcess, wait_for


def _cut_sessions(url: str) -> None:
    """End every other session of the database: fencepost must connect again."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def _ready(server: ServerProcess) -> dict[str, Any] | None:
    """/readyz's body once it answers 200, else None."""
    resp = httpx.get(f"{server.base_url}/readyz", timeout=10)
    return dict(resp.json()) if resp.status_code == 200 else None


def _changes(server: ServerProcess) -> dict[str, float]:
    """fencepost_store_database_changes_total by change, as scraped."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name == "fencepost_store_database_changes":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[sample.labels["change"]] = sample.value
    return found


def test_a_deposed_primary_that_wakes_never_takes_tokens_back(pair: Pair,
                                                              tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "a", store=pair.url,
                           extra_args=["--store-timeout", "2"]).start()
    load = LockLoad([server], [f"deposed-{i}" for i in range(4)], workers=4)
    try:
        load.start()
        load.wait_for_grants(50, after=0, timeout_s=30)
        assert _changes(server) == {"new": 0, "went_back": 0}

        pair.primary.pause()
        pair.relay.cut()
        pair.standby.promote()
        promoted = time.monotonic()
        load.wait_for_grants(50, after=promoted, timeout_s=60)
        assert _changes(server)["new"] >= 1

        pair.primary.resume()
        woke = time.monotonic()
        _cut_sessions(pair.standby.url)
        load.wait_for_grants(100, after=woke, timeout_s=60)
        said = server.stderr_path.read_text()
        assert "using another host instead" in said, said[-3000:]
        # Ready again once a write commits after the sessions that were cut.
        ready = wait_for(lambda: _ready(server), timeout=10, interval=0.2)
        assert ready is not None and ready["status"] == "ok", ready
        assert _changes(server)["went_back"] == 0

        killing = time.monotonic()
        pair.standby.kill9()
        gone = time.monotonic()
        load.wait_for_grants(100, after=gone, timeout_s=60)
        body = wait_for(lambda: _ready(server), timeout=10, interval=0.2)
        assert body is not None and body["status"] == "degraded", body
        # The first time it went back: from the promoted standby's newer timeline
        # to the old primary's, the same cluster (named system identifier:oid:
        # timeline). /readyz shows the latest.
        said = server.stderr_path.read_text()
        events = [json.loads(line) for line in said.splitlines()
                  if '"store.went_back"' in line]
        assert events, said[-3000:]
        first = events[0]
        before, after = first["before"].split(":"), first["after"].split(":")
        assert before[0] == after[0] and int(before[2]) > int(after[2]), first
        assert body["went_back"]["after"] == first["after"]
        assert 1 <= body["went_back"]["count"] <= len(events)  # read before the log
        # Every token the promoted one answered is below where the old one's
        # continue (grants answered while the kill was under way may be the old
        # one's already, above that).
        first_after = min(g.token for g in load.grants if g.answered > gone)
        on_promoted = max(g.token for g in load.grants if g.answered < killing)
        assert first["tokens_from"] >= on_promoted
        assert first_after > on_promoted
        assert _changes(server)["went_back"] >= len(events)  # read after the log
        assert "the store went back" in said
    finally:
        load.stop()
        server.stop()
    violations = load.violations(exclusive=False)
    assert not violations, violations[:10]
    assert not load.transport_errors, load.transport_errors[:5]
    print(f"\ndeposed primary: {len(load.grants)} grants, statuses {dict(load.statuses)}, "
          f"slowest request {load.slowest_s:.2f} s")
