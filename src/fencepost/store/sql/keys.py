"""Project and API key statements (portable SQL, `?` placeholders)."""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from typing import Any, NamedTuple

from fencepost.core.keys import (
    Role,
    granted_lifetime_ms,
    hash_secret,
    new_key_id,
    new_secret,
    same_hash,
    successor_lifetime_ms,
)
from fencepost.core.quota import RateGate
from fencepost.errors import (
    Conflict,
    Forbidden,
    NotFound,
    QuotaExceeded,
    Unauthorized,
    ValidationError,
)
from fencepost.events import KeyChanged
from fencepost.store.base import KeyRecord, NewKey
from fencepost.store.batch import Refused, Tx
from fencepost.store.sql.rows import columns


class _KeyRow(NamedTuple):
    """An `api_keys` row's columns (see rows.py)."""

    id: str
    project: str
    role: str
    name: str | None
    secret_hash: str
    created_ms: int
    expires_ms: int | None
    allow_ips: str  # a JSON array
    rpm_quota: int | None
    revoked_ms: int | None
    parent_id: str | None
    root_id: str | None
    granted_lifetime_ms: int | None
    retired_ms: int | None


_KEY_COLUMNS = columns(_KeyRow)


def _key_record(row: Any) -> KeyRecord:
    r = _KeyRow._make(row)
    return KeyRecord(
        id=r.id,
        project=r.project,
        role=Role.parse(r.role),
        name=r.name,
        secret_hash=r.secret_hash,
        created_ms=r.created_ms,
        expires_ms=r.expires_ms,
        allow_ips=list(json.loads(r.allow_ips)),
        rpm_quota=r.rpm_quota,
        revoked_ms=r.revoked_ms,
        parent_id=r.parent_id,
        root_id=r.root_id,
        granted_lifetime_ms=r.granted_lifetime_ms,
        retired_ms=r.retired_ms,
    )


def load_pepper(tx: Tx) -> str:
    """The store-wide key for secret hashes, created by whichever server starts first."""
    tx.execute(
        "INSERT INTO meta (name, value) VALUES ('key_pepper', ?) ON CONFLICT (name) DO NOTHING",
        (secrets.token_hex(32),),
    )
    (pepper,) = tx.execute("SELECT value FROM meta WHERE name = 'key_pepper'").fetchone()
    return str(pepper)


def insert_key(tx: Tx, pepper: bytes, project: str, new: NewKey, secret: str) -> KeyRecord:
    """A key an admin (or bootstrap) creates: the first of its refresh chain."""
    return _insert(tx, _new_record(tx, pepper, project, new, secret, new.expires_in_ms))


def _new_record(
    tx: Tx, pepper: bytes, project: str, new: NewKey, secret: str, granted_ms: int | None,
    parent: KeyRecord | None = None,
) -> KeyRecord:
    return KeyRecord(
        id=new_key_id(),
        project=project,
        role=new.role,
        name=new.name,
        secret_hash=hash_secret(secret, pepper),
        created_ms=tx.now_ms,
        expires_ms=None if new.expires_in_ms is None else tx.now_ms + new.expires_in_ms,
        allow_ips=list(new.allow_ips),
        rpm_quota=new.rpm_quota,
        revoked_ms=None,
        parent_id=None if parent is None else parent.id,
        root_id=None if parent is None else (parent.root_id or parent.id),
        granted_lifetime_ms=granted_ms,
    )


def _insert(tx: Tx, record: KeyRecord) -> KeyRecord:
    tx.execute(
        f"INSERT INTO api_keys ({_KEY_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.id, record.project, record.role.label, record.name, record.secret_hash,
            record.created_ms, record.expires_ms, json.dumps(record.allow_ips),
            record.rpm_quota, None, record.parent_id, record.root_id,
            record.granted_lifetime_ms, None,
        ),
    )
    tx.events.append(
        KeyChanged("created", record.project, record.id, record.role.label, tx.origin)
    )
    return record


# A key's lineage (its first key and every key refreshed from it, SPEC §5)
# mints at most one successor in this long: a key that refreshes itself in a
# loop fills the table otherwise, and so would its successors each refreshing
# at once if the bound were per key.
REFRESH_EVERY_MS = 60_000


