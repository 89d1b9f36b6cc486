"""Decides when a running attempt must stop, and keeps its lease alive while it runs.

Each running attempt's watch talks only to the database, so that nothing can hold up the
lease: every ``lease_ttl_s / 3`` it renews the lease through the fence and reads the turn's
status in the same transaction (a ``cancel_submission`` that found Redis down is seen there);
it looks again when the stall timeout, the turn's time limit or the lease's local bound is due
(an attempt that could not renew in time stops before anyone else may take the turn), and every
``cancel_poll_interval_s`` when the caller's in-process signal is a ``threading.Event``. Each
renewal runs on a short-lived thread of its own, at most one at a time: a database that stops
answering (a partition that holds bytes) blocks that renewal, never the watch, which still
stops the attempt at the local bound.
Losing Redis alone therefore never costs an attempt its lease while the database answers.
An attempt told to stop keeps its lease a lease TTL longer, to wind up; one still running
then is stuck where no signal reaches, and its lease is left to lapse (``_stuck``).

The watches of a process are woken by one ``WatchClock`` thread, which keeps their next due
times in a heap and does nothing that waits (a renewal is started, never waited for): a
thread per attempt cost a thread start on every turn's path (the starting thread waits for
the new one to get the GIL, ~10 % of a turn's wall time in a busy worker) and a thread per
in-flight turn.

The Redis revocation flags of all the attempts running in a process are polled by one
``RevocationPoller`` thread (one MGET per ``cancel_poll_interval_s``); the flag is also read
with every published chunk. Whichever fires first aborts the turn's own signal, which the
runner checks between chunks and the model may wait on. After ``close()`` nothing the threads
see changes the watch.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from think_jobs.domain.records import TurnRecord
from think_jobs.domain.status import Status, StopKind
from think_jobs.engine.lease import Lease, LeaseLost
from think_jobs.errors import StorageUnavailableError
from think_jobs.signals import AbortController, AbortSignal, SignalLike, signal_reason
from think_jobs.transport.flags import RevocationPoller
from think_jobs.transport.per_process import PerProcess

log = logging.getLogger(__name__)

_MIN_WAIT_S = 0.001  # a deadline just passed is looked at again after this, not in a spin
_CONFIRM_WAIT_S = 0.25  # how long confirm() waits for a renewal once the lease may have lapsed
_RETRY_AFTER_FAILURE_S = 0.05  # a watch whose tick raised (a bug) is looked at again after this

# Stops after which no attempt will use a tool's output: the turn is over (cancelled, timed
# out) or another attempt owns it (lease lost). A stall alone leaves it to a continuation.
_ENDS_THE_TURN = frozenset({StopKind.CANCELLED, StopKind.TIMED_OUT, StopKind.LEASE_LOST})


@dataclass(frozen=True)
class StopReason:
    kind: StopKind
    text: str | None

    @property
    def interrupts(self) -> bool:
        """The attempt stops but the turn is not over: another attempt continues it."""
        return self.kind.interrupts


@dataclass(frozen=True)
class WatchTimings:
    heartbeat_s: float
    poll_s: float


class TurnWatch:
    """``start()`` it when the attempt starts, ``close()`` it when the attempt's writes are done."""

    def __init__(
        self,
        lease: Lease,
        turn: TurnRecord,
        *,
        revocations: RevocationPoller,
        revocation_key: str,
        timings: WatchTimings,
        signal: SignalLike | None = None,
        stall_timeout_s: float | None = None,
        turn_timeout_s: float | None = None,
        began: float | None = None,
    ) -> None:
        """``began`` is when the turn first started, on this process's monotonic clock (an
        earlier attempt's time counts against ``turn_timeout_s``); None: now."""
        self._lease = lease
        self._turn = turn
        self._revocations = revocations
        self._revocation_key = revocation_key
        self._timings = timings
        self._local = signal
        self.stall_timeout_s = stall_timeout_s
        self.turn_timeout_s = turn_timeout_s
        self._began = time.monotonic() if began is None else began
        self._controller = AbortController()
        self.reason: StopReason | None = None
        self._closed = threading.Event()
        self._last_chunk = time.monotonic()
        self._next_heartbeat = 0.0
        self._watched: tuple[WatchClock, _Due] | None = None  # the clock and its entry there
        self._renewal: threading.Thread | None = None  # the renewal in flight, if any
        self._renewal_lock = threading.Lock()
        self._lost = False
        self._stopped_at: float | None = None  # when its time to wind up began (monotonic)
        self._stalled = False  # stalled or handed over, told nothing in ``_ENDS_THE_TURN`` since
        self._in_tool = False  # the attempt is running one of the agent's tools
        self._setting_up = False  # before its model: no chunk is due yet (``setting_up``)
        self._written = False  # the final write went in: what runs now is inside the turn
        self._timed_out = False  # the time limit was reached (it stops the attempt once)
        self._unlisten = (
            signal.add_listener(self._on_local_abort) if isinstance(signal, AbortSignal) else None
        )

    def __repr__(self) -> str:
        return f"<TurnWatch of turn {self._turn.id}, attempt {self._turn.attempt}>"

    @property
    def signal(self) -> AbortSignal:
        """The turn's own signal: aborted when the turn must stop, for whatever reason."""
        return self._controller.signal

    @property
    def stopped(self) -> bool:
        return self._controller.signal.aborted

    def confirm(self) -> bool:
        """Whether the attempt may go on: asked after each chunk and before each model call and
        tool. A lease past its local bound is renewed through the fence first, here and now, not
        at the watch's next poll: a process resumed after a pause longer than the lease must not
        go on while the turn may already run elsewhere (the renewal fails then, and the attempt
        stops at once); a lease that only aged, taken by no one, is renewed and it goes on. The
        renewal is waited for until the lease may lapse (at least ``_CONFIRM_WAIT_S``), not
        longer: a database that does not answer stops the attempt instead of holding it."""
        self._check_time_limit()
        lease = self._lease
        if not self.stopped and not lease.released and lease.lapsed:
            wait_s = max(_CONFIRM_WAIT_S, lease.valid_until - time.monotonic())
            self._renew().join(wait_s)
            if lease.lapsed:
                self.stop(StopKind.LEASE_LOST, "the lease could not be renewed in time")
        return not self.stopped

    @property
    def interrupted(self) -> bool:
        return self.reason is not None and self.reason.interrupts

    def start(self) -> TurnWatch:
        self._next_heartbeat = self._first_heartbeat()
        clock = CLOCK.get()
        self._watched = clock, clock.add(self, self._next_due())
        self._revocations.watch(self._revocation_key, self)
        return self

    def set_timeouts(self, *, stall_s: float | None, turn_s: float | None) -> None:
        """Change the stall timeout and the turn's time limit (``before_turn`` may have), and
        look again when the first of the new deadlines is due."""
        self.stall_timeout_s, self.turn_timeout_s = stall_s, turn_s
        if self._watched is None:
            return
        clock, entry = self._watched
        clock.forget(entry)
        self._watched = clock, clock.add(self, self._next_due())

    def close(self) -> None:
        """Stop watching. A renewal in flight ends on its own (it may be inside a call to
        the database); nothing it sees afterwards has an effect."""
        self._closed.set()
        if self._watched is not None:  # on the clock it started on, whatever process this is
            clock, entry = self._watched
            clock.forget(entry)
        self._revocations.forget(self._revocation_key)
        if self._unlisten is not None:
            self._unlisten()

    def chunk_published(self, *, revoked: bool) -> None:
        """Called after each chunk: resets the stall clock, applies a revocation seen in Redis
        (its reason arrives with the poller's next look, or the heartbeat's)."""
        self._last_chunk = time.monotonic()
        if revoked:
            self.stop(StopKind.CANCELLED, None)

    def stop(self, kind: StopKind | str, text: str | None) -> None:
        """Tell the attempt to stop. The first reason given is kept (``reason``); a later one
        that ends the turn for good ends a stalled attempt's wait for its tool (``_stuck``)."""
        if self._closed.is_set():
            return
        kind = StopKind(kind)
        if self.reason is None:
            self.reason = StopReason(kind, text)
            self._stopped_at = time.monotonic()
            self._stalled = kind.hands_to_recovery
        elif kind in _ENDS_THE_TURN and (self._stalled or self._stopped_at is None):
            # a stalled attempt's wait for its tool, or a written one's for its hooks, ends:
            # its time to wind up begins now
            self._stalled = False
            if self._in_tool or self._stopped_at is None:
                self._stopped_at = time.monotonic()
        self._controller.abort(text)

    def hand_over(self, text: str) -> None:
        """Stop the attempt so that another worker continues its turn (``HANDED_OVER``: its
        partial reply is stored and the turn put back), unless it was told to stop already
        or its final write went in (the turn's outcome is stored: nothing to hand over)."""
        if not self._written and not self.stopped:
            self.stop(StopKind.HANDED_OVER, text)

    def _on_local_abort(self, reason: object) -> None:
        self.stop(StopKind.SIGNAL, None if reason is None else str(reason))

    # -- the watch: the heartbeat (database only), signals, stall, the local lease bound -----

    def tick(self) -> float | None:
        """Called by the clock when the watch is due: look, start a renewal when one is due,
        and say when to be called next (None: no more, closed or lost). Never waits."""
        if self._closed.is_set() or self._lost:
            return None
        self._check_local_and_stall()
        self._check_time_limit()
        if self._stuck():
            return None
        if time.monotonic() >= self._next_heartbeat:
            self._next_heartbeat = time.monotonic() + self._timings.heartbeat_s
            self._renew()
        if not self._lease.locally_valid():
            self.stop(StopKind.LEASE_LOST, "the lease could not be renewed in time")
        return self._next_due()

    @contextmanager
    def setting_up(self) -> Iterator[None]:
        """A block the stall watchdog does not count: the attempt is getting ready (it waits
        for the stream it continues), its model has not started, so no chunk is due. The
        stall clock starts once the block ends."""
        self._setting_up = True
        try:
            yield
        finally:
            self._last_chunk = time.monotonic()
            self._setting_up = False

    def written(self) -> None:
        """The attempt's final write went in: the turn's outcome is stored, and what runs now
        (its stream's end, its hooks) is still inside the turn, so a slow hook delays the
        agent's next turn (SPEC §6). From here the watch only keeps the lease: the turn's
        ended status is the attempt's own, no chunk is due and a caller's signal comes too
        late. Only the turn's time limit, or a lease that cannot be renewed, ends the wait: a
        hook still running a lease TTL after that is stuck (``_stuck``)."""
        self._written = True
        if self.reason is not None and self.reason.kind is not StopKind.TIMED_OUT:
            self._stopped_at = None  # its winding up ended with that write

    def in_tool(self, running: bool) -> None:
        """The attempt enters (True) or leaves one of the agent's tools. A stopped attempt's
        time to wind up starts again when it leaves one."""
        self._in_tool = running
        if not running and self._stopped_at is not None:
            self._stopped_at = time.monotonic()

    def _stuck(self) -> bool:
        """Whether the attempt, told to stop a lease TTL ago, has still not ended: it is stuck
        where no signal reaches (a tool or a model call without a timeout, a hook). Its lease
        is then no longer renewed: it lapses, and the agent's next turn (or this one's
        continuation, after a stall) runs; should the attempt ever go on, its writes are
        fenced off. Until then a stopped attempt keeps its lease to wind up (its partial
        reply, its final write and its stream's end). A stalled attempt inside a tool keeps
        it until the tool returns, however long: its continuation would run the tool again.
        That wait ends when a stop in ``_ENDS_THE_TURN`` follows the stall (a cancel, the
        turn's time limit, which still applies, or the lease lost): the turn then has no
        continuation to wait for, and the attempt is stuck a lease TTL after that stop."""
        stopped_at = self._stopped_at
        if stopped_at is None or not self._may_be_stuck():
            return False
        if time.monotonic() - stopped_at < self._lease.ttl_s:
            return False
        self._lost = True
        log.warning(
            "turn %s (attempt %s) was told to stop (%s) %.0f s ago and has not ended: it is "
            "stuck where no signal reaches (a tool or model call without a timeout?); its "
            "lease is left to lapse so the agent goes on, and it writes nothing if it resumes",
            self._turn.id,
            self._turn.attempt,
            self.reason.kind.value if self.reason is not None else "?",
            time.monotonic() - stopped_at,
        )
        return True

    def _may_be_stuck(self) -> bool:
        """A stopped attempt may be found stuck unless it is lost already or is a stalled one
        inside a tool (it waits for the tool, see ``_stuck``)."""
        return not self._lost and not (self._stalled and self._in_tool)

    def _next_due(self) -> float:
        """When to look next: the first of the next heartbeat, the lease's local bound and
        the stall deadline and the turn's time limit (each checked when it is due, not on a
        fixed tick, so a thousand
        running turns do not cost a thousand wake-ups five times a second). A caller's
        ``threading.Event`` has no listener and is looked at every ``poll_s``. The bound and
        the deadline move later as the lease is renewed and chunks arrive: looking at an old
        one finds nothing to do."""
        now = time.monotonic()
        due = [self._next_heartbeat]
        if not self.stopped:  # once stopped: the heartbeat, and when it would be stuck
            due.append(self._lease.valid_until - self._lease.safety_s)
            if self.stall_timeout_s is not None and not self._written:
                due.append(self._last_chunk + self.stall_timeout_s)
        elif self._stopped_at is not None and self._may_be_stuck():
            due.append(self._stopped_at + self._lease.ttl_s)
        if self.turn_timeout_s is not None and self._held_to_time_limit():
            due.append(self._began + self.turn_timeout_s)
        if self._local is not None and not isinstance(self._local, AbortSignal):
            due.append(now + self._timings.poll_s)
        return max(now + _MIN_WAIT_S, min(due))

    def _first_heartbeat(self) -> float:
        """A heartbeat interval after the lease was last renewed, not after the watch began:
        a lease claimed in the previous turn's final write has aged by that turn's delivery
        (its stream's end waits up to ``done_timeout_s`` for an unreachable Redis)."""
        lease, interval = self._lease, self._timings.heartbeat_s
        renewed = lease.valid_until - lease.ttl_s  # when the last renewal was sent
        return min(time.monotonic() + interval, renewed + interval)

    def _renew(self) -> threading.Thread:
        """The renewal in flight, or a new one started (never two at once)."""
        with self._renewal_lock:
            renewal = self._renewal
            if renewal is None or not renewal.is_alive():
                renewal = threading.Thread(
                    target=self._heartbeat, name="think-jobs-renewal", daemon=True
                )
                renewal.start()
                self._renewal = renewal
            return renewal

    def _heartbeat(self) -> None:
        """Renew the lease and look at the turn; once the lease is lost, nothing more is
        watched for. A renewal started as the watch closed does nothing: the attempt's writes
        are done, and the runtime may be closing its database."""
        if self._closed.is_set():
            return
        try:
            turn = self._lease.heartbeat(self._turn.id)
        except LeaseLost:
            self.stop(StopKind.LEASE_LOST, "the agent's lease was lost")
            self._lost = True
            return
        except StorageUnavailableError as error:
            log.warning("lease heartbeat failed for turn %s: %s", self._turn.id, error)
            return
        self._check_turn(turn)

    def _check_turn(self, turn: TurnRecord | None) -> None:
        if self._written:  # the turn ended with this attempt's own write
            return
        if turn is not None and turn.attempt != self._turn.attempt:
            self.stop(StopKind.LEASE_LOST, "a newer attempt owns the turn")
        elif turn is None or turn.status is not Status.RUNNING:
            self.stop(StopKind.CANCELLED, turn.error if turn is not None else None)

    def _check_local_and_stall(self) -> None:
        if self._written:
            return
        local = self._local
        if local is not None and not isinstance(local, AbortSignal) and local.is_set():
            self.stop(StopKind.SIGNAL, signal_reason(local))
        timeout = self.stall_timeout_s
        if self._setting_up or timeout is None:
            return
        if time.monotonic() - self._last_chunk > timeout:
            self.stop(StopKind.STALLED, f"no chunk for {timeout:g} s")

    def _held_to_time_limit(self) -> bool:
        """Whether the time limit may still stop the attempt: it has not yet, and the attempt
        runs, waits in a tool after a stall, or runs its hooks after its final write."""
        return not self._timed_out and (not self.stopped or self._stalled or self._written)

    def _check_time_limit(self) -> None:
        """Stop a turn that has run ``turn_timeout_s`` since it first started: it ends in
        error (``StopKind.TIMED_OUT``), a continuation after a crash included. A stalled
        attempt is still held to it: one waiting in a tool must not wait past it, and so are
        the hooks after the final write (``written``)."""
        limit = self.turn_timeout_s
        if limit is None or not self._held_to_time_limit():
            return
        if time.monotonic() < self._began + limit:
            return
        self._timed_out = True
        self.stop(StopKind.TIMED_OUT, f"the turn ran past its time limit of {limit:g} s "
                  "(turn_timeout_s)")  # fmt: skip


