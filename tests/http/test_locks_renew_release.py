"""SPEC §3.2 (renew) and §3.3 (release) over HTTP."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from lock_support import acquire, release, renew
from support import ServerProcess, assert_error, new_token, parse_at, unique_name

ONE_MS = timedelta(milliseconds=1)


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


# --- renew -------------------------------------------------------------------------------------


def test_renew_returns_200_with_exact_fields_and_unchanged_fencing(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=30)
    assert grant.status_code == 201, grant.text
    g = grant.json()
    time.sleep(0.05)

    before = datetime.now(UTC)
    resp = renew(member, key, token, 120)
    after = datetime.now(UTC)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"key", "fencing_token", "expires_at", "deadline_at"}, body
    assert body["key"] == key
    assert body["fencing_token"] == g["fencing_token"]
    assert body["deadline_at"] == g["deadline_at"]
    expires = parse_at(body["expires_at"])
    # now + 120 s, measured when the renewal is served
    assert before + timedelta(seconds=120) - timedelta(seconds=2) <= expires
    assert expires <= after + timedelta(seconds=120) + timedelta(seconds=2)
    assert expires > parse_at(g["acquired_at"]) + timedelta(seconds=120)

    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["expires_at"] == body["expires_at"]
    assert state["fencing_token"] == g["fencing_token"]
    assert state["acquired_at"] == g["acquired_at"]


def test_renew_sets_expiry_outright_so_a_shorter_ttl_shortens(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=3600)
    assert grant.status_code == 201
    g = grant.json()
    resp = renew(member, key, token, 10)
    assert resp.status_code == 200, resp.text
    expires = parse_at(resp.json()["expires_at"])
    assert expires < parse_at(g["expires_at"])
    acquired = parse_at(g["acquired_at"])
    assert acquired + timedelta(seconds=10) <= expires <= acquired + timedelta(seconds=15)
    assert member.get(f"/v1/locks/{key}").json()["expires_at"] == resp.json()["expires_at"]


def test_renew_is_capped_at_the_deadline(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=60)
    assert grant.status_code == 201
    time.sleep(0.05)  # so that now + 90 days is strictly past deadline_at
    resp = renew(member, key, token, 7776000)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["deadline_at"] == grant.json()["deadline_at"]
    assert body["expires_at"] == body["deadline_at"]
    assert member.get(f"/v1/locks/{key}").json()["expires_at"] == body["deadline_at"]


def test_repeated_renewals_keep_the_same_fencing_token(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=30)
    fencing = grant.json()["fencing_token"]
    for ttl in (30, 60, 5, 40):
        resp = renew(member, key, token, ttl)
        assert resp.status_code == 200, resp.text
        assert resp.json()["fencing_token"] == fencing


def test_renewal_earlier_than_one_second_before_expiry_succeeds_later_is_lease_expired(
    member: httpx.Client,
) -> None:
    # The "too late" window is the lease's last second, whatever its TTL. A
    # machine that stalls this client past the lease's end makes the attempt
    # say nothing (the lease may have expired meanwhile); such an attempt is
    # measured, not guessed, and the scenario runs again on a fresh lock.
    for _attempt in range(3):
        if _late_renewal_is_lease_expired(member):
            return
    pytest.fail("three attempts in a row were stalled past the lease's end")


def _late_renewal_is_lease_expired(member: httpx.Client) -> bool:
    """The scenario's assertions, or False when this client was stalled past
    the point where the server's lease surely still lived."""
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=5)
    granted = time.monotonic()
    assert grant.status_code == 201
    fencing = grant.json()["fencing_token"]

    # 3 s in, 2 s left: allowed.
    sleep_until(granted + 3.0)
    renew_sent = time.monotonic()
    ok = renew(member, key, token, 5)
    renewed = time.monotonic()
    assert ok.status_code == 200, ok.text
    assert ok.json()["fencing_token"] == fencing
    # The server renewed between renew_sent and renewed: the lease lives at
    # least until renew_sent + 5 s, and its last second begins by renewed + 4 s.
    lives_until = renew_sent + 5.0

    # ~4.3 s after that renewal, < 1 s left: too late.
    sleep_until(renewed + 4.3)
    late = renew(member, key, token, 30)
    # The holder keeps the lease until expires_at: others are still refused, nothing changed.
    other = acquire(member, key, new_token(), ttl=30)
    state = member.get(f"/v1/locks/{key}").json()
    if time.monotonic() >= lives_until:
        return False  # stalled: the lease may have ended before these were served
    assert_error(late, 409, "lease_expired")
    assert_error(other, 409, "lock_held")
    assert state["held"] is True
    assert state["fencing_token"] == fencing
    assert state["expires_at"] == ok.json()["expires_at"]
    return True