def refresh_key(
    tx: Tx, pepper: bytes, key_id: str, expires_in_ms: int | None, secret: str,
    retire_previous: bool = False,
) -> KeyRecord | Refused:
    """Mint the successor of `key_id` (SPEC §5), decided on the row as it is
    now: a key revoked, retired or expired a moment ago (still trusted by a
    replica's cache) cannot refresh, and a refresh and a revocation or
    retirement never interleave. With `retire_previous`, `key_id` is retired
    in the same transaction: never a moment with both keys working, or none."""
    row = tx.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    caller = None if row is None else _key_record(row)
    if caller is None or caller.ended:
        raise Unauthorized("The API key is unknown, revoked or retired.")
    if caller.expires_ms is not None and tx.now_ms >= caller.expires_ms:
        raise Unauthorized("The API key has expired.")
    granted = granted_lifetime_ms(caller.granted_lifetime_ms, caller.created_ms, caller.expires_ms)
    own = None if caller.expires_ms is None else caller.expires_ms - caller.created_ms
    try:
        lifetime = successor_lifetime_ms(expires_in_ms, own, granted)
    except ValueError as exc:
        raise ValidationError([{"field": "expires_in_seconds", "message": str(exc)}]) from None
    (last,) = tx.execute(
        "SELECT max(created_ms) FROM api_keys WHERE root_id = ?", (caller.root_id or caller.id,)
    ).fetchone()
    if last is not None and tx.now_ms - int(last) < REFRESH_EVERY_MS:
        wait_ms = int(last) + REFRESH_EVERY_MS - tx.now_ms
        return Refused(QuotaExceeded(
            f"A key and the keys refreshed from the same first key refresh at most once "
            f"a minute together; this one may again in "
            f"{(wait_ms + 999) // 1000} s.", retry_after_ms=wait_ms,
        ))
    new = NewKey(caller.role, caller.name, lifetime, list(caller.allow_ips), caller.rpm_quota)
    successor = _insert(tx, _new_record(tx, pepper, caller.project, new, secret, granted, caller))
    if retire_previous:
        retire_key(tx, caller.project, caller.id, caller.id, False)
    return successor


def bootstrap(tx: Tx, pepper: bytes, secret: str | None) -> str | None:
    # Contract: a store that already has any key is left untouched, so restarts
    # (and replicas starting together) never mint a second bootstrap key.
    if tx.execute("SELECT 1 FROM api_keys LIMIT 1").fetchone():
        return None
    tx.execute(
        "INSERT INTO projects (name, created_ms) VALUES ('default', ?) "
        "ON CONFLICT (name) DO NOTHING",
        (tx.now_ms,),
    )
    chosen = secret or new_secret()
    insert_key(tx, pepper, "default", NewKey(Role.ADMIN, name="bootstrap"), chosen)
    return chosen


def create_project(tx: Tx, pepper: bytes, name: str) -> str:
    created = tx.execute(
        "INSERT INTO projects (name, created_ms) VALUES (?, ?) "
        "ON CONFLICT (name) DO NOTHING RETURNING name",
        (name, tx.now_ms),
    ).fetchone()
    if created is None:
        raise Conflict(f"Project {name!r} already exists.")
    secret = new_secret()
    insert_key(tx, pepper, name, NewKey(Role.ADMIN, name="first admin"), secret)
    return secret


# What a recovered admin key is called in listings: the project's admins can
# tell it from the keys they made, and retire it once they have theirs back.
RECOVERED_ADMIN_NAME = "recovered admin"


def recover_admin_key(tx: Tx, pepper: bytes, project: str, secret: str) -> KeyRecord:
    """A new admin key of an existing project (NotFound otherwise)."""
    if tx.execute("SELECT 1 FROM projects WHERE name = ?", (project,)).fetchone() is None:
        raise NotFound(f"No project {project!r} in this store.")
    return insert_key(tx, pepper, project, NewKey(Role.ADMIN, name=RECOVERED_ADMIN_NAME), secret)


def list_keys(
    tx: Tx, project: str, after: str | None = None, limit: int | None = None
) -> list[KeyRecord]:
    """The project's keys in the order they were made; from the one after the
    key `after` (none when `after` is not one of the project's), at most `limit`."""
    sql = f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE project = ?"
    params: list[Any] = [project]
    if after is not None:
        sql += (" AND (created_ms, id) > "
                "(SELECT created_ms, id FROM api_keys WHERE project = ? AND id = ?)")
        params += [project, after]
    sql += " ORDER BY created_ms, id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [_key_record(row) for row in tx.execute(sql, tuple(params)).fetchall()]


