"""Keeps a running turn's lease alive and decides when the turn must stop.

One thread per running turn. It renews the agent's lease every ``lease_ttl_s / 3`` and, in the
same transaction, reads the turn's status (a ``cancel_submission`` that found Redis down is
seen there); it polls the Redis revocation flag every ``cancel_poll_interval_s`` (the flag is
also read with every published chunk); it watches the caller's in-process signal and the stall
timeout. Whichever fires first aborts the turn's own signal, which the runner checks between
chunks and the model may wait on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

import redis

from think_jobs.context import utcnow
from think_jobs.db import agents as agent_ops
from think_jobs.db import turns as turn_ops
from think_jobs.errors import StorageUnavailableError
from think_jobs.signals import AbortController, AbortSignal, SignalLike, signal_reason

if TYPE_CHECKING:
    from think_jobs.queueing import Claim
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)

StopKind = Literal["cancelled", "signal", "stalled", "lease_lost"]


@dataclass(frozen=True)
class StopReason:
    kind: StopKind
    text: str | None


class TurnWatch:
    """Start it when the turn starts, ``close()`` it when the turn's writes are done."""

    def __init__(
        self,
        jobs: ThinkJobs,
        claim: Claim,
        *,
        signal: SignalLike | None = None,
        stall_timeout_s: float | None = None,
    ) -> None:
        self._jobs = jobs
        self._claim = claim
        self._local = signal
        self.stall_timeout_s = stall_timeout_s
        self._controller = AbortController()
        self.reason: StopReason | None = None
        self._closed = threading.Event()
        self._last_chunk = time.monotonic()
        self._revoked_key = jobs.keys.revoked(claim_address(claim), claim.turn.request_id)
        self._thread = threading.Thread(target=self._loop, name="think-jobs-watch", daemon=True)
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

    def start(self) -> TurnWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self._unlisten is not None:
            self._unlisten()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def chunk_published(self, *, revoked: bool) -> None:
        """Called after each chunk: resets the stall clock, applies a revocation seen in Redis."""
        self._last_chunk = time.monotonic()
        if revoked:
            self.stop("cancelled", self._read_revocation())

    def stop(self, kind: StopKind, text: str | None) -> None:
        if self.reason is None:
            self.reason = StopReason(kind, text)
        self._controller.abort(text)

    def _on_local_abort(self, reason: object) -> None:
        self.stop("signal", None if reason is None else str(reason))

    def _loop(self) -> None:
        settings = self._jobs.settings
        next_heartbeat = time.monotonic() + settings.heartbeat_interval_s
        while not self._closed.wait(settings.cancel_poll_interval_s):
            self._check_local_and_stall()
            self._check_revocation()
            if time.monotonic() >= next_heartbeat:
                next_heartbeat = time.monotonic() + settings.heartbeat_interval_s
                self._heartbeat()

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
            if self._jobs.redis.exists(self._revoked_key):
                self.stop("cancelled", self._read_revocation())
        except redis.RedisError:
            pass  # the heartbeat's database check still sees a cancellation

    def _read_revocation(self) -> str | None:
        try:
            value = self._jobs.redis.get(self._revoked_key)
        except redis.RedisError:
            return None
        text = value.decode() if isinstance(value, bytes) else value
        return text or None

    def _heartbeat(self) -> None:
        claim = self._claim
        ttl = timedelta(seconds=self._jobs.settings.lease_ttl_s)
        try:
            with self._jobs.db.write() as conn:
                renewed = agent_ops.renew_lease(
                    conn, claim.agent_id, claim.token, now=utcnow(), ttl=ttl
                )
                turn = turn_ops.get_turn_by_id(conn, claim.turn.id)
        except StorageUnavailableError as error:
            log.warning("lease heartbeat failed for %s: %s", claim_address(claim), error)
            return
        if renewed is None:
            self.stop("lease_lost", "the agent's lease was lost")
        elif turn is None or turn.status != "running" or turn.attempt != claim.turn.attempt:
            self.stop("cancelled", turn.error if turn is not None else None)


def claim_address(claim: Claim) -> str:
    return f"{claim.agent_type}:{claim.agent_name}"
