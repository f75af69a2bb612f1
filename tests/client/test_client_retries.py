"""Retries: transport failures and 5xx are retried with backoff that honours
Retry-After; a retried acquire reuses its lock token and never makes a second
lease; a pool acquire whose answer may have been lost is not retried."""

from __future__ import annotations

import httpx
import pytest
from tenacity import RetryCallState, Retrying

import fencepost
from client_support import (
    AsyncFaultyTransport,
    Fault,
    FaultyTransport,
    Recorder,
    error_response,
)
from fencepost.client import Retries
from fencepost.client.calls import Call, decode_flag
from fencepost.client.retrying import should_retry, tenacity_options
from fencepost.errors import QuotaExceeded, TransportError, UnexpectedResponse
from support import ServerProcess, unique_name

QUICK = Retries(attempts=4, budget_s=10, initial_s=0.05, max_backoff_s=0.2)


def granted_outcomes(server: ServerProcess, key: str) -> list[str]:
    """The access log's outcomes for acquires of `key` (its field is `lock` per the
    README; `key` is accepted too, as one server revision wrote)."""
    return [line["outcome"] for line in server.access_log_lines()
            if line.get("event") == "lock.acquire"
            and key in (line.get("lock"), line.get("key"))]


def test_acquire_with_lost_answer_is_retried_with_the_same_token(
        server: ServerProcess, client: fencepost.Client, recorder: Recorder) -> None:
    key = unique_name()
    recorder.faults.append(Fault("PUT", key, "lose_answer"))
    lease = client.acquire_lock(key, ttl=30)
    assert lease.created is False  # the server answered 200: this token already held it
    assert recorder.count("PUT", key) == 2
    assert client.get_lock(key).fencing_token == lease.fencing_token
    assert granted_outcomes(server, key) == ["granted", "existing"]
    assert client.release_lock(key, lease.lock_token) is True


async def test_async_acquire_with_lost_answer_is_retried_with_the_same_token(
        server: ServerProcess, aclient: fencepost.AsyncClient, recorder: Recorder) -> None:
    key = unique_name()
    recorder.faults.append(Fault("PUT", key, "lose_answer"))
    async with aclient.lock(key, ttl=30) as held:
        assert held.lease.created is False
        assert (await aclient.get_lock(key)).fencing_token == held.fencing_token
    assert granted_outcomes(server, key) == ["granted", "existing"]


def test_lock_context_with_lost_answer_holds_one_lease(
        server: ServerProcess, client: fencepost.Client, recorder: Recorder) -> None:
    key = unique_name()
    recorder.faults.append(Fault("PUT", key, "lose_answer"))
    with client.lock(key, ttl=30) as held:
        with pytest.raises(fencepost.errors.LockHeld):
            client.acquire_lock(key, ttl=30)  # another token: refused
        assert client.get_lock(key).fencing_token == held.fencing_token
    assert granted_outcomes(server, key) == ["granted", "existing", "held"]
    assert not client.get_lock(key).held


def test_pool_acquire_is_not_retried_when_the_answer_may_be_lost(
        client: fencepost.Client, recorder: Recorder) -> None:
    pool = unique_name("pool")
    client.set_pool(pool, limit=5)
    recorder.faults.append(Fault("POST", f"{pool}/lock/acquire", "lose_answer"))
    with pytest.raises(TransportError):
        client.acquire_slot(pool)
    assert recorder.count("POST", f"{pool}/lock/acquire") == 1  # no second slot taken
    assert client.get_pool(pool).in_use == 1  # the lost one, reclaimed after one term


def test_pool_acquire_is_retried_when_nothing_was_sent(client: fencepost.Client,
                                                       recorder: Recorder) -> None:
    pool = unique_name("pool")
    client.set_pool(pool, limit=5)
    recorder.faults.append(Fault("POST", f"{pool}/lock/acquire", "refuse"))
    grant = client.acquire_slot(pool)
    assert grant.slot_id
    assert recorder.count("POST", f"{pool}/lock/acquire") == 2
    assert client.get_pool(pool).in_use == 1
    assert client.release_slot(pool, grant.slot_id) is True


