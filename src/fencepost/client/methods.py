"""One list of API methods for both clients.

Each method is an `operation` descriptor over a program from `operations.py`.
Read from an `AsyncClient` it is a coroutine function; read from a `Client` it
is a plain function. Signatures and docstrings come from the program, so the
two clients have the same methods by construction.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar, overload

from fencepost.client import operations as ops
from fencepost.client.operations import Op

P = ParamSpec("P")
T = TypeVar("T")


class AsyncRunner:
    """Base of clients that run programs with `await`."""

    async def _run(self, program: Op[T]) -> T:
        raise NotImplementedError


class SyncRunner:
    """Base of clients that run programs by blocking."""

    def _run(self, program: Op[T]) -> T:
        raise NotImplementedError


class operation(Generic[P, T]):  # noqa: N801 - used like a decorator
    """A client method made from a program factory `build`."""

    def __init__(self, build: Callable[P, Op[T]]) -> None:
        self.build = build
        functools.update_wrapper(self, build)  # type: ignore[arg-type]
        self.signature = _result_signature(build)

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> operation[P, T]: ...

    @overload
    def __get__(
        self, obj: AsyncRunner, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, obj: SyncRunner, owner: type[Any]) -> Callable[P, T]: ...

    def __get__(self, obj: object, owner: type[Any]) -> Any:
        if obj is None:
            return self
        build = self.build
        if isinstance(obj, AsyncRunner):
            runner_async = obj

            @functools.wraps(build)
            async def call_async(*args: P.args, **kwargs: P.kwargs) -> T:
                return await runner_async._run(build(*args, **kwargs))

            call_async.__signature__ = self.signature  # type: ignore[attr-defined]
            return call_async
        if isinstance(obj, SyncRunner):
            runner_sync = obj

            @functools.wraps(build)
            def call_sync(*args: P.args, **kwargs: P.kwargs) -> T:
                return runner_sync._run(build(*args, **kwargs))

            call_sync.__signature__ = self.signature  # type: ignore[attr-defined]
            return call_sync
        raise TypeError(f"{type(obj).__name__} is not a fencepost client")


def _result_signature(build: Callable[..., Any]) -> inspect.Signature:
    """`build`'s signature, returning what its program returns (`Op[X]` -> `X`)."""
    signature = inspect.signature(build)
    returns = signature.return_annotation
    if isinstance(returns, str) and returns.startswith("Op[") and returns.endswith("]"):
        returns = returns[3:-1]
    return signature.replace(return_annotation=returns)


class Methods:
    """Every API call of SPEC §3–§5, shared by `AsyncClient` and `Client`."""

    # locks
    acquire_lock = operation(ops.acquire_lock)
    acquire_lock_set = operation(ops.acquire_lock_set)
    renew_lock = operation(ops.renew_lock)
    release_lock = operation(ops.release_lock)
    get_lock = operation(ops.get_lock)
    list_locks = operation(ops.list_locks)
    force_release = operation(ops.force_release)
    fence_check = operation(ops.fence_check)
    # pools
    set_pool = operation(ops.set_pool)
    update_pool = operation(ops.update_pool)
    get_pool = operation(ops.get_pool)
    list_pools = operation(ops.list_pools)
    list_slots = operation(ops.list_slots)
    delete_pool = operation(ops.delete_pool)
    acquire_slot = operation(ops.acquire_slot)
    renew_slot = operation(ops.renew_slot)
    release_slot = operation(ops.release_slot)
    # sessions
    create_session = operation(ops.create_session)
    renew_session = operation(ops.renew_session)
    end_session = operation(ops.end_session)
    get_session = operation(ops.get_session)
    # keys and identity
    create_key = operation(ops.create_key)
    list_keys = operation(ops.list_keys)
    revoke_key = operation(ops.revoke_key)
    retire_key = operation(ops.retire_key)
    refresh_key = operation(ops.refresh_key)
    whoami = operation(ops.whoami)
    health = operation(ops.health)


METHOD_NAMES = tuple(name for name, value in vars(Methods).items() if isinstance(value, operation))
