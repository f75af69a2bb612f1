"""What an inline writer (store/batch.py: a batch on the event loop, for an
in-process database) needs off the loop: the flusher, which answers its
batches once a sync made them durable, and the turn waiter, which waits for
another process's turn at the write lock."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from fencepost.errors import StoreUnavailable
from fencepost.store.background import Background

if TYPE_CHECKING:
    from fencepost.store.batch import InlineEngine, JobResult

_log = logging.getLogger(__name__)


class TurnWaiter(Background):
    """A thread that waits for an inline engine's turn to write, so that the
    event loop does not, and then says so."""

    def __init__(self, engine: InlineEngine, name: str) -> None:
        super().__init__(name)
        self._engine = engine
        self._then: Callable[[], object] | None = None

    def wait(self, then: Callable[[], object]) -> None:
        """Take the turn on the waiter's thread, then call `then` there."""
        with self._ready:
            self._then = then
            self._wake()  # started at the first wait: one process alone never waits

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._then is None and not self._stopping:
                    self._ready.wait()
                if self._then is None:
                    return
                then, self._then = self._then, None
            try:
                self._engine.wait_turn()
            except Exception:  # noqa: BLE001 - the batch then meets the failure itself
                _log.exception("waiting for the turn to write failed")
            try:
                then()
            except RuntimeError:
                self._engine.give_turn()  # the loop is closed: nobody will write


class Flusher(Background):
    """Answers an inline writer's batches once they are durable.

    The batch commits on the event loop without waiting for the disk; this
    thread then makes every commit so far durable with one sync and only
    then settles the callers of all the batches it covered. The loop goes on
    serving (and committing the next batches) meanwhile, and one sync covers
    whatever committed while the last one ran: group commit, with the write
    lock held only while statements run, never across a disk flush."""

    def __init__(
        self,
        sync: Callable[[], None],
        deliver: Callable[[list[JobResult], list[Any]], None],
        name: str,
    ) -> None:
        super().__init__(name)
        self._sync = sync
        self._deliver = deliver
        self._committed: list[tuple[list[JobResult], list[Any]]] = []

    def put(self, outcomes: list[JobResult], events: list[Any]) -> None:
        with self._ready:
            if not self._stopping:
                self._committed.append((outcomes, events))
                self._wake()
                return
        # A read that finished while the store closed: answered here, once synced.
        self._flush([(outcomes, events)])

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._committed and not self._stopping:
                    self._ready.wait()
                if not self._committed:
                    return
                taken, self._committed = self._committed, []
            self._flush(taken)

    def _flush(self, taken: list[tuple[list[JobResult], list[Any]]]) -> None:
        """Sync, then answer everything in `taken` (or fail it, unsynced)."""
        failure: StoreUnavailable | None = None
        try:
            self._sync()
        except StoreUnavailable as exc:
            failure = exc
        except Exception as exc:  # noqa: BLE001 - the thread must survive anything
            _log.exception("making the store durable failed unexpectedly")
            failure = StoreUnavailable(f"The store failed: {exc}.")
        outcomes: list[JobResult] = []
        events: list[Any] = []
        for done, published in taken:
            if failure is None:
                outcomes.extend(done)
                events.extend(published)
            else:
                # Not durable, so not acknowledged: whether it happened is unknown.
                outcomes.extend((job, None, failure) for job, _, _ in done)
        self._deliver(outcomes, events)
