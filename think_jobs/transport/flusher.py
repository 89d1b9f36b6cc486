"""The one thread per process that sends the stream chunks writers hold back.

A ``StreamWriter`` with a flush window (``stream_flush_window_ms``) sends a chunk at once
unless it sent something less than a window ago; then it holds the chunk, to go out with those
that follow in one append. Its own thread sends what it holds with its next chunk once the
window has passed; should the model pause instead, this thread sends it when the window ends,
so a held chunk never waits for a further one. One thread serves every writer of the process
(a worker may run a thousand turns at once): it sleeps on a condition until the earliest
deadline, so it costs nothing while no chunk is held, and it is started by the first writer
that holds a chunk, in the process that writes (a forked child never inherits it: it makes
its own). It is a daemon: it never keeps a process alive.

It never waits for a writer: one whose lock is taken (its own thread is sending, and its send
carries what is held) is looked at again a moment later. It sends only through the writer,
which asks the lease (``may_send``) first and respects its back-off after a failed send.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Protocol

from think_jobs.transport.per_process import PerProcess

log = logging.getLogger(__name__)


class Holder(Protocol):
    def flush_held(self) -> float | None:
        """Send what is held if its deadline has passed; when to look again (None: never)."""
        ...


class StreamFlusher:
    """Calls ``flush_held()`` of each scheduled writer once its deadline has passed."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._due: list[tuple[float, int, Holder]] = []  # a heap by deadline
        self._order = itertools.count()  # breaks ties: writers are not comparable
        self._thread: threading.Thread | None = None

    def schedule(self, writer: Holder, at: float) -> None:
        """Have ``writer.flush_held()`` called at ``at`` (monotonic seconds), or just after."""
        with self._changed:
            earliest = not self._due or at < self._due[0][0]
            heapq.heappush(self._due, (at, next(self._order), writer))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="think-jobs-stream-flusher", daemon=True
                )
                self._thread.start()
            elif earliest:
                self._changed.notify()

    def _loop(self) -> None:
        while True:
            for writer in self._wait_for_due():
                again = _flush(writer)
                if again is not None:
                    self.schedule(writer, again)

    def _wait_for_due(self) -> list[Holder]:
        with self._changed:
            while True:
                now = time.monotonic()
                if self._due and self._due[0][0] <= now:
                    return self._pop_due(now)
                self._changed.wait(self._due[0][0] - now if self._due else None)

    def _pop_due(self, now: float) -> list[Holder]:
        due: list[Holder] = []
        while self._due and self._due[0][0] <= now:
            due.append(heapq.heappop(self._due)[2])
        return due


def _flush(writer: Holder) -> float | None:
    try:
        return writer.flush_held()
    except Exception:  # a bug in one writer must not stop the others' chunks
        log.exception("stream flusher: a writer failed to send its held chunks")
        return None


_THIS_PROCESS: PerProcess[StreamFlusher] = PerProcess(StreamFlusher)


def process_flusher() -> StreamFlusher:
    """The flusher of this process."""
    return _THIS_PROCESS.get()