@pytest.mark.parametrize("answer", [
    error_response(503, "shutting_down"),
    error_response(503, "store_unavailable"),
    error_response(500, "internal_error"),
    httpx.Response(502, content=b"<html>bad gateway</html>"),
])
def test_5xx_answers_are_retried(server: ServerProcess, answer: httpx.Response) -> None:
    recorder = Recorder(faults=[Fault("GET", "/v1/whoami", answer, times=2)])
    with fencepost.Client(server.base_url, server.admin_key, retries=QUICK,
                          transport=FaultyTransport(recorder)) as c:
        assert c.whoami().role == "admin"
    assert recorder.count("GET", "/v1/whoami") == 3


async def test_async_quota_refusal_is_retried_after_retry_after(server: ServerProcess) -> None:
    refusal = error_response(429, "quota_exceeded", retry_after_ms=300)
    recorder = Recorder(faults=[Fault("GET", "/v1/whoami", refusal)])
    async with fencepost.AsyncClient(server.base_url, server.admin_key, retries=QUICK,
                                     transport=AsyncFaultyTransport(recorder)) as c:
        assert (await c.whoami()).role == "admin"
    (first, *_), (second, *_) = recorder.seen
    assert second - first >= 0.3  # waited at least the server's Retry-After


def test_giving_up_raises_the_last_error(server: ServerProcess) -> None:
    recorder = Recorder(faults=[Fault("GET", "/v1/whoami", error_response(503, "shutting_down"),
                                      times=10)])
    with fencepost.Client(server.base_url, server.admin_key, retries=QUICK,
                          transport=FaultyTransport(recorder)) as c:
        with pytest.raises(fencepost.errors.ShuttingDown):
            c.whoami()
    assert recorder.count("GET", "/v1/whoami") == QUICK.attempts


def test_4xx_answers_are_not_retried(client: fencepost.Client, recorder: Recorder) -> None:
    key = unique_name()
    client.acquire_lock(key, ttl=30)
    with pytest.raises(fencepost.errors.LockHeld):
        client.acquire_lock(key, ttl=30)
    assert recorder.count("PUT", key) == 2


# --- the policy itself ---------------------------------------------------------------


def _call(idempotent: bool = True, retry: bool = True) -> Call[bool]:
    return Call("GET", "/x", decode_flag("x"), idempotent=idempotent, retry=retry)


@pytest.mark.parametrize("error,idempotent,expected", [
    (TransportError("x", maybe_sent=False), False, True),
    (TransportError("x", maybe_sent=True), False, False),
    (TransportError("x", maybe_sent=True), True, True),
    (UnexpectedResponse("x", status=502), True, True),
    (UnexpectedResponse("x", status=502), False, False),
    (UnexpectedResponse("x", status=404), True, False),
    (QuotaExceeded(), False, True),
    (fencepost.errors.StoreUnavailable(), False, True),
    (fencepost.errors.StoreNotReplicated(), False, True),
    (fencepost.errors.StoreUnavailable(outcome="unknown"), True, True),
    (fencepost.errors.StoreUnavailable(outcome="unknown"), False, False),
    (fencepost.errors.LockHeld(), True, False),
    (fencepost.errors.QueueTimeout(), True, False),
    (fencepost.errors.FencepostError(), True, True),
    (fencepost.errors.FencepostError(), False, False),
    (ValueError("not ours"), True, False),
])
def test_should_retry(error: BaseException, idempotent: bool, expected: bool) -> None:
    assert should_retry(_call(idempotent), error) is expected
    assert should_retry(_call(idempotent, retry=False), error) is False


def test_backoff_is_never_shorter_than_retry_after() -> None:
    options = tenacity_options(Retries(initial_s=0.01, max_backoff_s=0.02), _call())
    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    error = QuotaExceeded(retry_after_ms=2500)
    state.set_exception((QuotaExceeded, error, None))
    assert all(options["wait"](state) >= 2.5 for _ in range(20))
    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    state.set_exception((TransportError, TransportError("x"), None))
    assert all(0 <= options["wait"](state) <= 0.02 for _ in range(20))

