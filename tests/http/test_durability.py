"""SPEC §7.2/§7.3 across kill -9 and restarts, and §6 SIGTERM behaviour, over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from lock_support import release, renew
from support import ServerProcess, assert_error, lock_headers, new_token, unique_name, wait_for


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def crashable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own, alone or as `--workers 2` (SPEC §7.2 and
    §7.3 hold whichever process of several answered)."""
    proc = ServerProcess(tmp_path / "server", workers=request.param).start()
    yield proc
    proc.stop()


def acquire(c: httpx.Client, key: str, token: str, ttl: int = 600, **body: Any) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                 json={"ttl_seconds": ttl, **body})


def test_acknowledged_grants_renewals_and_releases_survive_kill9(
    crashable: ServerProcess,
) -> None:
    srv = crashable
    issued: list[int] = []
    held: dict[str, tuple[str, dict[str, Any]]] = {}
    with srv.client() as c:
        a, a_tok = unique_name("a"), new_token()
        r = acquire(c, a, a_tok, operation="deploy", metadata={"host": "h1"})
        assert r.status_code == 201, r.text
        held[a] = (a_tok, r.json())

        b, b_tok = unique_name("b"), new_token()
        r = acquire(c, b, b_tok, on_expiry="keep")
        assert r.status_code == 201, r.text
        held[b] = (b_tok, r.json())

        cc, c_tok = unique_name("c"), new_token()
        r = acquire(c, cc, c_tok, ttl=60)
        assert r.status_code == 201, r.text
        renewed = renew(c, cc, c_tok, 3600)
        assert renewed.status_code == 200, renewed.text
        held[cc] = (c_tok, {**r.json(), "expires_at": renewed.json()["expires_at"]})

        d, d_tok = unique_name("d"), new_token()
        r = acquire(c, d, d_tok)
        assert r.status_code == 201, r.text
        issued.append(r.json()["fencing_token"])
        assert release(c, d, d_tok).json() == {"released": True}

        e, e_tok = unique_name("e"), new_token()
        r = acquire(c, e, e_tok)
        assert r.status_code == 201, r.text
        issued.append(r.json()["fencing_token"])
        assert c.delete(f"/v1/locks/{e}").json()["released"] is True

    issued += [body["fencing_token"] for _, body in held.values()]
    srv.kill9()
    srv.start()

    with srv.client() as c:
        for key, (token, grant) in held.items():
            state = c.get(f"/v1/locks/{key}").json()
            assert state["held"] is True, (key, state)
            assert state["fencing_token"] == grant["fencing_token"]
            assert state["acquired_at"] == grant["acquired_at"]
            assert state["expires_at"] == grant["expires_at"]
            assert state["deadline_at"] == grant["deadline_at"]
            assert state["on_expiry"] == grant["on_expiry"]
            assert state["operation"] == grant["operation"]
            # The holder is still recognised by its lock token.
            again = acquire(c, key, token)
            assert again.status_code == 200, again.text
            assert again.json()["fencing_token"] == grant["fencing_token"]
            assert_error(acquire(c, key, new_token()), 409, "lock_held")
        assert c.get(f"/v1/locks/{a}").json()["metadata"] == {"host": "h1"}
        assert c.get(f"/v1/locks/{d}").json()["held"] is False
        assert c.get(f"/v1/locks/{e}").json()["held"] is False
        assert_error(renew(c, d, d_tok, 30), 409, "lease_lost")
        assert_error(renew(c, e, e_tok, 30), 409, "lease_lost")
        r = renew(c, b, b_tok, 120)
        assert r.status_code == 200, r.text
        assert r.json()["fencing_token"] == held[b][1]["fencing_token"]

        fresh = acquire(c, unique_name("after"), new_token())
        assert fresh.status_code == 201, fresh.text
        assert fresh.json()["fencing_token"] > max(issued)
        reuse = acquire(c, d, new_token())
        assert reuse.status_code == 201, reuse.text
        assert reuse.json()["fencing_token"] > fresh.json()["fencing_token"]


@dataclass
class Record:
    key: str
    token: str
    fencing: int
    state: str = "held"  # held | renewed | released | unknown
    expires_at: str = ""


