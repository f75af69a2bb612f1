"""`Client`: the blocking client, and its `lock()` / `slot()` context managers.

It runs the same programs as `AsyncClient` (see `methods.py`, `operations.py`,
`keeper.py`); only the moving of bytes and the keeper's home (a thread) differ.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from tenacity import Retrying

from fencepost.client.calls import Call, Sleep, raise_for_status
from fencepost.client.holding import (
    Holding,
    LockFacts,
    LockSetFacts,
    SlotFacts,
    log,
    report_failure,
)
from fencepost.client.keeper import Terms, keep_alive
from fencepost.client.key_refresh import CurrentKey, KeyRefresh, OnKeyRefresh, refresh_if_due
from fencepost.client.methods import Methods, SyncRunner
from fencepost.client.models import OnExpiry
from fencepost.client.operations import Op
from fencepost.client.proxying import proxy_options
from fencepost.client.retrying import RELEASE_RETRIES, Retries, tenacity_options
from fencepost.client.sessions import (
    AttachedKinds,
    AttachedLockFacts,
    AttachedLockSetFacts,
    AttachedSlotFacts,
    SessionFacts,
)
from fencepost.client.transport import (
    MAX_IN_FLIGHT,
    OnRenewed,
    Settings,
    reply_of,
    transport_error,
    waited_too_long,
)
from fencepost.client.turns import turn_limit
from fencepost.errors import FencepostError, TransportError, Unauthorized, UnexpectedResponse

T = TypeVar("T")


def drive(
    program: Op[T], send: Callable[[Call[Any]], Any], stop: threading.Event | None = None,
    alive: Callable[[], bool] | None = None,
) -> T | None:
    """Run a program: make its calls with `send`, sleep its sleeps. Returns None
    (without making another call) once `stop` is set or `alive()` turns false."""
    try:
        step = next(program)
        while True:
            if isinstance(step, Sleep):
                if stop is not None:
                    if stop.wait(step.seconds):
                        return None
                else:
                    time.sleep(step.seconds)
                step = program.send(None)
                continue
            if (stop is not None and stop.is_set()) or (alive is not None and not alive()):
                return None
            failure: FencepostError | None = None
            try:
                value = send(step)
            except FencepostError as error:
                failure = error
            step = program.throw(failure) if failure is not None else program.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()


class Client(CurrentKey, Methods, SyncRunner):
    """The blocking fencepost client: the same methods as `AsyncClient`, without
    `await`. Safe to share between threads. Use it with `with` or call `close()`.

    `url` and `api_key` default to `FENCEPOST_URL` / `FENCEPOST_API_KEY` (and the
    URL to `http://127.0.0.1:7440`); see `AsyncClient` for the other options.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        retries: Retries | None = None,
        transport: httpx.BaseTransport | None = None,
        ca_bundle: str | None = None,
        on_key_refresh: OnKeyRefresh | None = None,
        retire_previous: bool = False,
        on_renewed: OnRenewed | None = None,
        token_file: str | None = None,
        token_command: str | None = None,
    ) -> None:
        self.settings = Settings.resolve(url, api_key, timeout, retries, ca_bundle=ca_bundle,
                                         token_file=token_file, token_command=token_command)
        self._bearer = self.settings.bearer_token()
        self._http = httpx.Client(transport=transport, **self.settings.client_options())
        self._on_key_refresh = on_key_refresh
        self._key_refresh = (None if on_key_refresh is None
                             else KeyRefresh(retire_previous=retire_previous))
        self._refreshing = threading.Lock()
        self._on_renewed = on_renewed
        self._turns = threading.BoundedSemaphore(MAX_IN_FLIGHT)

    def proxy_client(
        self, pool: str, *, wait: float | None = None, no_queue: bool = False,
        timeout: float | None = 60.0, **options: Any,
    ) -> httpx.Client:
        """An `httpx.Client` whose requests go through pool `pool` in proxy mode
        (SPEC §4.7): give paths relative to the pool's upstream
        (`.post("chat/completions", json=...)`). Each request waits in the
        pool's line up to `wait` seconds (the pool's queue_timeout_ms caps it;
        `no_queue` fails at once when no slot is free), and its slot is given
        back when its answer has been read (or closed, for a stream). A full
        pool answers 429, a wait that ran out 504 `queue_timeout`, an upstream
        that failed 502 or 504. `timeout` is for the upstream's answer, the
        wait comes on top; `options` go to httpx. Use it in a `with` block."""
        return httpx.Client(**{**proxy_options(lambda: self.settings, pool, wait, no_queue,
                                             timeout, self._bearer), **options})

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self.settings.url

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _run(self, program: Op[T], retries: Retries | None = None) -> T:
        if retries is None:
            return drive(program, self._send)  # type: ignore[return-value]
        return drive(program, lambda call: self._send(call, retries))  # type: ignore[return-value]

    def _send(self, call: Call[T], retries: Retries | None = None) -> T:
        if self._key_refresh is not None and self._key_refresh.is_due():
            self._refresh_key_now()
        used = self.settings.api_key
        token = None if self._bearer is None else self._bearer.current()
        try:
            return self._send_as_is(call, retries)
        except Unauthorized as error:
            if self._bearer is not None:
                if not self._bearer.after_refusal(token):
                    raise  # the same token again would be refused again
            else:
                if self._key_refresh is None or not self._key_refresh.retire_previous:
                    raise
                with self._refreshing:  # a refresh under way swaps the key as it ends
                    pass
                if not self._retired_since(error, used):
                    raise
        return self._send_as_is(call, retries)

    def _refresh_key_now(self) -> None:
        """Mint and swap in a successor of the key (see `key_refresh.py`); a
        failure is logged and retried later, the current key still works."""
        assert self._key_refresh is not None and self._on_key_refresh is not None
        if not self._refreshing.acquire(blocking=False):
            return  # another thread is at it; this request goes with the current key
        try:
            if not self._key_refresh.is_due():
                return
            try:
                created = drive(refresh_if_due(self._key_refresh), self._send_as_is)
            except FencepostError as error:
                self._key_refresh.failed(error.retry_after)
                log.warning("fencepost: refreshing the API key failed: %s", error)
                return
            if created is None:
                return
            self._use_key(created.key)
            self._on_key_refresh(created)
        finally:
            self._refreshing.release()

    def _send_as_is(self, call: Call[T], retries: Retries | None = None) -> T:
        sent = time.monotonic()
        policy = retries or self.settings.retries
        result: T
        if not call.retry or policy.attempts <= 1:
            result = self._send_once(call)
        else:
            wait_s = call.wait.remaining_s(sent) if call.wait else 0.0
            retrying = Retrying(**tenacity_options(policy, call, wait_s))
            result = retrying(self._send_once, call)
        if call.renews and self._on_renewed is not None:
            self._on_renewed(sent)
        return result

    def _send_once(self, call: Call[T]) -> T:
        """One HTTP exchange for `call`, not retried. As in `AsyncClient`, at most
        `MAX_IN_FLIGHT` calls that do not wait on the server are sent at once
        (here in the order they come)."""
        limit = turn_limit(call, self.settings.timeout)
        if call.wait is None and not self._turns.acquire(timeout=limit):
            raise waited_too_long(self.url)
        now = time.monotonic()
        timeout = self.settings.timeout_for(call, now)
        try:
            response = self._http.request(
                call.method, call.path, json=call.body_at(now), params=call.params,
                headers=self._headers(call), timeout=timeout,
            )
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.url) from exc
        finally:
            if call.wait is None:
                self._turns.release()
        reply = reply_of(response)
        raise_for_status(reply)
        return call.decode(reply)

    def lock(
        self,
        key: str,
        *,
        ttl: int = 60,
        wait: float = 0,
        operation: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        on_expiry: OnExpiry = "release",
        lock_delay: int = 0,
        shared: bool = False,
        renew_every: float | None = None,
        on_lost: Callable[[LockHold], Any] | None = None,
        raise_on_loss: bool = True,
        token: str | None = None,
    ) -> LockHold:
        """Hold lock `key` for a `with` block: acquire (waiting up to `wait`
        seconds), renew in a background thread every `renew_every` seconds (a
        third of `ttl` by default), release on exit (also on an exception).

        A lost lease sets `hold.lost` and `hold.lost_event` and calls
        `on_lost(hold)` from the renewal thread; a thread cannot be interrupted,
        so call `hold.check()` between steps of work. A block that ends normally
        after its lease was lost raises `LeaseLost` unless `raise_on_loss=False`.
        See `AsyncClient.lock` for the rest (`shared=True` for a reader)."""
        return LockHold(
            self, key, ttl=ttl, wait=wait, operation=operation, metadata=metadata,
            on_expiry=on_expiry, lock_delay=lock_delay, renew_every=renew_every, token=token,
            on_lost=on_lost, shared=shared,
            raise_on_loss=raise_on_loss,
        )

    def lock_many(
        self,
        keys: Sequence[str],
        *,
        ttl: int = 60,
        wait: float = 0,
        operation: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        on_expiry: OnExpiry = "release",
        lock_delay: int = 0,
        shared: bool = False,
        renew_every: float | None = None,
        on_lost: Callable[[LockSetHold], Any] | None = None,
        raise_on_loss: bool = True,
        token: str | None = None,
    ) -> LockSetHold:
        """Hold every lock in `keys` for a `with` block, all or none, renewed in
        background threads with one loss signal; see `AsyncClient.lock_many`."""
        return LockSetHold(
            self, keys, ttl=ttl, wait=wait, operation=operation, metadata=metadata,
            on_expiry=on_expiry, lock_delay=lock_delay, renew_every=renew_every, token=token,
            on_lost=on_lost, shared=shared, raise_on_loss=raise_on_loss,
        )

    def slot(
        self,
        pool: str,
        *,
        wait: float = 0,
        no_queue: bool = False,
        on_lost: Callable[[SlotHold], Any] | None = None,
        raise_on_loss: bool = True,
        cost: int | None = None,
    ) -> SlotHold:
        """Hold a slot of `pool` for a `with` block; see `AsyncClient.slot`."""
        return SlotHold(self, pool, wait=wait, no_queue=no_queue, on_lost=on_lost,
                        raise_on_loss=raise_on_loss, cost=cost)

    def session(
        self,
        *,
        ttl: int = 60,
        name: str | None = None,
        renew_every: float | None = None,
        on_lost: Callable[[SessionHold], Any] | None = None,
        raise_on_loss: bool = True,
    ) -> SessionHold:
        """Hold a session for a `with` block (SPEC §3.10): one heartbeat thread
        (renewing every `renew_every` seconds, a third of `ttl` by default) for
        every lease and slot taken with `session.lock()`, `session.lock_many()`
        and `session.slot()`, which renew nothing of their own. On exit the
        session ends, and with it everything still attached. When the session is
        lost, `session.lost` and every attached hold's `lost` turn True,
        `lost_event` is set and `on_lost(session)` is called."""
        return SessionHold(
            self, ttl=ttl, name=name, renew_every=renew_every, on_lost=on_lost,
            raise_on_loss=raise_on_loss,
        )


