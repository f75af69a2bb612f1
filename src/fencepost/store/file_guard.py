"""Noticing that the SQLite file was deleted, replaced or truncated under us.

A process that has a file open keeps writing into it after the file is
unlinked or renamed over, and SQLite trusts its page cache and WAL index over
a file that shrank behind its back: every write would be acknowledged and then
be gone at the next start. So the store compares what the path names now with
what it opened, after every batch, and once they differ it refuses everything
(503) until it is restarted on a good file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
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


# ioctl(2) FS_IOC_GETFLAGS (_IOR('f', 1, long)) and the flags that forbid
# writing a file whatever its mode (linux/fs.h). The kernel writes an int.
_FS_IOC_GETFLAGS = 0x80086601
_FS_UNWRITABLE = 0x10 | 0x20  # FS_IMMUTABLE_FL, FS_APPEND_FL


class SharedMemoryGuard:
    """The WAL index (`-shm`) is mapped into every process that uses the store,
    and written through the mapping by readers and writers alike. Once the
    file is made immutable or append-only (`chattr +i`), the first write
    through the mapping kills the process with SIGBUS, which no error handling
    can catch. So every batch first asks the file's flags (one ioctl on a
    descriptor kept open) and is refused with 503 while they forbid writing;
    service resumes once they allow it again. The check and the batch's
    writes are not one atomic step: a flag set in the microseconds between
    them still kills the process (decisions.md, "SQLite's shared memory")."""

    def __init__(self, path: str) -> None:
        self._path = path + "-shm"
        self._fd: int | None = None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def unwritable(self) -> bool:
        fd = self._fd
        if fd is None:
            try:
                fd = self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return False  # not made yet: SQLite makes it writable
        try:
            answer = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8))
        except OSError:
            return False  # a filesystem without such flags cannot set them either
        (flags,) = struct.unpack_from("i", answer)
        return bool(flags & _FS_UNWRITABLE)
