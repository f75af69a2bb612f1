"""`AsyncClient`: the asyncio client, and its `lock()` / `slot()` context managers."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from tenacity import AsyncRetrying

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
from fencepost.client.methods import AsyncRunner, Methods
from fencepost.client.models import LockSet, OnExpiry
from fencepost.client.operations import Op
from fencepost.client.proxying import proxy_options
from fencepost.client.retrying import RELEASE_RETRIES, Retries, tenacity_options
from fencepost.client.sessions import (
    LOCK_SET_WAYS,
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
    async_edge,
    waited_too_long,
)
from fencepost.client.turns import Turns, turn_limit
from fencepost.errors import FencepostError, TransportError, Unauthorized, UnexpectedResponse

T = TypeVar("T")


async def drive(
    program: Op[T], send: Callable[[Call[Any]], Awaitable[Any]],
    alive: Callable[[], bool] | None = None,
) -> T | None:
    """Run a program: make its calls with `send`, sleep its sleeps. Returns None
    (without making another call) once `alive()` turns false."""
    try:
        step = next(program)
        while True:
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                step = program.send(None)
                continue
            if alive is not None and not alive():
                return None
            failure: FencepostError | None = None
            try:
                value = await send(step)
            except FencepostError as error:
                failure = error
            step = program.throw(failure) if failure is not None else program.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()


class AsyncClient(CurrentKey, Methods, AsyncRunner):
    """The asyncio fencepost client.

    `url` and `api_key` default to `FENCEPOST_URL` / `FENCEPOST_API_KEY` (and the
    URL to `http://127.0.0.1:7440`). `timeout` is the per-request read timeout in
    seconds (a waiting acquire adds its wait). `retries` sets how transport
    failures, 5xx and quota refusals are retried. Given a `transport`, the
    client talks through httpx with it (for custom proxies, TLS, or tests), as it
    does when `HTTP_PROXY` and the like apply to the URL; otherwise through its
    own keep-alive connections, which cost far less CPU per request.
    `ca_bundle` (or `FENCEPOST_CA_BUNDLE`) is a PEM file of the authorities to
    trust for an https:// server whose certificate the system does not trust
    (a private CA).
    `on_key_refresh` opts in to refreshing the API key before it expires: once
    two thirds of its life have passed, the client mints a successor
    (`POST /v1/keys/refresh`), uses it from then on, and calls
    `on_key_refresh(created)` (it may be async) so that you can store
    `created.key`, the new secret. With `retire_previous=True` the old key is
    retired as its successor is minted (no old key left working until its
    expiry); a call the old key had in flight that is refused for it is sent
    once more with the new key. `on_renewed(sent)` is called after every
    lease renewal that got through, with the `time.monotonic()` instant its
    first attempt was sent (the lease runs at least its TTL from then).
    `token_file` or `token_command` (or `FENCEPOST_TOKEN_FILE` /
    `FENCEPOST_TOKEN_COMMAND`) sends a JWT from the caller's identity provider
    as the bearer (SPEC §5.1), read again shortly before it expires and when
    the server refuses it (the refused call is then sent once more with the
    new token); with an `api_key` too, the key goes in `X-Api-Key`: an
    application acting for the token's user. Use it with `async with` or call
    `aclose()`.

    Every API call is a coroutine method (`acquire_lock`, `get_lock`, `set_pool`,
    `create_key`, ...; see `fencepost.client.Methods`); `lock()` and `slot()` are
    the ways to hold a lock or slot safely.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        retries: Retries | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
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
        self._edge = async_edge(self.settings, transport)
        self._on_key_refresh = on_key_refresh
        self._key_refresh = (None if on_key_refresh is None
                             else KeyRefresh(retire_previous=retire_previous))
        self._refreshing = asyncio.Lock()
        self._refresher: asyncio.Task[Any] | None = None
        self._on_renewed = on_renewed
        self._turns = Turns(MAX_IN_FLIGHT)

    def proxy_client(
        self, pool: str, *, wait: float | None = None, no_queue: bool = False,
        timeout: float | None = 60.0, **options: Any,
    ) -> httpx.AsyncClient:
        """`Client.proxy_client` for asyncio: an `httpx.AsyncClient` whose
        requests go through pool `pool` in proxy mode (SPEC §4.7)."""
        return httpx.AsyncClient(**{**proxy_options(lambda: self.settings, pool, wait, no_queue,
                                             timeout, self._bearer), **options})

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self.settings.url

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._edge.aclose()

    async def _run(self, program: Op[T], retries: Retries | None = None) -> T:
        if retries is None:
            return await drive(program, self._send)  # type: ignore[return-value]
        return await drive(program, lambda call: self._send(call, retries))  # type: ignore[return-value]

    async def _send(self, call: Call[T], retries: Retries | None = None) -> T:
        if self._key_refresh is not None and self._key_refresh.is_due() \
                and not self._refreshing.locked():
            await self._refresh_key_now()
        used = self.settings.api_key
        token = None
        if self._bearer is not None:
            # Reading may run a command: off the loop, so that renewals go on.
            token = self._bearer.cached
            if token is None or self._bearer.due():
                token = await asyncio.to_thread(self._bearer.current)
        try:
            return await self._send_as_is(call, retries)
        except Unauthorized as error:
            if self._bearer is not None:
                if not await asyncio.to_thread(self._bearer.after_refusal, token):
                    raise  # the same token again would be refused again
            else:
                if self._key_refresh is None or not self._key_refresh.retire_previous:
                    raise
                if self._refresher is not asyncio.current_task():
                    async with self._refreshing:  # a refresh under way swaps the key as it ends
                        pass
                if not self._retired_since(error, used):
                    raise
        return await self._send_as_is(call, retries)

    async def _refresh_key_now(self) -> None:
        """Mint and swap in a successor of the key (see `key_refresh.py`); a
        failure is logged and retried later, the current key still works."""
        assert self._key_refresh is not None and self._on_key_refresh is not None
        async with self._refreshing:
            # The callback below may call the client: it must not wait for itself.
            self._refresher = asyncio.current_task()
            try:
                await self._refresh_key_locked()
            finally:
                self._refresher = None

    async def _refresh_key_locked(self) -> None:
        assert self._key_refresh is not None and self._on_key_refresh is not None
        if not self._key_refresh.is_due():
            return  # another task refreshed meanwhile
        try:
            created = await drive(refresh_if_due(self._key_refresh), self._send_as_is)
        except FencepostError as error:
            self._key_refresh.failed(error.retry_after)
            log.warning("fencepost: refreshing the API key failed: %s", error)
            return
        if created is None:
            return
        self._use_key(created.key)
        outcome = self._on_key_refresh(created)
        if inspect.isawaitable(outcome):
            await outcome

    async def _send_as_is(self, call: Call[T], retries: Retries | None = None) -> T:
        sent = time.monotonic()
        policy = retries or self.settings.retries
        if not call.retry or policy.attempts <= 1:
            result = await self._send_once(call)
        else:
            wait_s = call.wait.remaining_s(sent) if call.wait else 0.0
            retrying = AsyncRetrying(**tenacity_options(policy, call, wait_s))
            result = await retrying(self._send_once, call)
        if call.renews and self._on_renewed is not None:
            self._on_renewed(sent)
        return result

    async def _send_once(self, call: Call[T]) -> T:
        """One HTTP exchange for `call`, not retried. It first waits for one of
        the client's `MAX_IN_FLIGHT` turns (see `turns.py`), except a call that
        may wait on the server, which would hold its turn for the whole wait."""
        if call.wait is None:
            limit = turn_limit(call, self.settings.timeout)
            try:
                await self._turns.take(urgent=call.renews, timeout=limit)
            except TimeoutError:
                raise waited_too_long(self.url) from None
        try:
            reply = await self._edge.send(call, self._headers(call), time.monotonic())
        finally:
            if call.wait is None:
                self._turns.give_back()
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
        on_lost: Callable[[AsyncLockHold], Any] | None = None,
        cancel_on_loss: bool = False,
        raise_on_loss: bool = True,
        token: str | None = None,
    ) -> AsyncLockHold:
        """Hold lock `key` for an `async with` block.

        Acquires it for `ttl` seconds (waiting up to `wait` seconds; 0 fails fast
        with `LockHeld`), renews it every `renew_every` seconds (a third of the TTL
        by default) while the block runs, and releases it when the block exits,
        also on an exception or cancellation. The block gets the hold, with
        `fencing_token`, `expires_at`, `lost`, `lost_event` and `check()`.

        When a renewal is refused (`lease_lost`, `lease_expired`) or no renewal
        gets through before the lease runs out, the lease is lost: `lost` turns
        True, `lost_event` is set, `on_lost(hold)` is called (it may be async),
        and with `cancel_on_loss=True` the block is cancelled and `LeaseLost` is
        raised from it. A block that ends normally after its lease was lost
        raises `LeaseLost` on exit unless `raise_on_loss=False`. With
        `lock_delay` (0..60 s), if the lease ends by expiry or force release
        nobody gets the lock for that long, so this holder's writes in flight
        land before the next holder starts. With `shared=True` the lease is a
        shared (reader) one: readers hold the lock together, a writer waits
        for all of them, and readers arriving behind a waiting writer wait
        behind it.
        """
        return AsyncLockHold(
            self, key, ttl=ttl, wait=wait, operation=operation, metadata=metadata,
            on_expiry=on_expiry, lock_delay=lock_delay, renew_every=renew_every, token=token,
            on_lost=on_lost, shared=shared,
            raise_on_loss=raise_on_loss, cancel_on_loss=cancel_on_loss,
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
        on_lost: Callable[[AsyncLockSetHold], Any] | None = None,
        cancel_on_loss: bool = False,
        raise_on_loss: bool = True,
        token: str | None = None,
    ) -> AsyncLockSetHold:
        """Hold every lock in `keys` (1..32 names) for an `async with` block:
        all are acquired at once or none (waiting in every key's line at once,
        so two blocks never deadlock), each is renewed, and all are released on
        exit. The hold has `fencing_tokens` (one per key), `leases`, and one
        loss signal for the lot: `lost`, `lost_event`, `check()`, `on_lost`
        and `cancel_on_loss` work as for `lock()` when any key is lost."""
        return AsyncLockSetHold(
            self, keys, ttl=ttl, wait=wait, operation=operation, metadata=metadata,
            on_expiry=on_expiry, lock_delay=lock_delay, renew_every=renew_every, token=token,
            on_lost=on_lost, shared=shared,
            raise_on_loss=raise_on_loss, cancel_on_loss=cancel_on_loss,
        )

    def slot(
        self,
        pool: str,
        *,
        wait: float = 0,
        no_queue: bool = False,
        on_lost: Callable[[AsyncSlotHold], Any] | None = None,
        cancel_on_loss: bool = False,
        raise_on_loss: bool = True,
        cost: int | None = None,
    ) -> AsyncSlotHold:
        """Hold a slot of `pool` for an `async with` block: waits up to `wait`
        seconds for one (0 fails fast with `TooManyRequests`), renews it at the
        pool's interval, and releases it on exit with the outcome given to
        `hold.report(...)`. Loss works as for `lock()` (a slot is lost when it is
        reclaimed, deleted, or reaches its request deadline). `cost`: the units
        (tokens) the call will spend of the pool's budget, when the pool has
        one (SPEC §4.6); report what it really spent with `hold.report(cost=...)`."""
        return AsyncSlotHold(
            self, pool, wait=wait, no_queue=no_queue, on_lost=on_lost,
            raise_on_loss=raise_on_loss, cancel_on_loss=cancel_on_loss, cost=cost,
        )

    def session(
        self,
        *,
        ttl: int = 60,
        name: str | None = None,
        renew_every: float | None = None,
        on_lost: Callable[[AsyncSessionHold], Any] | None = None,
        cancel_on_loss: bool = False,
        raise_on_loss: bool = True,
    ) -> AsyncSessionHold:
        """Hold a session for an `async with` block (SPEC §3.10): one heartbeat
        (every `renew_every` seconds, a third of `ttl` by default) for every lease
        and slot taken with `session.lock()`, `session.lock_many()` and
        `session.slot()`, which renew nothing of their own. On exit the session
        ends, and with it everything still attached. Loss works as for `lock()`,
        once for all: when the session is lost (`session_expired`,
        `session_ended`, or no renewal got through in time), `session.lost` and
        every attached hold's `lost` turn True, `lost_event` is set and
        `on_lost(session)` is called."""
        return AsyncSessionHold(
            self, ttl=ttl, name=name, renew_every=renew_every, on_lost=on_lost,
            raise_on_loss=raise_on_loss, cancel_on_loss=cancel_on_loss,
        )