def test_renew_after_release_is_lease_lost_released(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    assert acquire(member, key, token).status_code == 201
    assert release(member, key, token).json() == {"released": True}
    err = assert_error(renew(member, key, token, 30), 409, "lease_lost")
    assert err["reason"] == "released"
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_renew_after_force_release_is_lease_lost_force_released(
    member: httpx.Client, admin: httpx.Client,
) -> None:
    key, token = unique_name(), new_token()
    assert acquire(member, key, token).status_code == 201
    forced = admin.delete(f"/v1/locks/{key}")
    assert forced.status_code == 200 and forced.json()["released"] is True, forced.text
    err = assert_error(renew(member, key, token, 30), 409, "lease_lost")
    assert err["reason"] == "force_released"
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_renew_after_expiry_is_lease_lost_and_cannot_come_back(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=5)
    granted = time.monotonic()
    assert grant.status_code == 201
    old_fencing = grant.json()["fencing_token"]

    sleep_until(granted + 6.2)
    # Expired and freed, nobody else has it.
    err = assert_error(renew(member, key, token, 30), 409, "lease_lost")
    assert err["reason"] == "expired"
    assert member.get(f"/v1/locks/{key}").json()["held"] is False

    # Someone else takes it; the old holder is still lost and cannot disturb the new lease.
    other_token = new_token()
    other = acquire(member, key, other_token, ttl=60)
    assert other.status_code == 201, other.text
    assert other.json()["fencing_token"] > old_fencing
    err = assert_error(renew(member, key, token, 30), 409, "lease_lost")
    assert err["reason"] in ("expired", "superseded")
    assert release(member, key, token).json() == {"released": False}
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["fencing_token"] == other.json()["fencing_token"]
    assert state["expires_at"] == other.json()["expires_at"]


def test_renew_by_a_token_that_never_held_the_lock_is_lease_lost(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=30)
    assert grant.status_code == 201
    err = assert_error(renew(member, key, new_token(), 3600), 409, "lease_lost")
    assert "reason" in err
    assert err["reason"] is None
    state = member.get(f"/v1/locks/{key}").json()
    assert state["expires_at"] == grant.json()["expires_at"]
    assert state["fencing_token"] == grant.json()["fencing_token"]


def test_renew_of_a_free_lock_is_lease_lost(member: httpx.Client) -> None:
    err = assert_error(renew(member, unique_name(), new_token(), 30), 409, "lease_lost")
    assert "reason" in err and err["reason"] is None


def test_overdue_keep_lease_can_still_be_renewed(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=5, on_expiry="keep")
    granted = time.monotonic()
    assert grant.status_code == 201
    fencing = grant.json()["fencing_token"]

    sleep_until(granted + 6.0)
    assert member.get(f"/v1/locks/{key}").json()["overdue"] is True
    resp = renew(member, key, token, 30)
    assert resp.status_code == 200, resp.text
    assert resp.json()["fencing_token"] == fencing
    assert parse_at(resp.json()["expires_at"]) > datetime.now(UTC) + timedelta(seconds=20)
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["overdue"] is False
    assert state["fencing_token"] == fencing


VALID = "valid"


@pytest.mark.parametrize(
    ("lock_token", "request_id", "content", "status", "code"),
    [
        (None, VALID, b'{"ttl_seconds": 30}', 400, "invalid_request"),
        ("nope", VALID, b'{"ttl_seconds": 30}', 400, "invalid_request"),
        (VALID, None, b'{"ttl_seconds": 30}', 400, "invalid_request"),
        (VALID, "req-7", b'{"ttl_seconds": 30}', 400, "invalid_request"),
        (VALID, VALID, b"", 400, "invalid_request"),
        (VALID, VALID, b"{}", 422, "validation_error"),
        (VALID, VALID, b'{"ttl_seconds": 4}', 422, "validation_error"),
        (VALID, VALID, b'{"ttl_seconds": 7776001}', 422, "validation_error"),
        (VALID, VALID, b'{"ttl_seconds": "60"}', 422, "validation_error"),
        (VALID, VALID, b'{"ttl_seconds": 30, "wait_seconds": 1}', 422, "validation_error"),
    ],
    ids=["no-lock-token", "bad-lock-token", "no-request-id", "bad-request-id", "empty-body",
         "no-ttl", "ttl-too-small", "ttl-too-large", "ttl-string", "unknown-field"],
)
def test_bad_renew_requests_are_rejected_and_leave_the_lease_alone(
    member: httpx.Client, lock_token: str | None, request_id: str | None, content: bytes,
    status: int, code: str,
) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=30)
    assert grant.status_code == 201
    sent = {"Content-Type": "application/json"}
    if lock_token is not None:
        sent["X-Lock-Token"] = token if lock_token == VALID else lock_token
    if request_id is not None:
        sent["X-Request-Id"] = new_token() if request_id == VALID else request_id
    resp = member.patch(f"/v1/locks/{key}/lease", headers=sent, content=content)
    err = assert_error(resp, status, code)
    if status == 422:
        assert err.get("details"), err
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["expires_at"] == grant.json()["expires_at"]


