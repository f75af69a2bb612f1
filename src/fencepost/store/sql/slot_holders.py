"""Who holds a pool's slots (SPEC §4.1 `GET /v1/pools/{pool}/slots`).

The key that asked for a slot is stamped on its row in the same transaction
that admitted it, so admission itself (pools.py) needs to know nothing of it.
Readers see only a prefix of each slot id: the whole id is its holder's
capability to renew and release the slot.
"""

from __future__ import annotations

from fencepost.errors import NotFound
from fencepost.store.base import KeyRef, SlotAttempt, SlotHolderView
from fencepost.store.batch import Refused, Tx, refused_before_writing
from fencepost.store.sql import pools
from fencepost.store.sql.rows import HOLDER_NAME, names_of

# "slot_" and 8 of the 32 random characters: enough to tell slots apart in a
# listing, far too few to guess the rest (the id carries 192 random bits).
SLOT_ID_PREFIX_CHARS = 13


def slot_id_prefix(slot_id: str) -> str:
    return slot_id[:SLOT_ID_PREFIX_CHARS]


def stamp_holder(
    tx: Tx, attempt: SlotAttempt | Refused, key_id: str | None
) -> SlotAttempt | Refused:
    """Record which key took the slot the attempt admitted, if it admitted one."""
    if isinstance(attempt, Refused):
        return attempt
    if attempt.slot is not None and key_id is not None:
        tx.execute("UPDATE slots SET key_id = ? WHERE slot_id = ?", (key_id, attempt.slot.slot_id))
    return attempt


def list_slots(tx: Tx, project: str, pool: str) -> list[SlotHolderView] | Refused:
    """The pool's live slots, oldest first (by the store's clock); an unknown
    pool is Refused (a read writes nothing)."""
    missing = refused_before_writing(lambda: pools.require(tx, project, pool), NotFound)
    if isinstance(missing, Refused):
        return missing
    rows = tx.execute(
        f"SELECT s.slot_id, s.key_id, {HOLDER_NAME}, s.acquired_ms, s.lease_deadline_ms, "
        f"s.request_deadline_ms FROM slots s {names_of('s')} "
        "WHERE s.project = ? AND s.pool = ? AND s.lease_deadline_ms > ? "
        "ORDER BY s.acquired_ms, s.slot_id",
        (project, pool, tx.now_ms),
    ).fetchall()
    return [
        SlotHolderView(slot_id_prefix(slot_id), KeyRef(key_id, key_name), acquired_ms,
                       lease_deadline_ms, request_deadline_ms)
        for slot_id, key_id, key_name, acquired_ms, lease_deadline_ms, request_deadline_ms
        in rows
    ]