# -- the clock: one thread waking every watch of the process when it is due --------------------


class Ticking(Protocol):
    """What the clock wakes: ``tick()`` looks and says when to be woken next (None: never)."""

    def tick(self) -> float | None: ...


@dataclass(order=True)
class _Due:
    """A watch's place in the heap: when it is due (ties in the order they came)."""

    at: float
    order: int
    watch: Ticking | None = field(compare=False)  # None: forgotten (the watch closed)
    queued: bool = field(default=True, compare=False)  # in the heap (not being ticked)


class WatchClock:
    """Calls ``tick()`` of each watch when it is due, on one daemon thread, and schedules
    the watch again for the time ``tick()`` returns. A closed watch is forgotten: its entry
    stays in the heap, emptied, until the heap is rebuilt (when more than half of it is such)
    or its time comes. ``tick()`` never waits on the database (a renewal runs on its own
    thread), so one slow call cannot delay another attempt's stop at its lease's local bound; a
    stop runs the turn's abort listeners on this thread, as the revocation poller's do."""

    _REBUILD_AT = 64  # forgotten entries before a rebuild is worth it

    def __init__(self) -> None:
        self._heap: list[_Due] = []
        self._forgotten = 0
        self._order = itertools.count()
        self._wake = threading.Condition(threading.Lock())
        self._thread = threading.Thread(target=self._loop, name="think-jobs-watch", daemon=True)
        self._thread.start()

    def add(self, watch: Ticking, at: float) -> _Due:
        """Call ``watch.tick()`` at ``at`` (``time.monotonic()``); returns its entry."""
        entry = _Due(at, next(self._order), watch)
        with self._wake:
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._wake.notify()
        return entry

    def forget(self, entry: _Due) -> None:
        """Drop a watch's entry (it will not be called again)."""
        with self._wake:
            if entry.watch is None:
                return
            entry.watch = None
            if not entry.queued:  # being ticked: not put back
                return
            self._forgotten += 1
            if self._forgotten > self._REBUILD_AT and 2 * self._forgotten > len(self._heap):
                self._heap = [kept for kept in self._heap if kept.watch is not None]
                heapq.heapify(self._heap)
                self._forgotten = 0

    def __len__(self) -> int:
        """Watches scheduled (forgotten ones not counted)."""
        with self._wake:
            return len(self._heap) - self._forgotten

    def _loop(self) -> None:
        while True:
            try:
                for entry in self._take_due():
                    self._tick(entry)
            except Exception:  # a bug here must not leave every attempt of the process unwatched
                log.exception("watch clock: a pass failed")
                time.sleep(_RETRY_AFTER_FAILURE_S)

    def _take_due(self) -> list[_Due]:
        """Wait until an entry is due; take every entry due now (forgotten ones dropped)."""
        with self._wake:
            while True:
                now = time.monotonic()
                if self._heap and self._heap[0].at <= now:
                    break
                self._wake.wait(self._heap[0].at - now if self._heap else None)
            due: list[_Due] = []
            while self._heap and self._heap[0].at <= now:
                entry = heapq.heappop(self._heap)
                entry.queued = False
                if entry.watch is None:
                    self._forgotten -= 1
                else:
                    due.append(entry)
            return due

    def _tick(self, entry: _Due) -> None:
        watch = entry.watch
        if watch is None:  # forgotten after it was taken
            return
        try:
            at = watch.tick()
        except Exception:  # a bug must not stop the clock of every attempt of the process
            log.exception("%r failed; looking again in %g s", watch, _RETRY_AFTER_FAILURE_S)
            at = time.monotonic() + _RETRY_AFTER_FAILURE_S
        with self._wake:
            if entry.watch is None:  # forgotten meanwhile
                return
            if at is None:
                entry.watch = None
                return
            entry.at, entry.order, entry.queued = at, next(self._order), True
            heapq.heappush(self._heap, entry)


CLOCK: PerProcess[WatchClock] = PerProcess(WatchClock)
