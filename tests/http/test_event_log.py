"""The event log: one JSON line per lease granted, released, expired, force-released
and lost, slot granted, released and reclaimed, key created and revoked, pool created,
changed and deleted, and every refused caller; each with time, request ID, project
and key ID, and never a secret. Standard error carries JSON lines only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from support import ServerProcess, lock_headers, new_token, track, unique_name


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_event(path: Path, match: Callable[[dict[str, Any]], bool], what: str,
                   timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in lines(path) if match(line)]
        if found:
            assert len(found) == 1, found
            return found[0]
        assert time.monotonic() < deadline, f"no {what} in {lines(path)}"
        time.sleep(0.05)


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    event_log = tmp_path / "events.log"
    server = ServerProcess(tmp_path / "logged", extra_args=["--event-log", str(event_log)])
    server.start()
    yield server, event_log
    server.stop()


def test_every_event_is_one_line_with_who_and_never_a_secret(
        logged: tuple[ServerProcess, Path]) -> None:
    srv, log = logged
    admin_id = srv.client().get("/v1/whoami").json()["key_id"]
    secrets: list[str] = [srv.admin_key]
    key, forced, short = unique_name("ev"), unique_name("ev"), unique_name("ev")
    pool = unique_name("evpool")
    rid = {name: new_token() for name in
           ("grant", "release", "force", "lost", "slot", "slot_release", "key", "revoke", "pool",
            "pool_change", "pool_delete", "unknown", "forbidden", "quota")}

    def sent(name: str) -> dict[str, str]:
        return {"X-Request-Id": rid[name]}

    with srv.client() as c:
        token = new_token()
        secrets.append(token)
        assert c.put(f"/v1/locks/{key}/lease", json={"ttl_seconds": 30},
                     headers=lock_headers(token, rid["grant"])).status_code == 201
        assert c.request("DELETE", f"/v1/locks/{key}/lease",
                         headers=lock_headers(token, rid["release"])).status_code == 200
        forced_token = new_token()
        secrets.append(forced_token)
        assert c.put(f"/v1/locks/{forced}/lease", json={"ttl_seconds": 30},
                     headers=lock_headers(forced_token)).status_code == 201
        assert c.delete(f"/v1/locks/{forced}", headers=sent("force")).status_code == 200
        assert c.patch(f"/v1/locks/{forced}/lease", json={"ttl_seconds": 30},
                       headers=lock_headers(forced_token, rid["lost"])).status_code == 409
        assert c.put(f"/v1/locks/{short}/lease", json={"ttl_seconds": 5},
                     headers=lock_headers(new_token())).status_code == 201
        assert c.put(f"/v1/pools/{pool}", json={"limit": 2},
                     headers=sent("pool")).status_code == 201
        slot = c.post(f"/v1/pools/{pool}/lock/acquire", json={}, headers=sent("slot"))
        assert slot.status_code == 200, slot.text
        slot_id = slot.json()["slot_id"]
        secrets.append(slot_id)
        assert c.post(f"/v1/pools/{pool}/lock/{slot_id}/release", json={},
                      headers=sent("slot_release")).status_code == 200
        assert c.put(f"/v1/pools/{pool}", json={"limit": 3},
                     headers=sent("pool_change")).status_code == 200
        assert c.delete(f"/v1/pools/{pool}", headers=sent("pool_delete")).status_code == 200
        made = c.post("/v1/keys", json={"role": "reader", "rpm_quota": 1}, headers=sent("key"))
        assert made.status_code == 201
        reader_id, reader = made.json()["id"], made.json()["key"]
        secrets.append(reader)
    with srv.client("not-a-key") as stranger:
        assert stranger.get("/v1/whoami", headers=sent("unknown")).status_code == 401
    with srv.client(reader) as r:
        assert r.put(f"/v1/pools/{pool}", json={"limit": 1},
                     headers=sent("forbidden")).status_code == 403
        assert r.get("/v1/whoami", headers=sent("quota")).status_code == 429
    with srv.client() as c:
        assert c.delete(f"/v1/keys/{reader_id}", headers=sent("revoke")).status_code == 200

    def event(name: str, request: str | None, **fields: Any) -> dict[str, Any]:
        def match(line: dict[str, Any]) -> bool:
            return (line.get("event") == name
                    and (request is None or line.get("request_id") == rid[request])
                    and all(line.get(k) == v for k, v in fields.items()))
        found = wait_for_event(log, match, f"{name} {fields}")
        assert found["log"] == "event" and found["ts"].endswith("Z"), found
        if request is not None and found.get("status") != 401:
            assert found["project"] == "default", found
        return found

    mine = {"key_id": admin_id}
    granted = event("lease.granted", "grant", lock=key, **mine)
    assert isinstance(granted["fencing_token"], int)
    assert event("lease.released", "release", lock=key, **mine)["held_ms"] >= 0
    event("lease.force_released", "force", lock=forced, **mine)
    event("lease.lost", "lost", lock=forced, code="lease_lost", reason="force_released", **mine)
    event("slot.granted", "slot", pool=pool, **mine)
    event("slot.released", "slot_release", pool=pool, **mine)
    event("pool.created", "pool", pool=pool, **mine)
    event("pool.changed", "pool_change", pool=pool, **mine)
    event("pool.deleted", "pool_delete", pool=pool, **mine)
    event("key.created", "key", target_key_id=reader_id, role="reader", **mine)
    event("key.revoked", "revoke", target_key_id=reader_id, **mine)
    unknown = event("caller.refused", "unknown", status=401, code="unauthorized")
    assert unknown["key_id"] is None and unknown["project"] is None
    event("caller.refused", "forbidden", status=403, code="forbidden", key_id=reader_id)
    event("caller.refused", "quota", status=429, code="quota_exceeded", key_id=reader_id)
    # The reaper's work has no request: it says so, and names the project.
    expired = event("lease.expired", None, lock=short)
    assert expired["request_id"] is None and expired["key_id"] is None
    assert expired["project"] == "default"

    text = log.read_text()
    for secret in secrets:
        assert secret not in text
    for path in (srv.stderr_path, srv.stdout_path, srv.access_log):
        for secret in secrets:
            assert secret not in path.read_text()


def test_a_reclaimed_slot_is_logged_by_the_reaper(logged: tuple[ServerProcess, Path]) -> None:
    srv, log = logged
    pool = unique_name("reclaim")
    with srv.client() as c:
        assert c.put(f"/v1/pools/{pool}", json={"limit": 1, "term_ms": 1000,
                                                "renew_interval_ms": 500}).status_code == 201
        assert c.post(f"/v1/pools/{pool}/lock/acquire", json={}).status_code == 200
    found = wait_for_event(log, lambda line: line.get("event") == "slot.reclaimed"
                           and line.get("pool") == pool, "slot.reclaimed")
    assert found["request_id"] is None and found["project"] == "default"


def test_standard_error_carries_json_lines_only(tmp_path: Path) -> None:
    """By default the event log shares standard error with the access log and
    the application's messages; every line there is a whole JSON object."""
    srv = ServerProcess(tmp_path / "plain")
    srv.start()
    try:
        with srv.client() as c:
            assert c.put(f"/v1/locks/{unique_name('s')}/lease", json={"ttl_seconds": 30},
                         headers=lock_headers()).status_code == 201
        with srv.client("wrong") as stranger:
            assert stranger.get("/v1/whoami").status_code == 401
        httpx.get(f"{srv.base_url}/metrics", timeout=30)
    finally:
        srv.stop()
    logged = [json.loads(line) for line in srv.stderr_path.read_text().splitlines()]
    kinds = {line.get("log") for line in logged}
    assert {"app", "event"} <= kinds, logged
    assert any(line.get("event") == "lease.granted" for line in logged)
    assert any("serving on http://" in line.get("message", "") for line in logged)


def test_an_event_log_in_a_missing_folder_is_refused_before_anything_is_made(
        tmp_path: Path) -> None:
    proc = track(subprocess.Popen(
        [sys.executable, "-m", "fencepost", "serve", "--port", "0",
         "--store", f"sqlite:///{tmp_path}/fp.db", "--event-log", str(tmp_path / "no" / "e.log")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    assert "--event-log" in err and "does not exist" in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