class _AsyncAcquiring(Holding):
    """Acquiring and releasing, with `await`, as every hold does."""

    _client: AsyncClient

    async def _acquire(self) -> Any:
        return await self._client._run(self._acquire_op())

    async def _acquire_now(self) -> Any:
        """Acquire; return the terms. An acquire that failed but may have been
        granted (or whose caller stopped waiting) is released at once."""
        sent = time.monotonic()
        try:
            result = await self._acquire()
        except BaseException as error:
            if self._release_after_failed_acquire() and _maybe_granted(error):
                await self._release_quietly()
            raise
        return self._make_terms(result, sent, time.monotonic())

    async def _release_quietly(self) -> None:
        try:
            await self._client._run(self._release_op(), RELEASE_RETRIES)
        except FencepostError as error:
            report_failure(self._what, error)


class _AsyncHold(_AsyncAcquiring):
    """The asyncio choreography of a hold: acquire, keep alive in a task, and on
    exit stop the keeper before releasing."""

    _cancel_on_loss: bool

    def _hold_init(self, client: AsyncClient, cancel_on_loss: bool) -> None:
        self._client = client
        self._cancel_on_loss = cancel_on_loss
        self._keepers: list[asyncio.Task[None]] = []
        self._owner: asyncio.Task[Any] | None = None
        self._exiting = False
        self._cancelled_owner = False
        self._took_back = False
        self._lost_event: asyncio.Event | None = None

    @property
    def lost_event(self) -> asyncio.Event:
        """Set when the lease is lost; `await hold.lost_event.wait()`."""
        if self._lost_event is None:
            self._lost_event = asyncio.Event()
        return self._lost_event

    async def __aenter__(self) -> Self:
        self._owner = asyncio.current_task()
        self.lost_event  # noqa: B018 - create the event on the running loop
        results = await self._acquire_now()
        self._held = True
        self._keepers = [
            asyncio.create_task(self._keep(terms), name=f"fencepost-keep-{self._what}")
            for terms in results
        ]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exiting = True  # from here on a loss never cancels the owner
        finishing = asyncio.ensure_future(self._finish())
        try:
            while True:
                try:
                    await asyncio.shield(finishing)  # cancelled or not, the release goes on
                    break
                except asyncio.CancelledError:
                    # Our own cancel_on_loss request may arrive only now (the body had
                    # no await left); any other cancellation is the caller's.
                    only_ours = self._owner_cancel_requests() == 1 and self._cancelled_owner
                    self._take_back_cancellation()
                    if not only_ours:
                        raise
        finally:
            self._held = False
        self._take_back_cancellation()
        external_cancel = self._owner_cancel_requests() > 0
        if self._took_back and isinstance(exc, asyncio.CancelledError) and not external_cancel:
            raise self.lost_error() from None
        if self._should_raise_on_exit(exc is not None):
            raise self.lost_error()

    def _owner_cancel_requests(self) -> int:
        return self._owner.cancelling() if self._owner is not None else 0

    async def _finish(self) -> None:
        for keeper in self._keepers:
            keeper.cancel()
        if self._keepers:
            await asyncio.wait(self._keepers)
        await self._release_quietly()

    def _take_back_cancellation(self) -> None:
        if self._cancelled_owner and self._owner is not None:
            self._cancelled_owner = False
            self._took_back = True
            self._owner.uncancel()

    async def _keep(self, terms: Terms) -> None:
        owner = self._owner
        program = keep_alive(terms, timeout=self._client.settings.timeout)
        loss = await drive(
            program, self._client._send, alive=lambda: owner is None or not owner.done()
        )
        if loss is None or self._exiting or not self._record_loss(loss):
            return
        self.lost_event.set()
        if self._cancel_on_loss and owner is not None and not owner.done():
            self._cancelled_owner = True
            owner.cancel(f"fencepost: the {self._what} was lost ({loss.reason})")
        if self._on_lost is not None:
            try:
                outcome = self._on_lost(self)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:  # noqa: BLE001 - a callback's failure must not hide the loss
                log.exception("fencepost: the on_lost callback failed")


