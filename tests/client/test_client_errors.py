"""Every error code maps to its class (the server's own error tree), with the
server's message, extra fields, `retry_after` and the request ID."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest

import fencepost
from client_support import FAST_RETRIES
from fencepost import errors
from fencepost.client.calls import Call, Reply, decode_flag, error_from_reply
from fencepost.client.operations import Op
from fencepost.errors import ERRORS_BY_CODE, FencepostError
from support import ServerProcess, free_port, unique_name

SERVER_CODES = sorted(
    code for code, cls in ERRORS_BY_CODE.items()
    if cls not in {errors.TransportError, errors.UnexpectedResponse}
)


def reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Reply(status, httpx.Headers(headers or {}), content)


@pytest.mark.parametrize("code", SERVER_CODES)
def test_every_code_decodes_to_its_class(code: str) -> None:
    cls = ERRORS_BY_CODE[code]
    extra = {"details": [{"field": "ttl_seconds", "message": "too small"}]} \
        if code == "validation_error" else {"operation": "deploy", "reason": "expired"}
    error = error_from_reply(reply(
        cls.http_status,
        {"error": {"code": code, "message": f"msg for {code}", "retry_after_ms": 1500, **extra}},
        {"X-Request-Id": "req-1", "Retry-After": "2"},
    ))
    assert type(error) is cls
    assert error.code == code
    assert error.message == f"msg for {code}"
    assert error.request_id == "req-1"
    assert error.retry_after == 1.5  # the body's milliseconds win over the header
    if code == "validation_error":
        assert isinstance(error, errors.ValidationError)
        assert error.details == [{"field": "ttl_seconds", "message": "too small"}]
    else:
        assert error.operation == "deploy"
        assert error.reason == "expired"


def test_retry_after_header_used_when_the_body_has_none() -> None:
    error = error_from_reply(reply(429, {"error": {"code": "quota_exceeded", "message": "m"}},
                                   {"Retry-After": "7"}))
    assert isinstance(error, errors.QuotaExceeded)
    assert error.retry_after == 7.0


@pytest.mark.parametrize("body", [b"<html>Bad gateway</html>", b"", {"detail": "x"},
                                  {"error": {"code": "brand_new_code", "message": "m"}}])
def test_foreign_answers_are_unexpected_response(body: Any) -> None:
    error = error_from_reply(reply(502, body))
    assert isinstance(error, errors.UnexpectedResponse)
    assert error.status == 502


def test_the_issue_names_exist_in_the_one_tree() -> None:
    for name in ["LockHeld", "LeaseLost", "LeaseExpired", "QueueTimeout", "TooManyRequests",
                 "QuotaExceeded", "Unauthorized", "Forbidden", "NotFound", "ValidationError",
                 "Capped", "InvalidRequest", "PayloadTooLarge", "ShuttingDown",
                 "TransportError", "UnexpectedResponse"]:
        assert issubclass(getattr(errors, name), FencepostError)


# --- the same classes, raised by a real server ------------------------------------


def raw(method: str, path: str, **options: Any) -> Op[bool]:
    """A program making one arbitrary call (for answers the client never provokes)."""
    return_value: bool = yield Call(method, path, decode_flag("released"), retry=False,
                                    **options)
    return return_value


def test_real_server_errors_map_to_classes(server: ServerProcess, member_key: str,
                                           reader_key: str) -> None:
    key = unique_name()
    with fencepost.Client(server.base_url, member_key, retries=FAST_RETRIES) as member, \
            fencepost.Client(server.base_url, reader_key) as reader, \
            fencepost.Client(server.base_url, "fp_not_a_key_at_all_0000000000000000") as nobody:
        lease = member.acquire_lock(key, ttl=30, operation="deploy")
        with pytest.raises(errors.LockHeld) as held:
            member.acquire_lock(key, ttl=30)
        assert held.value.operation == "deploy"
        assert held.value.retry_after is not None and held.value.retry_after > 0
        assert held.value.request_id
        member.release_lock(key, lease.lock_token)
        with pytest.raises(errors.LeaseLost) as lost:
            member.renew_lock(key, lease.lock_token, ttl=30)
        assert lost.value.reason == "released"
        with pytest.raises(errors.ValidationError) as invalid:
            member.acquire_lock(key, ttl=2)
        assert [d["field"] for d in invalid.value.details] == ["ttl_seconds"]
        with pytest.raises(errors.Unauthorized):
            nobody.whoami()
        with pytest.raises(errors.Forbidden):
            reader.acquire_lock(key, ttl=30)
        with pytest.raises(errors.Forbidden):
            reader.force_release(key)
        with pytest.raises(errors.NotFound):
            fencepost.Client(server.base_url, server.admin_key).revoke_key("key_0000000000000000")
        with pytest.raises(errors.InvalidRequest):
            member._run(raw("DELETE", f"/v1/locks/{key}/lease",
                            headers={"X-Lock-Token": "not-a-uuid"}))
        with pytest.raises(errors.MethodNotAllowed):
            member._run(raw("POST", f"/v1/locks/{key}/lease"))
        with pytest.raises(errors.PayloadTooLarge):
            member.acquire_lock(key, ttl=30, metadata={"blob": "x" * 70_000})


def test_lease_expired_maps_to_its_class(server: ServerProcess, member_key: str) -> None:
    key = unique_name()
    with fencepost.Client(server.base_url, member_key) as member:
        lease = member.acquire_lock(key, ttl=5)
        time.sleep(4.3)  # renewals must arrive more than 1 s before expiry
        with pytest.raises(errors.LeaseExpired):
            member.renew_lock(key, lease.lock_token, ttl=5)


def test_quota_exceeded_maps_and_carries_retry_after(server: ServerProcess) -> None:
    secret = server.create_key("member", rpm_quota=1)["key"]
    with fencepost.Client(server.base_url, secret, retries=fencepost.client.NO_RETRIES) as c:
        c.whoami()
        with pytest.raises(errors.QuotaExceeded) as over:
            c.whoami()
    assert over.value.retry_after is not None and over.value.retry_after > 0


def test_pool_errors_map_to_classes(server: ServerProcess, member_key: str) -> None:
    pool = unique_name("pool")
    with fencepost.Client(server.base_url, server.admin_key) as admin, \
            fencepost.Client(server.base_url, member_key) as member:
        with pytest.raises(errors.NotFound):
            member.acquire_slot(pool)
        admin.set_pool(pool, limit=1, term_ms=1000, request_timeout_ms=1000)
        grant = member.acquire_slot(pool)
        with pytest.raises(errors.TooManyRequests):
            member.acquire_slot(pool)
        with pytest.raises(errors.QueueTimeout):
            member.acquire_slot(pool, wait=0.2)
        with pytest.raises(errors.Capped):
            member.renew_slot(pool, grant.slot_id)
        with pytest.raises(errors.NotFound):
            member.renew_slot(pool, "slot_" + uuid.uuid4().hex)


def test_unreachable_server_is_a_transport_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with fencepost.Client(url, "k", retries=FAST_RETRIES) as c:
        with pytest.raises(errors.TransportError) as failed:
            c.whoami()
    assert failed.value.maybe_sent is False
    assert url in failed.value.message