# --- release -----------------------------------------------------------------------------------


def test_release_is_200_true_then_idempotently_false(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    assert acquire(member, key, token).status_code == 201
    first = release(member, key, token)
    assert first.status_code == 200
    assert first.json() == {"released": True}
    for _ in range(2):
        again = release(member, key, token)
        assert again.status_code == 200
        assert again.json() == {"released": False}
    assert member.get(f"/v1/locks/{key}").json()["held"] is False
    # The lock is free for anybody now.
    assert acquire(member, key, new_token()).status_code == 201


def test_release_with_wrong_token_is_false_and_lock_stays_held(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=30)
    assert grant.status_code == 201
    resp = release(member, key, new_token())
    assert resp.status_code == 200
    assert resp.json() == {"released": False}
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["fencing_token"] == grant.json()["fencing_token"]
    assert_error(acquire(member, key, new_token()), 409, "lock_held")
    assert renew(member, key, token, 30).status_code == 200


def test_release_of_a_never_held_lock_is_200_false_not_404(member: httpx.Client) -> None:
    resp = release(member, unique_name(), new_token())
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"released": False}


def test_release_needs_a_uuid_lock_token(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    assert acquire(member, key, token).status_code == 201
    assert_error(member.delete(f"/v1/locks/{key}/lease"), 400, "invalid_request")
    assert_error(member.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": "x"}), 400,
             "invalid_request")
    assert member.get(f"/v1/locks/{key}").json()["held"] is True


def test_release_of_a_keep_lease_frees_it(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    assert acquire(member, key, token, ttl=5, on_expiry="keep").status_code == 201
    assert release(member, key, token).json() == {"released": True}
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_reader_may_not_renew_or_release(server: ServerProcess, member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=30)
    assert grant.status_code == 201
    reader = server.create_key("reader")["key"]
    with server.client(reader) as c:
        assert_error(renew(c, key, token, 60), 403, "forbidden")
        assert_error(release(c, key, token), 403, "forbidden")
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["expires_at"] == grant.json()["expires_at"]