def _maybe_granted(error: BaseException) -> bool:
    """Whether a failed acquire may nevertheless have been granted (its answer was
    lost, or the caller stopped waiting for it)."""
    return isinstance(error, asyncio.CancelledError | TransportError | UnexpectedResponse) or (
        isinstance(error, FencepostError) and error.http_status >= 500
    )


class AsyncLockHold(LockFacts, _AsyncHold):
    """A lock held by `async with client.lock(...)`; see `AsyncClient.lock`."""

    def __init__(self, client: AsyncClient, key: str, *, cancel_on_loss: bool,
                 **options: Any) -> None:
        LockFacts.__init__(self, key, **options)
        self._hold_init(client, cancel_on_loss)


class AsyncLockSetHold(LockSetFacts, _AsyncHold):
    """Locks held by `async with client.lock_many(...)`; see `AsyncClient.lock_many`."""

    def __init__(self, client: AsyncClient, keys: Sequence[str], *, cancel_on_loss: bool,
                 **options: Any) -> None:
        LockSetFacts.__init__(self, keys, **options)
        self._hold_init(client, cancel_on_loss)


class AsyncSlotHold(SlotFacts, _AsyncHold):
    """A pool slot held by `async with client.slot(...)`; see `AsyncClient.slot`."""

    def __init__(self, client: AsyncClient, pool: str, *, cancel_on_loss: bool,
                 **options: Any) -> None:
        SlotFacts.__init__(self, pool, **options)
        self._hold_init(client, cancel_on_loss)


