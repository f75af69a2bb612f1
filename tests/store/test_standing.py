"""Where a PostgreSQL store stands (store/standing.py): the replication mode
read from the database's settings, and the token floor of a connection that
reaches a database this deployment did not last write to (SPEC §7.8, §7.9).

The pure rules first; then a real PostgreSQL database whose recorded name is
changed under a running server, as a promoted standby's would be (it carries
the old primary's name), with the sequence set back as a lagging copy's is."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from fencepost.store.standing import (
    NEW_DATABASE_MARGIN_US,
    SEQUENCES,
    TOKENS,
    Mode,
    Replication,
    Standing,
    floored,
    floors_for,
    mode_of,
)
from pg_support import migrated_database
from support import ServerProcess, lock_headers, new_token, wait_for


@pytest.mark.parametrize(("names", "level", "standbys", "mode"), [
    ("", "on", 0, Mode.NONE),
    ("", "on", 2, Mode.ASYNC),
    ("standby1", "on", 1, Mode.SYNC),
    ("ANY 1 (a, b)", "remote_apply", 2, Mode.SYNC),
    ("FIRST 1 (a)", "remote_write", 0, Mode.SYNC),  # commits wait, for a standby not there
    ("standby1", "local", 1, Mode.ASYNC),  # this session's commits do not wait
    ("standby1", "off", 0, Mode.NONE),
    ("   ", "on", 1, Mode.ASYNC),
])
def test_mode_follows_what_a_commit_waits_for(names: str, level: str, standbys: int,
                                              mode: Mode) -> None:
    assert mode_of(names, level, standbys) is mode


def _standing(identity: str, recorded: str | None, sequence: int, clock_ms: int,
              tickets: int = 7) -> Standing:
    values = {name: tickets for name in SEQUENCES}
    values[TOKENS] = sequence
    return Standing(False, identity, recorded, values, clock_ms, Replication(Mode.NONE, 0))


def test_the_same_database_floors_its_tokens_at_its_clock() -> None:
    assert floors_for(_standing("s:5:1", "s:5:1", 10, 1_000), {}) == {TOKENS: 1_000_000}
    # A store from before names were recorded: the database last written to.
    assert floors_for(_standing("s:5:1", None, 10, 1_000), {TOKENS: 10**12}) == {
        TOKENS: 1_000_000}
    assert not floored(_standing("s:5:1", "s:5:1", 10, 1_000), {})
    assert floored(_standing("s:5:1", "s:5:1", 2_000_000, 1_000), {})
    assert not floored(_standing("s:5:1", None, 2_000_000, 1_000), {})  # name to record


def test_a_new_database_floors_every_sequence_above_all_known_plus_the_margin() -> None:
    clock_us = 1_000_000
    for sequence, high_water in [(5, 0), (10**9, 0), (5, 10**10), (10**10, 10**11)]:
        standing = _standing("s:5:2", "s:5:1", sequence, 1_000, tickets=3)
        floors = floors_for(standing, {TOKENS: high_water, "lock_tickets": 10**13})
        assert set(floors) == set(SEQUENCES)
        assert floors[TOKENS] == max(clock_us, sequence, high_water) + NEW_DATABASE_MARGIN_US
        assert floors["lock_tickets"] == 10**13 + NEW_DATABASE_MARGIN_US
        assert floors["slot_waiters_ticket_seq"] == clock_us + NEW_DATABASE_MARGIN_US
        assert not floored(standing, {})
    # Another cluster, another database in the cluster: new as well.
    assert _standing("t:5:1", "s:5:1", 5, 1_000).new
    assert _standing("s:6:1", "s:5:1", 5, 1_000).new
    assert not _standing("s:5:1", None, 5, 1_000).new


def _acquire(server: ServerProcess, key: str) -> int:
    """A new grant's token, retried while the server reconnects (503)."""
    with server.client(timeout=30) as client:
        def granted() -> int | None:
            lock_token = new_token()
            resp = client.put(f"/v1/locks/{key}/lease", headers=lock_headers(lock_token),
                              json={"ttl_seconds": 60})
            if resp.status_code == 503:
                return None
            assert resp.status_code == 201, resp.text
            released = client.delete(f"/v1/locks/{key}/lease",
                                     headers={"X-Lock-Token": lock_token})
            assert released.status_code == 200, released.text
            return int(resp.json()["fencing_token"])

        token = wait_for(granted, timeout=30, interval=0.1)
        assert token is not None, "no grant while the server reconnected"
        return int(token)


def _cut_sessions(url: str) -> None:
    """End the server's sessions, as a failover ends them: it must connect again."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def test_a_database_with_another_name_recorded_is_floored_with_the_margin(
        tmp_path: Path) -> None:
    with migrated_database() as url:
        server = ServerProcess(tmp_path / "a", store=url).start()
        try:
            before = [_acquire(server, f"k{i}") for i in range(3)]
            with psycopg.connect(url, autocommit=True) as conn:
                (identity,) = conn.execute(
                    "SELECT value FROM meta WHERE name = 'database_identity'").fetchone()
                # What a standby promoted after a lagging failover holds: the old
                # primary's name, and a sequence behind the tokens already issued.
                conn.execute("UPDATE meta SET value = 'another:1:1' "
                             "WHERE name = 'database_identity'")
                conn.execute("SELECT setval('fencing_tokens', %s)", (min(before) - 1,))
                tickets = {name: conn.execute(f"SELECT last_value FROM {name}").fetchone()[0]
                           for name in SEQUENCES[1:]}
            _cut_sessions(url)
            after = _acquire(server, "k0")
            assert after > max(before) + NEW_DATABASE_MARGIN_US - 1_000_000, (before, after)
            with psycopg.connect(url, autocommit=True) as conn:
                (recorded,) = conn.execute(
                    "SELECT value FROM meta WHERE name = 'database_identity'").fetchone()
                # The waiters' tickets too: a replica that outlived the failover may
                # hold any of them.
                for name, value in tickets.items():
                    (now,) = conn.execute(f"SELECT last_value FROM {name}").fetchone()
                    assert now >= value + NEW_DATABASE_MARGIN_US, (name, value, now)
            assert recorded == identity  # this database's own name again
            said = server.stderr_path.read_text()
            assert "did not last write to" in said and "another:1:1" in said
        finally:
            server.stop()


def test_a_reconnection_to_the_same_database_floors_at_its_clock(tmp_path: Path) -> None:
    """A copy restored in place keeps its name: its sequence, set back, is
    floored at the database clock when the server connects again, not only
    when it starts (the copy's tokens lie below the clock)."""
    with migrated_database() as url:
        server = ServerProcess(tmp_path / "a", store=url).start()
        try:
            before = _acquire(server, "k")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT setval('fencing_tokens', 1)")
            _cut_sessions(url)
            after = _acquire(server, "k")
            assert after > before
            assert after >= (time.time() - 60) * 1_000_000
            assert "did not last write to" not in server.stderr_path.read_text()
        finally:
            server.stop()
