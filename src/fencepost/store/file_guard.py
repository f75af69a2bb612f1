"""Noticing that the SQLite file was deleted, replaced or truncated under us.

A process that has a file open keeps writing into it after the file is
unlinked or renamed over, and SQLite trusts its page cache and WAL index over
a file that shrank behind its back: every write would be acknowledged and then
be gone at the next start. So the store compares what the path names now with
what it opened, after every batch, and once they differ it refuses everything
(503) until it is restarted on a good file.
"""

from __future__ import annotations

import logging
import os
import threading

_log = logging.getLogger(__name__)

# The WAL and its index belong to the database: deleting either while the
# server runs loses or splits the committed state just as deleting the file does.
_COMPANIONS = ("", "-wal", "-shm")


class FileGuard:
    def __init__(self, path: str) -> None:
        self.path = path
        self._identity: dict[str, tuple[int, int]] = {}  # suffix -> (st_dev, st_ino)
        self._largest = 0  # the database file's size never falls in WAL mode
        self._lost: str | None = None
        self._lock = threading.Lock()

    @property
    def lost(self) -> str | None:
        """Why the store file can no longer be trusted, once that is so."""
        return self._lost

    def check(self) -> str | None:
        """Compare the files with what was opened (learning each the first time
        it is seen); return why the store is lost, if it is."""
        if self._lost is not None:
            return self._lost
        with self._lock:
            reason = self._compare()
            if reason is not None:
                self._mark(reason)
            return self._lost

    def fail(self, reason: str) -> None:
        """Mark the store lost for `reason` (a write the disk refused)."""
        with self._lock:
            self._mark(reason)

    def _mark(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            # One line in the server's log, once: the operator must act.
            _log.error("store lost: %s; refusing requests until restarted", reason)

    def _compare(self) -> str | None:
        for suffix in _COMPANIONS:
            name = self.path + suffix
            try:
                stat = os.stat(name)
            except FileNotFoundError:
                if suffix == "" or suffix in self._identity:
                    return f"{name} was deleted"
                continue
            identity = (stat.st_dev, stat.st_ino)
            known = self._identity.setdefault(suffix, identity)
            if known != identity:
                return f"{name} was replaced by another file"
            if suffix == "":
                if stat.st_size < self._largest:
                    return f"{name} was truncated ({stat.st_size} bytes, was {self._largest})"
                self._largest = stat.st_size
        return None
