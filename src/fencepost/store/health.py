"""Whether the store takes writes, for /readyz: the last write batch's failure,
cleared by a write probe that commits. Cheap to ask: nothing is read or written
per probe request."""

from __future__ import annotations

from fencepost.store.batch import Tx


class WriteHealth:
    def __init__(self) -> None:
        # Written by the writer thread, read on the event loop: plain
        # attributes, each replaced whole, so no lock is needed.
        self.failure: str | None = None
        self.failures = 0  # how many write batches have failed so far

    def failed(self, reason: str) -> None:
        self.failure = reason
        self.failures += 1

    def succeeded(self, failures_before: int) -> None:
        """A write that began after `failures_before` failures committed: clear
        the failure, unless a later batch has failed since."""
        if self.failures == failures_before:
            self.failure = None


def probe_writes(tx: Tx) -> None:
    """A real write (a row changed, so a commit has to reach the disk), without
    which an idle SQLite commit writes nothing and proves nothing."""
    tx.execute(
        "INSERT INTO meta (name, value) VALUES ('write_probe', ?) "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        (str(tx.now_ms),),
    )
