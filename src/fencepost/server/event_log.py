"""The event log: one JSON line per lease granted or ended, lease lost, key or
pool changed, session started, ended or lost, caller refused, and database
changed under a PostgreSQL store (the event hub's subscriber).

Each line has `ts`, `"log": "event"`, `event`, and `request_id`, `project` and
`key_id` of the request that caused it (null for what the reaper did). Never a
secret: key IDs, not keys; no lock tokens, no slot IDs. Lines are written like
the access log's (gathered per loop turn), to `--event-log` or, by default,
standard error beside the access log; the `log` field tells them apart.
"""

from __future__ import annotations

from typing import Any

from fencepost.events import (
    DatabaseChanged,
    Ended,
    Event,
    Granted,
    KeyChanged,
    Lost,
    Origin,
    PoolChanged,
    Refused,
    SessionChanged,
)
from fencepost.server.access_log import AccessLog


def _who(origin: Origin | None, project: str) -> dict[str, Any]:
    if origin is None:
        return {"request_id": None, "project": project, "key_id": None}
    who = {"request_id": origin.request_id, "project": origin.project, "key_id": origin.key_id}
    if origin.app_key_id is not None:
        who["app_key_id"] = origin.app_key_id  # an application acting for its user
    return who


class EventLog:
    def __init__(self, target: str | None) -> None:
        self._lines = AccessLog(target)

    def _write(self, event: str, **fields: Any) -> None:
        self._lines.write(event, log="event", **fields)

    def on_event(self, event: Event) -> None:
        if isinstance(event, Granted):
            if event.kind == "lock":
                self._write("lease.granted", **_who(event.origin, event.project), lock=event.name,
                            fencing_token=event.fencing_token)
            else:
                self._write("slot.granted", **_who(event.origin, event.project), pool=event.name)
        elif isinstance(event, Ended):
            subject = {"lock": event.name} if event.kind == "lock" else {"pool": event.name}
            extra = {"count": event.count} if event.count != 1 else {}
            prefix = "lease" if event.kind == "lock" else "slot"
            self._write(f"{prefix}.{event.reason}", **_who(event.origin, event.project),
                        **subject, held_ms=event.held_ms, **extra)
        elif isinstance(event, Lost):
            self._write("lease.lost", **_who(event.origin, event.project), lock=event.key,
                        code=event.code, reason=event.reason)
        elif isinstance(event, KeyChanged):
            self._write(f"key.{event.action}", **_who(event.origin, event.project),
                        target_key_id=event.key_id, role=event.role)
        elif isinstance(event, PoolChanged):
            self._write(f"pool.{event.action}", **_who(event.origin, event.project),
                        pool=event.pool)
        elif isinstance(event, SessionChanged):
            counts = {"leases": event.leases, "slots": event.slots} if event.action == "ended" \
                else {}
            self._write(f"session.{event.action}", **_who(event.origin, event.project),
                        reason=event.reason, **counts)
        elif isinstance(event, DatabaseChanged):
            self._write(f"store.{event.change}", request_id=None, project=None, key_id=None,
                        before=event.before, after=event.after, tokens_from=event.tokens_from)
        elif isinstance(event, Refused):
            self._write("caller.refused", request_id=event.request_id, project=event.project,
                        key_id=event.key_id, status=event.status, code=event.code,
                        client_ip=event.client_ip,
                        **({"reason": event.token_reason} if event.token_reason else {}))

    @property
    def target(self) -> str | None:
        return self._lines.target

    def reopen(self) -> bool:
        return self._lines.reopen()

    def close(self) -> None:
        self._lines.close()