class AsyncSessionHold(
    SessionFacts["AsyncAttachedLock", "AsyncAttachedLockSet", "AsyncAttachedSlot"], _AsyncHold
):
    """A session held by `async with client.session(...)`; see `AsyncClient.session`."""

    def __init__(self, client: AsyncClient, *, cancel_on_loss: bool, **options: Any) -> None:
        kinds = AttachedKinds(AsyncAttachedLock, AsyncAttachedLockSet, AsyncAttachedSlot)
        SessionFacts.__init__(self, kinds=kinds, **options)
        self._hold_init(client, cancel_on_loss)


class _AsyncAttached(_AsyncAcquiring):
    """The asyncio choreography of a hold attached to a session: acquire, and on
    exit release; nothing runs in between (the session's heartbeat renews it)."""

    async def __aenter__(self) -> Self:
        self.check()  # a lost session takes nothing more: raise its loss at once
        await self._acquire_now()
        self._held = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await asyncio.shield(self._release_quietly())
        finally:
            self._held = False
        if self._should_raise_on_exit(exc is not None):
            raise self.lost_error()

class AsyncAttachedLock(AttachedLockFacts, _AsyncAttached):
    """A lock held by `async with session.lock(...)`; see `AsyncSessionHold.lock`."""

    def __init__(self, session: AsyncSessionHold, key: str, **options: Any) -> None:
        AttachedLockFacts.__init__(self, session, key, **options)
        self._client = session._client