class _SyncAcquiring(Holding):
    """Acquiring and releasing, blocking, as every hold does."""

    _client: Client

    def _acquire_now(self) -> Any:
        """Acquire; return the terms. An acquire that failed but may have been
        granted is released at once."""
        sent = time.monotonic()
        try:
            result = self._client._run(self._acquire_op())
        except BaseException as error:
            if self._release_after_failed_acquire() and _maybe_granted(error):
                self._release_quietly()
            raise
        return self._make_terms(result, sent, time.monotonic())

    def _release_quietly(self) -> None:
        try:
            self._client._run(self._release_op(), RELEASE_RETRIES)
        except FencepostError as error:
            report_failure(self._what, error)


class _SyncHold(_SyncAcquiring):
    """The threaded choreography of a hold: acquire, keep alive in a daemon
    thread, and on exit stop the thread before releasing."""

    def _hold_init(self, client: Client) -> None:
        self._client = client
        self._stop = threading.Event()
        self.lost_event = threading.Event()
        """Set when the lease is lost."""
        self._keepers: list[threading.Thread] = []


    def __enter__(self) -> Self:
        results = self._acquire_now()
        self._held = True
        owner = threading.current_thread()
        self._keepers = [
            threading.Thread(
                target=self._keep, args=(terms, owner), name=f"fencepost-keep-{self._what}",
                daemon=True,
            )
            for terms in results
        ]
        for keeper in self._keepers:
            keeper.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()  # from here on, no renewal starts
        for keeper in self._keepers:
            # A renewal already in flight may still land; the release below ends
            # the lease either way (a renewal never revives a released lease).
            keeper.join(timeout=self._client.settings.timeout + 1)
        self._release_quietly()
        self._held = False
        if self._should_raise_on_exit(exc is not None):
            raise self.lost_error()

    def _keep(self, terms: Terms, owner: threading.Thread) -> None:
        program = keep_alive(terms, timeout=self._client.settings.timeout)
        loss = drive(program, self._client._send, stop=self._stop, alive=owner.is_alive)
        if loss is None or self._stop.is_set() or not self._record_loss(loss):
            return
        self.lost_event.set()
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # noqa: BLE001 - a callback's failure must not hide the loss
                log.exception("fencepost: the on_lost callback failed")


