"""The turns a process runs for its drains, so that a stopping worker can hand them over.

A worker told to stop (SIGTERM: Celery's warm shutdown) takes no new drain and waits for its
running tasks. With ``worker_handover_s`` set, once that long has passed it hands over every
turn it still runs: each attempt is stopped as a stalled one is (``StopKind.HANDED_OVER``) —
its partial reply stored, the turn put back at the head of its agent's queue, the lease given
back and the agent nudged — so a worker that runs on continues the turn at once, instead of
after the lease lapses once the stopping worker is killed. From then on a drain of this
process keeps no lease for a next turn, a drain that starts (one the worker received before
it stopped consuming) is sent on to the queue unrun, and a turn claimed anyway (by the final
write of one that ended just then) is handed over as it starts.
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["RunningTurns"]


class _HandsOver(Protocol):
    def hand_over(self, text: str) -> None: ...


class RunningTurns:
    """The running attempts of one ``ThinkJobs`` in this process (its drains' turns)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[_HandsOver] = set()
        self._reason: str | None = None  # set once the process hands its turns over

    @property
    def handing_over(self) -> bool:
        return self._reason is not None

    def add(self, watch: _HandsOver) -> None:
        """An attempt started; one that starts after the handover is handed over at once."""
        with self._lock:
            self._running.add(watch)
            reason = self._reason
        if reason is not None:
            watch.hand_over(reason)

    def discard(self, watch: _HandsOver) -> None:
        with self._lock:
            self._running.discard(watch)

    def hand_over(self, reason: str) -> int:
        """Hand over every running attempt, and every one that starts from now on; returns
        how many were running."""
        with self._lock:
            self._reason = reason
            running = list(self._running)
        for watch in running:
            watch.hand_over(reason)
        return len(running)

    def resume(self) -> None:
        """Run turns to their end again (a worker of this process started)."""
        with self._lock:
            self._reason = None