class AsyncAttachedSlot(AttachedSlotFacts, _AsyncAttached):
    """A slot held by `async with session.slot(...)`; see `AsyncSessionHold.slot`."""

    def __init__(self, session: AsyncSessionHold, pool: str, **options: Any) -> None:
        AttachedSlotFacts.__init__(self, session, pool, **options)
        self._client = session._client


class AsyncAttachedLockSet(AttachedLockSetFacts, _AsyncAttached):
    """Locks held by `async with session.lock_many(...)`; see `AsyncSessionHold.lock_many`."""

    def __init__(self, session: AsyncSessionHold, keys: Iterable[str], **options: Any) -> None:
        AttachedLockSetFacts.__init__(self, session, keys, **options)
        self._client = session._client

    async def _acquire(self) -> LockSet:
        """Every share at once (see `AttachedLockSetFacts.shares`); all or none."""
        shares = self.shares(LOCK_SET_WAYS)
        results = await asyncio.gather(
            *(self._client._run(self.acquire_share(share)) for share in shares),
            return_exceptions=True,
        )
        taken = [r.leases for r in results if isinstance(r, LockSet)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # each failed share released its own; release the others'
            await self._release_shares([[lease.key for lease in share] for share in taken])
            raise failed[0]
        return LockSet(leases=[lease for share in taken for lease in share],
                       lock_token=self.token)

    async def _release_quietly(self) -> None:
        await self._release_shares(self.shares(LOCK_SET_WAYS))

    async def _release_shares(self, shares: list[list[str]]) -> None:
        results = await asyncio.gather(
            *(self._client._run(self.release_share(share), RELEASE_RETRIES) for share in shares),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, FencepostError):
                report_failure(self._what, result)