def _maybe_granted(error: BaseException) -> bool:
    """Whether a failed acquire may nevertheless have been granted."""
    return isinstance(error, KeyboardInterrupt | TransportError | UnexpectedResponse) or (
        isinstance(error, FencepostError) and error.http_status >= 500
    )


class LockHold(LockFacts, _SyncHold):
    """A lock held by `with client.lock(...)`; see `Client.lock`."""

    def __init__(self, client: Client, key: str, **options: Any) -> None:
        LockFacts.__init__(self, key, **options)
        self._hold_init(client)


class LockSetHold(LockSetFacts, _SyncHold):
    """Locks held by `with client.lock_many(...)`; see `Client.lock_many`."""

    def __init__(self, client: Client, keys: Sequence[str], **options: Any) -> None:
        LockSetFacts.__init__(self, keys, **options)
        self._hold_init(client)


class SlotHold(SlotFacts, _SyncHold):
    """A pool slot held by `with client.slot(...)`; see `Client.slot`."""

    def __init__(self, client: Client, pool: str, **options: Any) -> None:
        SlotFacts.__init__(self, pool, **options)
        self._hold_init(client)


class SessionHold(SessionFacts["AttachedLock", "AttachedLockSet", "AttachedSlot"], _SyncHold):
    """A session held by `with client.session(...)`; see `Client.session`."""

    def __init__(self, client: Client, **options: Any) -> None:
        SessionFacts.__init__(
            self, kinds=AttachedKinds(AttachedLock, AttachedLockSet, AttachedSlot), **options
        )
        self._hold_init(client)


