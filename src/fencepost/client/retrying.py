"""When and how long to retry a failed call: one policy for both clients, run by
tenacity (`Retrying` for the sync client, `AsyncRetrying` for the async one).

Retried: transport failures, 5xx answers and `429 quota_exceeded`, with
exponential backoff and full jitter (a random pause up to the exponential
bound, so many clients do not retry in step), never sooner than the server's
`Retry-After`. A call that is not idempotent (pool acquire, key creation) is
retried only when its earlier attempt surely never reached the server or was
answered with an error that says nothing was done, so a retry never takes a
second slot or makes a second key (a `503 store_unavailable` with `outcome:
"unknown"` says the change may have been made). A lock acquire is idempotent:
every attempt carries the same lock token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenacity import (
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)

from fencepost.client.calls import Call
from fencepost.errors import (
    FencepostError,
    QuotaExceeded,
    ShuttingDown,
    StoreUnavailable,
    TooManyConnections,
    TransportError,
    UnexpectedResponse,
)

_PROXY_STATUSES = {502, 503, 504}


@dataclass(frozen=True, slots=True)
class Retries:
    """How hard to try: at most `attempts` tries in all, giving up once the next
    pause would pass `budget_s` seconds since the first try (plus any wait the
    call itself asked the server for). Backoff starts near `initial_s` and grows
    to at most `max_backoff_s`, jittered; a `Retry-After` from the server is a
    floor. `Retries(attempts=1)` turns retrying off."""

    attempts: int = 5
    budget_s: float = 30.0
    initial_s: float = 0.2
    max_backoff_s: float = 5.0


NO_RETRIES = Retries(attempts=1)
# Releasing on the way out of a block: try briefly. If the server cannot be
# reached the lease ends at its TTL anyway (nothing renews it), and the caller's
# code should not hang on its way out.
RELEASE_RETRIES = Retries(attempts=3, budget_s=3.0, initial_s=0.1, max_backoff_s=1.0)


def should_retry(call: Call[Any], error: BaseException) -> bool:
    """Whether a failed attempt of `call` may be tried again."""
    if not call.retry or not isinstance(error, FencepostError):
        return False
    if isinstance(error, TransportError):
        return call.idempotent or not error.maybe_sent
    if isinstance(error, StoreUnavailable) and error.extra.get("outcome") == "unknown":
        # The store stopped answering while the change was under way.
        return call.idempotent
    if isinstance(
        error, QuotaExceeded | ShuttingDown | StoreUnavailable | TooManyConnections
    ):
        return True  # the server refused before doing anything
    if isinstance(error, UnexpectedResponse):
        # A proxy's 502/503/504 may hide whether the server acted on the request.
        return error.status in _PROXY_STATUSES and call.idempotent
    # 500 internal_error: the server may have failed after acting.
    return type(error) is FencepostError and call.idempotent


class _wait_backoff_or_retry_after(wait_random_exponential):
    """Full-jitter exponential backoff, but never shorter than the server's Retry-After."""

    def __call__(self, retry_state: RetryCallState) -> float:
        backoff = float(super().__call__(retry_state))
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        if isinstance(error, FencepostError) and error.retry_after is not None:
            return max(backoff, error.retry_after)
        return backoff


def tenacity_options(policy: Retries, call: Call[Any], wait_s: float = 0.0) -> dict[str, Any]:
    """Keyword arguments for `tenacity.Retrying` / `AsyncRetrying` for one call."""
    return {
        "retry": retry_if_exception(lambda error: should_retry(call, error)),
        "stop": stop_after_attempt(max(1, policy.attempts))
        | stop_before_delay(policy.budget_s + wait_s),
        "wait": _wait_backoff_or_retry_after(
            multiplier=policy.initial_s, max=policy.max_backoff_s
        ),
        "reraise": True,
    }
