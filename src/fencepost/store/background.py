"""A store's helper thread: started when first woken, asleep on a condition
between its jobs, stopped once (the SQLite store's flusher, turn waiter and
checkpointer are each one)."""

from __future__ import annotations

import threading


class Background:
    """Subclasses define `_run`, which waits on `_ready` and returns once
    `_stopping` is set and nothing is left to do."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._ready = threading.Condition(threading.Lock())
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _wake(self) -> None:
        """Start the thread if it is not running yet, and wake it; call with
        `_ready` held. A thread that is never needed is never started."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._ready.notify()

    def stop(self) -> None:
        """Let the thread finish what it holds, and wait for it (at most 10 s)."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=10)

    def _run(self) -> None:
        raise NotImplementedError