class _SyncAttached(_SyncAcquiring):
    """A hold attached to a session, blocking: acquire, and on exit release;
    nothing runs in between (the session's heartbeat renews it)."""

    def __enter__(self) -> Self:
        self.check()  # a lost session takes nothing more: raise its loss at once
        self._acquire_now()
        self._held = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._release_quietly()
        finally:
            self._held = False
        if self._should_raise_on_exit(exc is not None):
            raise self.lost_error()


class AttachedLock(AttachedLockFacts, _SyncAttached):
    """A lock held by `with session.lock(...)`; see `SessionHold.lock`."""

    def __init__(self, session: SessionHold, key: str, **options: Any) -> None:
        AttachedLockFacts.__init__(self, session, key, **options)
        self._client = session._client


class AttachedSlot(AttachedSlotFacts, _SyncAttached):
    """A slot held by `with session.slot(...)`; see `SessionHold.slot`."""

    def __init__(self, session: SessionHold, pool: str, **options: Any) -> None:
        AttachedSlotFacts.__init__(self, session, pool, **options)
        self._client = session._client


class AttachedLockSet(AttachedLockSetFacts, _SyncAttached):
    """Locks held by `with session.lock_many(...)`; see `SessionHold.lock_many`."""

    def __init__(self, session: SessionHold, keys: Iterable[str], **options: Any) -> None:
        AttachedLockSetFacts.__init__(self, session, keys, **options)
        self._client = session._client
