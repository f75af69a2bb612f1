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
    Change,
    Mode,
    Replication,
    Standing,
    Written,
    change_of,
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
    same = Change.SAME
    assert floors_for(_standing("s:5:1", "s:5:1", 10, 1_000), {}, same) == {TOKENS: 1_000_000}
    # A store from before names were recorded: the database last written to.
    assert floors_for(_standing("s:5:1", None, 10, 1_000), {TOKENS: 10**12}, same) == {
        TOKENS: 1_000_000}
    assert not floored(_standing("s:5:1", "s:5:1", 10, 1_000), {}, same)
    assert floored(_standing("s:5:1", "s:5:1", 2_000_000, 1_000), {}, same)
    assert not floored(_standing("s:5:1", None, 2_000_000, 1_000), {}, same)  # name to record


@pytest.mark.parametrize("change", [Change.NEW, Change.BACK])
def test_a_new_database_floors_every_sequence_above_all_known_plus_the_margin(
        change: Change) -> None:
    clock_us = 1_000_000
    for sequence, high_water in [(5, 0), (10**9, 0), (5, 10**10), (10**10, 10**11)]:
        standing = _standing("s:5:2", "s:5:1", sequence, 1_000, tickets=3)
        floors = floors_for(standing, {TOKENS: high_water, "lock_tickets": 10**13}, change)
        assert set(floors) == set(SEQUENCES)
        assert floors[TOKENS] == max(clock_us, sequence, high_water) + NEW_DATABASE_MARGIN_US
        assert floors["lock_tickets"] == 10**13 + NEW_DATABASE_MARGIN_US
        assert floors["slot_waiters_ticket_seq"] == clock_us + NEW_DATABASE_MARGIN_US
        assert not floored(standing, {}, change)
    # Another cluster, another database in the cluster: new as well.
    assert _standing("t:5:1", "s:5:1", 5, 1_000).new
    assert _standing("s:6:1", "s:5:1", 5, 1_000).new
    assert not _standing("s:5:1", None, 5, 1_000).new


def test_a_database_another_replica_floored_since_it_changed_is_not_floored_twice() -> None:
    """Another replica floored it (and recorded its name) since this process
    judged it new: its values carry that replica's margin; this process adds
    its margin to what it has seen, not to the database's value again."""
    standing = _standing("s:5:2", "s:5:2", 10**13, 1_000, tickets=10**13)
    floors = floors_for(standing, {TOKENS: 10**12}, Change.NEW)
    assert floors[TOKENS] == 10**12 + NEW_DATABASE_MARGIN_US < 10**13
    assert floored(standing, {TOKENS: 10**12}, Change.NEW)
    # Not so for a database behind: its own value may be a deposed primary's.
    assert not floored(standing, {TOKENS: 10**12}, Change.BACK)


def _written(*identities: str) -> Written:
    written = Written()
    for identity in identities:
        written.record(identity)
    return written


def test_a_process_first_connection_goes_by_the_name_the_database_records() -> None:
    assert change_of(_standing("s:5:1", "s:5:1", 10, 1), Written(), {}) is Change.SAME
    assert change_of(_standing("s:5:1", None, 10, 1), Written(), {}) is Change.SAME
    # A promoted standby holds the old primary's name.
    assert change_of(_standing("s:5:2", "s:5:1", 10, 1), Written(), {}) is Change.NEW


def test_the_database_last_written_to_is_the_same_unless_its_tokens_fell() -> None:
    written = _written("s:5:2")
    assert change_of(_standing("s:5:2", "s:5:2", 100, 1), written, {TOKENS: 100}) is Change.SAME
    # Tokens below one this process has seen: it went back under the same name
    # (a copy restored in place, say).
    assert change_of(_standing("s:5:2", "s:5:2", 99, 1), written, {TOKENS: 100}) is Change.BACK


def test_a_newer_timeline_or_another_database_of_the_cluster_is_new() -> None:
    written = _written("s:5:1")
    # A promoted standby: a newer timeline, its tokens behind (it lagged).
    assert change_of(_standing("s:5:2", "s:5:1", 5, 1), written, {TOKENS: 100}) is Change.NEW
    # Its own name recorded already (another replica floored it): still new here.
    assert change_of(_standing("s:5:2", "s:5:2", 5, 1), written, {TOKENS: 100}) is Change.NEW
    assert change_of(_standing("s:6:1", "s:6:1", 5, 1), written, {}) is Change.NEW


