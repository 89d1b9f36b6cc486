"""Decides when a running attempt must stop, and keeps its lease alive while it runs.

Two daemon threads per running attempt, so that nothing can hold up the lease:

- the **heartbeat** (database only) renews the lease every ``lease_ttl_s / 3`` through the
  fence and reads the turn's status in the same transaction (a ``cancel_submission`` that
  found Redis down is seen there). A Redis call never sits in front of it, so losing Redis
  alone never costs an attempt its lease while the database answers;
- the **signals** thread, every ``cancel_poll_interval_s``: the caller's in-process signal,
  the stall timeout, the lease's local bound (an attempt that could not renew in time stops
  before anyone else may take the turn), and the Redis revocation flag (also read with every
  published chunk).

Whichever fires first aborts the turn's own signal, which the runner checks between chunks
and the model may wait on. After ``close()`` nothing the threads see changes the watch.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Literal

import redis

from think_jobs.db.turns import TurnRecord
from think_jobs.errors import StorageUnavailableError
from think_jobs.lease import Lease, LeaseLost
from think_jobs.signals import AbortController, AbortSignal, SignalLike, signal_reason

log = logging.getLogger(__name__)

StopKind = Literal["cancelled", "signal", "stalled", "lease_lost"]
INTERRUPTIONS: frozenset[StopKind] = frozenset({"stalled", "lease_lost"})  # the turn goes on


@dataclass(frozen=True)
class StopReason:
    kind: StopKind
    text: str | None

    @property
    def interrupts(self) -> bool:
        """The attempt stops but the turn is not over: another attempt continues it."""
        return self.kind in INTERRUPTIONS


@dataclass(frozen=True)
class WatchTimings:
    heartbeat_s: float
    poll_s: float


@dataclass(frozen=True)
class Revocation:
    """Where the attempt's revocation flag lives."""

    client: redis.Redis
    key: str

    def reason(self) -> str | bool | None:
        """The cancel reason if the flag is set (``""`` read as None), False if not set."""
        value = self.client.get(self.key)
        if value is None:
            return False
        text = value.decode() if isinstance(value, bytes) else str(value)
        return text or None


class TurnWatch:
    """``start()`` it when the attempt starts, ``close()`` it when the attempt's writes are done."""

    def __init__(
        self,
        lease: Lease,
        turn: TurnRecord,
        *,
        revocation: Revocation,
        timings: WatchTimings,
        signal: SignalLike | None = None,
        stall_timeout_s: float | None = None,
    ) -> None:
        self._lease = lease
        self._turn = turn
        self._revocation = revocation
        self._timings = timings
        self._local = signal
        self.stall_timeout_s = stall_timeout_s
        self._controller = AbortController()
        self.reason: StopReason | None = None
        self._closed = threading.Event()
        self._last_chunk = time.monotonic()
        self._threads = [
            threading.Thread(target=self._heartbeats, name="think-jobs-heartbeat", daemon=True),
            threading.Thread(target=self._signals, name="think-jobs-watch", daemon=True),
        ]
        self._unlisten = (
            signal.add_listener(self._on_local_abort) if isinstance(signal, AbortSignal) else None
        )

    @property
    def signal(self) -> AbortSignal:
        """The turn's own signal: aborted when the turn must stop, for whatever reason."""
        return self._controller.signal

    @property
    def stopped(self) -> bool:
        return self._controller.signal.aborted

    @property
    def interrupted(self) -> bool:
        return self.reason is not None and self.reason.interrupts

    def start(self) -> TurnWatch:
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        """Stop watching. The threads end on their own (one may be inside a call to Redis or
        the database); nothing they see afterwards has an effect."""
        self._closed.set()
        if self._unlisten is not None:
            self._unlisten()

    def chunk_published(self, *, revoked: bool) -> None:
        """Called after each chunk: resets the stall clock, applies a revocation seen in Redis."""
        self._last_chunk = time.monotonic()
        if revoked:
            self.stop("cancelled", self._read_revocation())

    def stop(self, kind: StopKind, text: str | None) -> None:
        if self._closed.is_set():
            return
        if self.reason is None:
            self.reason = StopReason(kind, text)
        self._controller.abort(text)

    def _on_local_abort(self, reason: object) -> None:
        self.stop("signal", None if reason is None else str(reason))

    # -- the heartbeat (database only) ---------------------------------------------------------

    def _heartbeats(self) -> None:
        while not self._closed.wait(self._timings.heartbeat_s):
            try:
                turn = self._lease.heartbeat(self._turn.id)
            except LeaseLost:
                self.stop("lease_lost", "the agent's lease was lost")
                return
            except StorageUnavailableError as error:
                log.warning("lease heartbeat failed for turn %s: %s", self._turn.id, error)
                continue
            self._check_turn(turn)

    def _check_turn(self, turn: TurnRecord | None) -> None:
        if turn is not None and turn.attempt != self._turn.attempt:
            self.stop("lease_lost", "a newer attempt owns the turn")
        elif turn is None or turn.status != "running":
            self.stop("cancelled", turn.error if turn is not None else None)

    # -- signals, stall, the local lease bound, the revocation flag ----------------------------

    def _signals(self) -> None:
        while not self._closed.wait(self._timings.poll_s):
            self._check_local_and_stall()
            if not self._lease.locally_valid():
                self.stop("lease_lost", "the lease could not be renewed in time")
            self._check_revocation()

    def _check_local_and_stall(self) -> None:
        local = self._local
        if local is not None and not isinstance(local, AbortSignal) and local.is_set():
            self.stop("signal", signal_reason(local))
        timeout = self.stall_timeout_s
        if timeout is not None and time.monotonic() - self._last_chunk > timeout:
            self.stop("stalled", f"no chunk for {timeout:g} s")

    def _check_revocation(self) -> None:
        if self.stopped:
            return
        try:
            reason = self._revocation.reason()
        except redis.RedisError:
            return  # the heartbeat's database check still sees a cancellation
        if reason is not False:
            self.stop("cancelled", reason if isinstance(reason, str) else None)

    def _read_revocation(self) -> str | None:
        try:
            reason = self._revocation.reason()
        except redis.RedisError:
            return None
        return reason if isinstance(reason, str) else None
