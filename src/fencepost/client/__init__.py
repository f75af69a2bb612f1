"""The fencepost Python client: `AsyncClient` (asyncio) and `Client` (blocking).

Both are built on one sans-I/O layer: `operations` (each API call as a small
program of requests), `calls` (request values, answer and error decoding),
`keeper` (when to renew a lease and when it is lost) and `retrying` (one retry
policy). The clients only move bytes and run the keeper in a task or a thread.

    import fencepost

    with fencepost.Client() as client:              # FENCEPOST_URL, FENCEPOST_API_KEY
        with client.lock("nightly-report", ttl=60, wait=30) as lock:
            store.write(data, fencing_token=lock.fencing_token)
"""

from fencepost.client.aio import (
    AsyncAttachedLock,
    AsyncAttachedLockSet,
    AsyncAttachedSlot,
    AsyncClient,
    AsyncLockHold,
    AsyncLockSetHold,
    AsyncSessionHold,
    AsyncSlotHold,
)
from fencepost.client.keeper import Loss
from fencepost.client.methods import METHOD_NAMES, Methods
from fencepost.client.models import (
    CreatedKey,
    FenceCheck,
    ForceRelease,
    Health,
    KeyHolder,
    KeyInfo,
    LastHint,
    Learned,
    Lease,
    LeaseRenewal,
    LockInfo,
    LockPage,
    LockSet,
    PoolInfo,
    PoolPage,
    SessionEnd,
    SessionGrant,
    SessionInfo,
    SessionPool,
    SlotGrant,
    SlotHolder,
    SlotRenewal,
    UpstreamInfo,
    Waiter,
    WhoAmI,
)
from fencepost.client.outcome import Outcome, outcome_from_response
from fencepost.client.proxying import Upstream
from fencepost.client.retrying import NO_RETRIES, Retries
from fencepost.client.sync import (
    AttachedLock,
    AttachedLockSet,
    AttachedSlot,
    Client,
    LockHold,
    LockSetHold,
    SessionHold,
    SlotHold,
)
from fencepost.client.transport import DEFAULT_URL, Settings

__all__ = [
    "DEFAULT_URL",
    "METHOD_NAMES",
    "NO_RETRIES",
    "AsyncAttachedLock",
    "AsyncAttachedLockSet",
    "AsyncAttachedSlot",
    "AsyncClient",
    "AsyncSessionHold",
    "AttachedLock",
    "AttachedLockSet",
    "AttachedSlot",
    "AsyncLockHold",
    "AsyncLockSetHold",
    "AsyncSlotHold",
    "Client",
    "CreatedKey",
    "FenceCheck",
    "ForceRelease",
    "Health",
    "KeyHolder",
    "KeyInfo",
    "LastHint",
    "Learned",
    "Lease",
    "LeaseRenewal",
    "LockSet",
    "LockHold",
    "LockSetHold",
    "LockInfo",
    "LockPage",
    "Loss",
    "Methods",
    "Outcome",
    "PoolInfo",
    "Upstream",
    "UpstreamInfo",
    "PoolPage",
    "Retries",
    "SessionEnd",
    "SessionGrant",
    "SessionHold",
    "SessionInfo",
    "SessionPool",
    "Settings",
    "SlotGrant",
    "SlotHold",
    "SlotHolder",
    "SlotRenewal",
    "Waiter",
    "WhoAmI",
    "outcome_from_response",
]