def revoke_key(tx: Tx, project: str, key_id: str) -> bool:
    """Revoke the key and every successor minted from it (a leaked key cannot
    outlive its revocation by refreshing itself); False when there is no such key."""
    # Contract: scoped by project, so one project can never revoke another's
    # key; revoking twice keeps the first revocation time.
    cur = tx.execute(
        "UPDATE api_keys SET revoked_ms = COALESCE(revoked_ms, ?) WHERE id = ? AND project = ?",
        (tx.now_ms, key_id, project),
    )
    if cur.rowcount == 0:
        return False
    tx.events.append(KeyChanged("revoked", project, key_id, None, tx.origin))
    # Every key minted from it by refresh goes too (SPEC §5): a leaked key
    # cannot outlive its revocation by refreshing itself.
    tx.execute(
        "WITH RECURSIVE chain (id) AS ("
        "SELECT id FROM api_keys WHERE parent_id = ? "
        "UNION SELECT k.id FROM api_keys k JOIN chain c ON k.parent_id = c.id) "
        "UPDATE api_keys SET revoked_ms = COALESCE(revoked_ms, ?) "
        "WHERE id IN (SELECT id FROM chain)",
        (key_id, tx.now_ms),
    )
    return True


def retire_key(
    tx: Tx, project: str, key_id: str, by_key_id: str, by_admin: bool
) -> KeyRecord | Refused | None:
    """Retire the key (SPEC §5): it stops working, the keys refreshed from it
    do not (a planned rotation; revoke_key is for a leak). Only an admin of
    the project or the key itself may (else Refused: Forbidden, before
    anything is written). Idempotent: the first retirement's time is kept,
    and a revoked key stays revoked. None when the project has no such key."""
    # Contract: scoped by project, so one project can never retire another's key.
    row = tx.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ? AND project = ?",
                     (key_id, project)).fetchone()
    if row is None:
        return None
    if not by_admin and by_key_id != key_id:
        return Refused(Forbidden(
            "Only an admin of the project, or the key itself, may retire a key."))
    record = _key_record(row)
    if record.ended:
        return record  # retired before (the first time is kept), or revoked
    tx.execute("UPDATE api_keys SET retired_ms = ? WHERE id = ?", (tx.now_ms, key_id))
    tx.events.append(KeyChanged("retired", project, key_id, None, tx.origin))
    return replace(record, retired_ms=tx.now_ms)


def find_key(tx: Tx, secret_hash: str) -> KeyRecord | None:
    row = tx.execute(
        f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE secret_hash = ?", (secret_hash,)
    ).fetchone()
    record = None if row is None else _key_record(row)
    if record is None or not same_hash(record.secret_hash, secret_hash):
        return None
    return record


def admit_request(tx: Tx, key_id: str, per_minute: int) -> int | None:
    """Count one request against the key's quota: None when admitted, else the
    milliseconds until one would be. The state is in the store, so every
    replica counts against the same quota."""
    row = tx.execute(
        "SELECT theoretical_arrival_ms FROM key_quota WHERE key_id = ?", (key_id,)
    ).fetchone()
    arrival_ms = 0.0
    if row is not None:
        (arrival_ms,) = row
    gate = RateGate(per_minute, float(arrival_ms))
    wait_ms = gate.admit(tx.now_ms)
    if wait_ms is None:
        tx.execute(
            "INSERT INTO key_quota (key_id, theoretical_arrival_ms) VALUES (?, ?) "
            "ON CONFLICT (key_id) DO UPDATE SET "
            "theoretical_arrival_ms = excluded.theoretical_arrival_ms",
            (key_id, gate.theoretical_arrival_ms),
        )
    return wait_ms


def project_exists(tx: Tx, project: str) -> bool:
    return tx.execute("SELECT 1 FROM projects WHERE name = ?", (project,)).fetchone() is not None


# A caller from an identity provider not seen for this long is forgotten: longer
# than any lease it could hold (90 days), so a holder's name outlives the lease.
IDENTITY_RETENTION_MS = 100 * 86_400_000
# The most forgotten callers one note deletes (the rest go with later notes).
_FORGET_AT_ONCE = 100


def note_identity(
    tx: Tx, project: str, caller_id: str, name: str | None, app_key_id: str | None
) -> None:
    """Remember the name of a caller from an identity provider (SPEC §5.1), and
    forget a few that have not been seen for IDENTITY_RETENTION_MS, so that
    the table grows with callers, not with time."""
    tx.execute(
        "INSERT INTO identities (project, id, name, app_key_id, seen_ms) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (project, id) DO UPDATE SET name = excluded.name, "
        "app_key_id = excluded.app_key_id, seen_ms = excluded.seen_ms",
        (project, caller_id, name, app_key_id, tx.now_ms),
    )
    tx.execute(
        "DELETE FROM identities WHERE (project, id) IN (SELECT project, id FROM identities "
        "WHERE seen_ms < ? ORDER BY seen_ms LIMIT ?)",
        (tx.now_ms - IDENTITY_RETENTION_MS, _FORGET_AT_ONCE),
    )