@dataclass
class Burst:
    records: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def test_everything_acknowledged_during_a_burst_survives_kill9(
    crashable: ServerProcess,
) -> None:
    srv = crashable
    burst = Burst()
    stop = threading.Event()

    def worker(n: int) -> None:
        with srv.client() as c:
            i = 0
            while not stop.is_set():
                i += 1
                key, token = unique_name(f"burst{n}"), new_token()
                try:
                    r = acquire(c, key, token)
                except httpx.HTTPError:
                    return
                if r.status_code != 201:
                    return
                rec = Record(key, token, r.json()["fencing_token"],
                             expires_at=r.json()["expires_at"])
                with burst.lock:
                    burst.records.append(rec)
                try:
                    if i % 3 == 1:
                        rec.state = "unknown"
                        rr = renew(c, key, token, 3600)
                        if rr.status_code != 200:
                            return
                        rec.expires_at, rec.state = rr.json()["expires_at"], "renewed"
                    elif i % 3 == 2:
                        rec.state = "unknown"
                        rr = release(c, key, token)
                        if rr.status_code != 200 or rr.json() != {"released": True}:
                            return
                        rec.state = "released"
                except httpx.HTTPError:
                    return

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(8)]
    for t in threads:
        t.start()
    assert wait_for(lambda: len(burst.records) >= 60, timeout=20), "burst made no progress"
    srv.kill9()  # while requests are in flight
    stop.set()
    for t in threads:
        t.join(15)
        assert not t.is_alive()

    records = list(burst.records)
    max_acked = max(r.fencing for r in records)
    fencings = [r.fencing for r in records]
    assert len(set(fencings)) == len(fencings), "a fencing token was issued twice"

    srv.start()
    checked = {"held": 0, "renewed": 0, "released": 0}
    with srv.client() as c:
        for rec in records:
            if rec.state == "unknown":
                continue
            state = c.get(f"/v1/locks/{rec.key}").json()
            if rec.state == "released":
                assert state["held"] is False, (rec, state)
            else:
                assert state["held"] is True, (rec, state)
                assert state["fencing_token"] == rec.fencing, (rec, state)
                assert state["expires_at"] == rec.expires_at, (rec, state)
            checked[rec.state] += 1
        assert all(checked.values()), checked

        after = [acquire(c, unique_name("post"), new_token()).json()["fencing_token"]
                 for _ in range(3)]
        assert after[0] > max_acked, (after, max_acked)
        assert after == sorted(after) and len(set(after)) == 3


def test_fencing_keeps_rising_across_repeated_crashes(crashable: ServerProcess) -> None:
    srv = crashable
    last = 0
    key = unique_name("crashy")
    for _ in range(3):
        with srv.client() as c:
            token = new_token()
            r = acquire(c, key, token)
            assert r.status_code == 201, r.text
            fencing = r.json()["fencing_token"]
            assert fencing > last
            assert release(c, key, token).json() == {"released": True}
            last = fencing
        srv.kill9()
        srv.start()
    with srv.client() as c:
        assert c.get(f"/v1/locks/{key}").json()["held"] is False
        r = acquire(c, key, new_token())
        assert r.status_code == 201
        assert r.json()["fencing_token"] > last


def test_sigterm_while_idle_exits_0(fresh_server: ServerProcess) -> None:
    with fresh_server.client() as c:
        assert acquire(c, unique_name(), new_token()).status_code == 201
    assert fresh_server.terminate() == 0


def test_sigterm_answers_a_parked_waiter_503_and_exits_0(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    key, holder = unique_name("shutdown"), new_token()
    with srv.client() as c:
        grant = acquire(c, key, holder, ttl=600)
        assert grant.status_code == 201

    outcome: dict[str, Any] = {}

    def wait_in_line() -> None:
        try:
            with srv.client() as wc:
                outcome["response"] = acquire(wc, key, new_token(), ttl=60, wait_seconds=60)
        except Exception as exc:
            outcome["error"] = exc

    waiter = threading.Thread(target=wait_in_line, daemon=True)
    waiter.start()
    with srv.client() as c:
        assert wait_for(lambda: c.get(f"/v1/locks/{key}").json()["waiters"] == 1), \
            "waiter never got in line"

    assert srv.terminate(timeout=15) == 0
    waiter.join(10)
    assert not waiter.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert_error(outcome["response"], 503, "shutting_down")

    # A clean stop loses nothing either.
    srv.start()
    with srv.client() as c:
        state = c.get(f"/v1/locks/{key}").json()
        assert state["held"] is True
        assert state["fencing_token"] == grant.json()["fencing_token"]
        assert state["waiters"] == 0
        again = acquire(c, key, holder, ttl=600)
        assert again.status_code == 200
        assert again.json() == grant.json()