def test_an_older_timeline_or_another_cluster_went_back() -> None:
    """The deposed primary that wakes up (the process wrote to timeline 2 of
    the cluster, and reaches timeline 1 again), or another cluster altogether,
    whatever the database's own record says."""
    written = _written("s:5:1", "s:5:2")
    for standing in [_standing("s:5:1", "s:5:1", 10**15, 1),  # its record: its own name
                     _standing("s:5:1", "s:5:2", 10**15, 1),
                     _standing("t:5:3", "t:5:3", 10**15, 1)]:
        assert change_of(standing, written, {}) is Change.BACK, standing
    # The newest timeline of each cluster counts, not only the last written to.
    assert change_of(_standing("s:5:1", "s:5:1", 1, 1), _written("s:5:2", "s:6:1"),
                     {}) is Change.BACK
    # After writing to it (no other host answered), it is the one last written to.
    assert change_of(_standing("s:5:1", "s:5:1", 10**15, 1), _written("s:5:2", "s:5:1"),
                     {}) is Change.SAME


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


def test_a_database_whose_tokens_fall_under_a_running_server_went_back(
        tmp_path: Path) -> None:
    """The same database (the same name), its sequence set back under a
    running server, as a copy restored in place would be: the server's next
    connection finds tokens below ones it granted, floors them above every one
    it has seen, and says so as an error: its log, the event log, the metric
    and /readyz (`degraded`, still 200: the store serves)."""
    with migrated_database() as url:
        server = ServerProcess(tmp_path / "a", store=url).start()
        try:
            before = _acquire(server, "k")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT setval('fencing_tokens', 1)")
            _cut_sessions(url)
            after = _acquire(server, "k")
            assert after > before + NEW_DATABASE_MARGIN_US - 1_000_000, (before, after)
            said = server.stderr_path.read_text()
            assert "the store went back" in said and '"store.went_back"' in said, said[-2000:]
            assert "did not last write to" not in said
            with server.client() as client:
                # Ready once a write commits after the sessions that were cut.
                wait_for(lambda: client.get("/readyz").status_code == 200, timeout=10,
                         interval=0.2)
                ready = client.get("/readyz")
                assert ready.status_code == 200, ready.text
                body = ready.json()
                assert body["status"] == "degraded", body
                assert body["went_back"]["before"] == body["went_back"]["after"]
                assert body["went_back"]["tokens_from"] >= before
                metrics = client.get("/metrics").text
            assert 'fencepost_store_database_changes_total{change="went_back"} 1.0' in metrics
        finally:
            server.stop()


def test_a_token_drawn_below_one_seen_is_never_answered(tmp_path: Path) -> None:
    """The sequence falls under the server's open connections (no reconnection
    to judge it by): the transaction that draws a token at or below one the
    server has seen is rolled back before its commit (503), every connection
    is replaced, and the next one floors the tokens above every one seen."""
    with migrated_database() as url:
        server = ServerProcess(tmp_path / "a", store=url).start()
        try:
            before = [_acquire(server, f"k{i}") for i in range(3)]
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT setval('fencing_tokens', 1)")
            after = [_acquire(server, f"k{i}") for i in range(3)]
            assert min(after) > max(before) + NEW_DATABASE_MARGIN_US - 1_000_000, (before, after)
            said = server.stderr_path.read_text()
            assert "drew fencing token" in said and "the store went back" in said, said[-2000:]
            with psycopg.connect(url, autocommit=True) as conn:
                # Nothing was committed with a fallen token (they fell to 2, 3, ...).
                (low,) = conn.execute(
                    "SELECT (SELECT count(*) FROM locks WHERE fencing_token < %s) + (SELECT "
                    "count(*) FROM ended WHERE fencing_token < %s)",
                    (min(before), min(before))).fetchone()
                (kept,) = conn.execute("SELECT count(*) FROM ended").fetchone()
            assert kept >= len(before) + len(after)  # the ends are remembered: the check sees them
            assert low == 0
        finally:
            server.stop()


def test_a_restart_on_a_copy_restored_in_place_floors_at_its_clock(tmp_path: Path) -> None:
    """A process that never saw the lost tokens has only the clock to go by
    (SPEC §7.8): the copy's tokens lie below it. Not an error: nothing it
    granted is above them."""
    with migrated_database() as url:
        server = ServerProcess(tmp_path / "a", store=url).start()
        try:
            before = _acquire(server, "k")
        finally:
            server.stop()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT setval('fencing_tokens', 1)")
        server = ServerProcess(tmp_path / "b", store=url).start()
        try:
            after = _acquire(server, "k")
            assert after > before
            assert after >= (time.time() - 60) * 1_000_000
            said = server.stderr_path.read_text()
            assert "did not last write to" not in said and "went back" not in said
            with server.client() as client:
                assert client.get("/readyz").json()["status"] == "ok"
        finally:
            server.stop()
