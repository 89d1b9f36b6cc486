"""A turn's stream over Redis: a replay buffer per turn, one pub/sub channel per agent, fenced.

Every event of a turn is appended to the turn's LIST (index == ``seq``) and PUBLISHed on the
agent's channel by one server-side script, which also reads the revocation flag. The buffer
is keyed by the turn's row id, so a request id reused after a delete starts a fresh stream.

**Fencing.** A turn may have several attempts (recovery after a crash, a stall, a lost lease);
each writes with its attempt number as its *epoch*. The script keeps the owner epoch beside
the buffer and refuses an append from an older epoch, and anything at all once the stream is
*sealed* by its ``done`` event. A new attempt takes the stream over before it reads the
buffer to recover the partial reply, so a paused or partitioned attempt that wakes up later
can never add to the stream (its writer learns it is ``lost``, and the attempt stops). Seqs
are therefore contiguous and unique, and there is one ``done``, the last event. A stream a
reader ended from the database (its turn ended there: a cancel whose executor is silent) tells
its owner it is ``sealed``, not ``lost``: the attempt sends no more but still makes its final
write and gives the lease back.

**No silent gaps.** Events that could not be sent stay queued and go out with the next send;
an append states where it expects to land (``expected``) so a retried send is never stored
twice and a buffer lost with a Redis restart is written again from what the writer knows.

**Coalescing.** Chunks that come within a flush window (``stream_flush_window_ms``) of the
writer's last send go out together in one append, sent by the writer's next chunk once the
window has passed or by the process's one flusher thread (``transport.flusher``) when it ends;
a lone chunk goes out at once. Every send, whichever thread makes it, asks the lease first and
goes through the same fence, one at a time per writer.

**Under load.** While the process is busy sending chunks (``transport.sender``: two or more
sends in flight, or the sender has work), a chunk due at once is handed to the process's sender
thread, which sends the due chunks of every writer handed over in one pipelined round trip,
each through this writer's own fenced append; a process that is not busy sends it from the
attempt's own thread, at once.

**The database is the truth.** When a finished turn's buffer is gone or never got its tail,
a reader rebuilds it from the stored reply (``seal_from_store``, with ``replay``), so a reader
never waits forever and the text it rebuilds is the stored reply. The rebuild is numbered from
seq 0 again, so a reader resumed past its end (a position from the lost numbering) is told so
with ``StreamResetError`` rather than waiting or ending without its ``done``.

Readers subscribe first, then replay the buffer, then follow live, dropping seqs already seen:
"snapshot then subscribe" would lose events published in between.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import redis
from redis.client import PubSub
from redis.commands.core import Script

from think_jobs import replay
from think_jobs.domain.status import Status
from think_jobs.errors import BrokerUnavailableError, StreamResetError
from think_jobs.keys import Keys
from think_jobs.messages import UIMessage
from think_jobs.observe import metrics
from think_jobs.results import StreamEvent
from think_jobs.transport.clients import broker_errors
from think_jobs.transport.flusher import StreamFlusher, process_flusher
from think_jobs.transport.sender import StreamSender, process_sender

log = logging.getLogger(__name__)

_RETRY_S = 1.0  # after a failed send, queue without sending this long (done always tries)
_BUSY_RETRY_S = 0.0005  # the flusher found a writer's lock taken: look again this soon
_TAKE_OVER_RETRY_S = 0.2  # a recovering attempt waiting for Redis asks again this often
STORE_EPOCH = 2**31  # the database's own writes (rebuilds, ends of turns that never ran)


@dataclass(frozen=True)
class StreamRef:
    """Names one turn's stream: the agent's address, the turn's request id and row id."""

    agent: str
    request_id: str
    turn_id: int


class Outcome(IntEnum):
    """What the append script did with a batch."""

    APPENDED = 0
    STALE = 1  # a newer attempt owns the stream
    SEALED = 2  # the stream has its ``done``
    SHORT = 3  # the buffer holds fewer events than expected (lost with a Redis restart)
    MOVED = 4  # strict append: the buffer is not the length the caller read


def open_pubsub(client: redis.Redis) -> PubSub:
    """A pub/sub connection that skips subscribe confirmations."""
    pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)
    return pubsub


def _head(ref: StreamRef, epoch: int) -> str:
    return f'{{"request_id":{json.dumps(ref.request_id)},"attempt":{epoch},"seq":'


def chunk_tail(chunk_json: str) -> str:
    return f',"chunk":{chunk_json}}}'


def done_tail(status: str, error: str | None) -> str:
    return f',"done":true,"status":{json.dumps(status)},"error":{json.dumps(error)}}}'


def decode_event(raw: bytes | str) -> StreamEvent:
    return StreamEvent.model_validate_json(raw)


# KEYS: buffer, state, revocation flag. ARGV: channel, TTL in seconds (0: leave it), epoch,
# expected length, seal ("1": the last event is ``done``), strict ("1": the length must be
# exactly ``expected``), events... Returns {outcome, revoked, length}. An append of events the
# buffer already holds (a retried send whose reply was lost) skips them. Only the database's
# own rebuild may write into a sealed stream, and only when its buffer is gone. The database's
# writes never take the stream's ownership: a sealed stream still tells an older attempt that
# it is STALE and its owner that it is SEALED (its turn ended in the database, by a cancel).
_APPEND_LUA = """
local state = redis.call('HMGET', KEYS[2], 'epoch', 'sealed')
local revoked = redis.call('EXISTS', KEYS[3])
local length = redis.call('LLEN', KEYS[1])
local epoch = tonumber(ARGV[3])
local rebuild = epoch == STORE_EPOCH and length == 0
local owner = tonumber(state[1])
local stale = owner and epoch < owner
if state[2] and not rebuild then return {stale and 1 or 2, revoked, 0} end
if stale then return {1, revoked, 0} end
local expected = tonumber(ARGV[4])
if length < expected then return {3, revoked, length} end
if ARGV[6] == '1' and length ~= expected then return {4, revoked, length} end
if owner ~= epoch and epoch ~= STORE_EPOCH then redis.call('HSET', KEYS[2], 'epoch', ARGV[3]) end
for i = 7 + length - expected, #ARGV do
  redis.call('RPUSH', KEYS[1], ARGV[i])
  redis.call('PUBLISH', ARGV[1], ARGV[i])
end
if ARGV[5] == '1' then redis.call('HSET', KEYS[2], 'sealed', '1') end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
return {0, revoked, redis.call('LLEN', KEYS[1])}
""".replace("STORE_EPOCH", str(STORE_EPOCH))

# KEYS: buffer, state. ARGV: epoch, TTL. Makes ``epoch`` the owner (unless a newer one is, or
# the stream is sealed) and returns {outcome, the buffer's events}.
_TAKE_OVER_LUA = """
local state = redis.call('HMGET', KEYS[2], 'epoch', 'sealed')
if state[2] then return {2, {}} end
local owner = tonumber(state[1])
if owner and tonumber(ARGV[1]) < owner then return {1, {}} end
redis.call('HSET', KEYS[2], 'epoch', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {0, redis.call('LRANGE', KEYS[1], 0, -1)}
"""


@dataclass(frozen=True)
class _Keys:
    buffer: str
    state: str
    revoked: str
    channel: str

    @classmethod
    def of(cls, keys: Keys, ref: StreamRef) -> _Keys:
        return cls(
            keys.stream_buffer(ref.agent, ref.turn_id),
            keys.stream_state(ref.agent, ref.turn_id),
            keys.revoked(ref.agent, ref.turn_id),
            keys.chunk_channel(ref.agent),
        )


@dataclass(frozen=True)
class _Sent:
    outcome: Outcome
    revoked: bool
    length: int


def _append(
    script: Script,
    names: _Keys,
    events: list[str],
    *,
    epoch: int,
    expected: int,
    ttl_s: int,
    seal: bool = False,
    strict: bool = False,
) -> _Sent:
    flags = ["1" if seal else "0", "1" if strict else "0"]
    args: list[str | int] = [names.channel, ttl_s, epoch, expected, *flags, *events]
    outcome, revoked, length = script(keys=[names.buffer, names.state, names.revoked], args=args)
    return _Sent(Outcome(int(outcome)), bool(revoked), int(length))


def _always() -> bool:
    return True


class StreamWriter:
    """Appends one attempt's events to its turn's stream; never raises because Redis fails.

    ``epoch`` is the attempt number. ``prefix`` are the events already in the buffer when the
    attempt took the stream over (``take_over``); None means "not known yet": the writer takes
    the stream over before its first send. ``may_send`` is asked before every send, by
    whichever thread sends (the attempt's lease may have lapsed while this process was
    paused). Framing chunks may be deferred: they go out with the next chunk that is not, in
    order, in one round trip.

    **Coalescing** (``flush_window_s`` > 0). A chunk goes out at once when the writer sent
    nothing in the last window, so a lone chunk is never delayed; one that comes sooner is
    held, and goes out with what follows in one append: with the next chunk once the window
    has passed or, should none come, from the process's flusher thread when the window ends
    (``transport.flusher``). A held chunk therefore waits at most one window after the send
    before it (plus the flusher's wake-up), and the sends of one writer are at least a window
    apart. Its revocation bit and refusal (``revoked``, ``lost``) are learnt when it is sent,
    by whichever thread sends; the attempt reads them after its next chunk, and the
    ``RevocationPoller`` polls the flag meanwhile. ``done`` sends everything held, in order,
    before the ``done`` event; ``close`` (an attempt interrupted) sends it if it still may;
    after either, the flusher sends nothing more for this writer. The two threads share the
    writer's state under its lock, held across each send (a writer's sends never overlap).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        ref: StreamRef,
        *,
        epoch: int,
        ttl_s: int,
        prefix: list[str] | None,
        may_send: Callable[[], bool] = lambda: True,
        done_timeout_s: float = 2.0,
        flush_window_s: float = 0.0,
        flusher: StreamFlusher | None = None,
        sender: StreamSender | None = None,
    ) -> None:
        self.client = client
        self._append_script = client.register_script(_APPEND_LUA)  # EVALSHA, EVAL on a miss
        self._names = _Keys.of(keys, ref)
        self._head = _head(ref, epoch)
        self.ref = ref
        self.epoch = epoch
        self._ttl_s = ttl_s
        self._known = prefix  # every event known to be in the buffer, in seq order
        self._pending: list[str] = []  # tails of events not yet delivered
        self._due = 0  # how many of them must go out: up to the last chunk not deferred
        self._may_send = may_send
        self._done_timeout_s = done_timeout_s
        self._window_s = flush_window_s
        self._flusher = flusher  # None: the process's own
        self._sender = sender  # None: the process's own
        self._batch: list[str] = []  # the events the sender has in flight (the lock is held)
        self._lock = threading.Lock()  # the attempt's thread and the flusher's
        self._sent_at = -math.inf  # when the last send succeeded (monotonic)
        self._deadline: float | None = None  # held events go out by then (the flusher)
        self._ended = False  # done() or close() was called: the flusher leaves it alone
        self._sending = False  # a send is in flight (read by the flusher without the lock)
        self._expiry_set = False
        self._failed_at: float | None = None
        # the reply a recovery continues, not yet matched, and the reply that one extends
        self._base: tuple[UIMessage, UIMessage | None] | None = None
        self.lost = False  # a newer attempt owns the stream
        self.diverged = False  # the stream shows more than the reply this attempt continues
        self.sealed = False  # the stream was ended from the database (its turn ended there)
        self.revoked = False

    @property
    def prefix(self) -> list[StreamEvent] | None:
        """The events of earlier attempts this writer continues (None: not known)."""
        with self._lock:
            known = None if self._known is None else list(self._known)
        return None if known is None else [decode_event(raw) for raw in known]

    def shown(self) -> list[StreamEvent] | None:
        """What the stream holds, read from Redis (once ``sealed``, all it will ever hold);
        when Redis cannot be read, the events this writer knows are there (None: it never
        read the buffer, so it sent nothing of its own)."""
        try:
            raw = self.client.lrange(self._names.buffer, 0, -1)
        except redis.RedisError as error:
            log.warning("stream of %s unread (%s): its known events stand for it",
                        self.ref.request_id, error)  # fmt: skip
            return self.prefix
        return [decode_event(item) for item in raw]

    def take_over(self) -> bool:
        """Become the stream's owner and learn what it holds; False if Redis is unreachable
        (the writer tries again before its first send) or the stream is not ours."""
        with self._lock:
            return self._take_over()

    def take_over_within(self, wait_s: float, *, keep_trying: Callable[[], bool]) -> bool:
        """``take_over``, tried again every ``_TAKE_OVER_RETRY_S`` while Redis is unreachable,
        for up to ``wait_s`` and while ``keep_trying()``. A recovering attempt needs what the
        stream holds before it starts: the events of the attempt that died are often not in
        its stored partial, and an attempt that went on without them would stream their text
        a second time when it takes the stream over at its first send."""
        deadline = time.monotonic() + wait_s
        if self.take_over():
            return True
        while not self.lost and keep_trying() and time.monotonic() < deadline:
            time.sleep(min(_TAKE_OVER_RETRY_S, max(0.0, deadline - time.monotonic())))
            with self._lock:
                if self._take_over(quiet=True):
                    log.info("stream of %s taken over once Redis answered", self.ref.request_id)
                    return True
        return False

    def continue_from(self, base: UIMessage, *, extends: UIMessage | None = None) -> None:
        """A recovering attempt continues ``base`` (its partial reply, rebuilt from the stream
        or, when that held none or could not be read, from the database): the stream must
        lead to it before the attempt's own chunks. What the buffer lacks of it — all of it
        when Redis lost the buffer — goes out first: now if the buffer was read
        (``take_over``), else once it is, at the first send. A buffer that does not lead to
        ``base`` (the attempt started without reading it: it shows more) makes the writer
        ``diverged``, and nothing of the attempt is sent. ``extends``: the reply an approval's
        continuation extends, as a client holds it (its stream's chunks apply to it)."""
        with self._lock:
            self._base = (base, extends)
            if self._known is not None:
                self._match_base()

    def confirm_base(self) -> bool:
        """Before the final write of an attempt that has not read the stream yet: try once
        (``take_over``); False when the stream does not lead to the reply it continued. Redis
        still unreachable says True: the final write goes ahead (readers rebuild the stream's
        end from the database)."""
        with self._lock:
            if self._base is not None and self._known is None and not self.lost:
                self._take_over(quiet=True)
            return not self.diverged

    def _match_base(self) -> bool:
        """Queue what the buffer lacks of the base before everything pending (the lock is
        held); False, and ``diverged``, when the buffer does not lead to it."""
        pending, self._base = self._base, None
        assert self._known is not None
        if pending is None:
            return True
        base, extends = pending
        shown = [event.chunk for event in map(decode_event, self._known) if event.chunk]
        missing = replay.suffix(shown, base, finished=False, base=extends)
        if missing is None and not shown:  # the stored partial does not extend that reply
            log.warning(
                "stored partial of request %s does not extend the reply it continues: its "
                "stream gets only what attempt %d adds", self.ref.request_id, self.epoch,
            )  # fmt: skip
            missing = []
        if missing is None:
            log.warning(
                "stream of request %s shows more than the reply attempt %d continued (Redis "
                "was unreachable when it started): it hands the turn to recovery",
                self.ref.request_id, self.epoch,
            )  # fmt: skip
            self.diverged = True
            self._drop()
            return False
        tails = [chunk_tail(json.dumps(chunk, separators=(",", ":"))) for chunk in missing]
        self._pending[:0] = tails
        self._due += len(tails)
        return True

    def _take_over(self, *, quiet: bool = False) -> bool:
        try:
            script = self.client.register_script(_TAKE_OVER_LUA)
            keys = [self._names.buffer, self._names.state]
            outcome, events = script(keys=keys, args=[self.epoch, self._ttl_s])
        except redis.RedisError as error:
            if not quiet:
                log.warning("stream take-over failed for %s: %s", self.ref.request_id, error)
            return False
        if Outcome(int(outcome)) is not Outcome.APPENDED:
            self.lost = True
            return False
        self._known = [raw.decode() if isinstance(raw, bytes) else raw for raw in events]
        return self._match_base()

    def chunk(self, chunk_json: str, *, defer: bool = False) -> None:
        """Queue one chunk (AI SDK JSON) and, unless deferred, send what is queued now or,
        within a flush window of the last send, hold it for one send a little later. After
        ``done`` or ``close`` it is dropped: the attempt is over."""
        with self._lock:
            if self._ended:
                return
            self._pending.append(chunk_tail(chunk_json))
            if defer:
                return
            self._due = len(self._pending)
            if time.monotonic() - self._sent_at >= self._window_s:
                self._send_or_hand_over()
            elif self._deadline is None:
                self._hold_until(self._sent_at + self._window_s)

    @property
    def lock(self) -> threading.Lock:
        """Held across each send, whichever thread makes it (``transport.sender``)."""
        return self._lock

    def _send_or_hand_over(self) -> None:
        """Send what is due now, or, while the process is busy sending chunks, hand it to the
        process's sender, which sends every busy writer's chunks in one round trip."""
        sender = self._sender or process_sender()
        if self._known is not None and sender.busy():
            sender.submit(self)
            return
        with sender.sending():
            self._flush()

    def take_batch(self) -> tuple[redis.Redis, list[Any]] | None:
        """The sender's call, with the lock held: the append of what is due, as a command for
        its pipeline (None: nothing to send now — ended, sent meanwhile, backing off after a
        failure, or ``may_send`` says no, which leaves it to the attempt's own thread)."""
        if self._ended or self._known is None or not self._may_go(force=False, flusher=True):
            return None
        expected = len(self._known)
        self._batch = self._encode(expected)
        self._sending = True
        ttl_s = 0 if self._expiry_set else self._ttl_s
        names = self._names
        keys = [names.buffer, names.state, names.revoked]
        args = [names.channel, ttl_s, self.epoch, expected, "0", "0", *self._batch]
        command = ["EVALSHA", self._append_script.sha, len(keys), *keys, *args]
        return self.client, command

    def settle_batch(self, result: Any) -> None:
        """The sender's call, with the lock held: what the append ``take_batch`` made
        returned, or the error it raised."""
        events, self._batch = self._batch, []
        self._sending = False
        if isinstance(result, redis.exceptions.NoScriptError):  # Redis restarted empty
            self._flush(flusher=True)  # the script object loads it and sends again
            return
        if isinstance(result, Exception):
            error = result if isinstance(result, redis.RedisError) else redis.RedisError(result)
            self._failed(error)
            return
        outcome, revoked, length = result
        sent = _Sent(Outcome(int(outcome)), bool(revoked), int(length))
        self.revoked = sent.revoked or self.revoked
        self._complete(sent, events, seal=False)
        self._sent_ok()

    def flush_held(self) -> float | None:
        """The flusher's call: send what is held once its deadline has passed.

        Never waits for the lock. The attempt's thread holds it while it sends, and that send
        carries what is held (a failed one schedules its own retry): nothing to do; or while
        it queues a chunk: look again in a moment. Never decides the writer is lost: when
        ``may_send`` says no, what is held waits for the attempt's own thread (its next chunk,
        ``done`` or ``close``), which asks again (a lease the turn's final write released says
        no just before ``done`` sends it all)."""
        if not self._lock.acquire(blocking=False):
            return None if self._sending else time.monotonic() + _BUSY_RETRY_S
        try:
            deadline = self._deadline
            if self._ended or deadline is None or deadline > time.monotonic():
                return None  # sent meanwhile, or a later deadline is scheduled on its own
            self._deadline = None
            self._flush(flusher=True)
            return None  # a failed send scheduled its own retry
        finally:
            self._lock.release()

    def done(self, status: str, error: str | None) -> bool:
        """End the stream, after everything still queued or held; retries for
        ``done_timeout_s``. False if it could not be sent (readers then rebuild the end from
        the database) or the stream is not ours.

        Called only after the attempt's final write committed through its fence: the turn is
        over, no newer attempt can start, so ``may_send`` is not asked any more (the lease
        may already be released)."""
        with self._lock:
            self._ended = True
            self._pending.append(done_tail(status, error))
            self._due = len(self._pending)
            self._expiry_set = False  # the final send refreshes the TTL
            self._may_send = _always
        deadline = time.monotonic() + self._done_timeout_s
        while not self._flush_now(force=True, seal=True):
            if self.lost or self.diverged or time.monotonic() >= deadline:
                return self._gave_up()
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if self.sealed:
            self._mark_stored()
        return True

    def _mark_stored(self) -> None:
        """A stream ended from the database before this attempt's end: note beside it that
        the attempt stored its reply (``stored_by_attempt``), so that no later take-over of
        the agent's lease stores the stream's partial over it — after a ``clear_messages``,
        say (best effort: a Redis that lost the note lost the stream too)."""
        try:
            self.client.hset(self._names.state, "stored", "1")
        except redis.RedisError as error:
            log.warning("stream of %s: stored reply not noted (%s)", self.ref.request_id, error)

    def close(self) -> None:
        """The attempt ends without ``done`` (it was interrupted): send what is held if the
        lease still allows (as it would have gone out at once without coalescing); then
        nothing more is sent. Deferred framing chunks after the last sent one stay unsent."""
        with self._lock:
            if not self._ended:
                self._ended = True
                self._flush()

    def _flush_now(self, **options: bool) -> bool:
        with self._lock:
            return self._flush(**options)

    def _gave_up(self) -> bool:
        if not self.lost:
            metrics.STREAMS_INCOMPLETE.inc()
            log.error(
                "stream of request %s left without its end (Redis unreachable); readers "
                "rebuild it from the database",
                self.ref.request_id,
            )
        with self._lock:
            self._drop()
        return False

    def _hold_until(self, at: float) -> None:
        self._deadline = at
        (self._flusher or process_flusher()).schedule(self, at)

    def _flush(self, *, force: bool = False, seal: bool = False, flusher: bool = False) -> bool:
        """Send what is due (the lock is held); True when nothing due is left. ``force``
        ignores the back-off; ``flusher``: a ``may_send`` that says no leaves it queued."""
        if not self._may_go(force=force, flusher=flusher):
            return not self._due
        self._sending = True
        try:
            self._deliver(seal=seal)
        except redis.RedisError as error:
            self._failed(error)
            return False
        finally:
            self._sending = False
        self._sent_ok()
        return not self._due

    def _may_go(self, *, force: bool, flusher: bool) -> bool:
        """Whether what is due may be sent now, by any thread (the lock is held): something is
        due, the back-off after a failed send is over (or ``force``), and the lease allows it
        — when it does not, the writer is lost, unless the caller is the flusher or the sender
        (``flusher``), which leave the chunks to the attempt's own thread."""
        if self.lost or self.sealed or self.diverged:
            self._drop()
        if not self._due:
            return False
        failed_at = self._failed_at
        if not force and failed_at is not None and time.monotonic() - failed_at < _RETRY_S:
            return False
        if not self._may_send():
            if not flusher:
                self.lost = True
            return False
        return True

    def _sent_ok(self) -> None:
        self._failed_at = None
        self._sent_at = time.monotonic()
        self._deadline = None

    def _failed(self, error: redis.RedisError) -> None:
        """Keep what was not sent; with a flush window, the flusher retries after the back-off."""
        if self._failed_at is None:
            log.warning("stream publish failed for %s: %s", self.ref.request_id, error)
        self._failed_at = time.monotonic()
        if self._window_s > 0 and not self._ended:
            self._hold_until(self._failed_at + _RETRY_S)

    def _drop(self) -> None:
        self._pending.clear()
        self._due = 0
        self._deadline = None

    def _deliver(self, *, seal: bool) -> None:
        if self._known is None and not self._take_over():
            if self.lost or self.diverged:
                return
            raise redis.ConnectionError("stream take-over pending")
        assert self._known is not None
        events = self._encode(len(self._known))
        self._complete(self._send(events, len(self._known), seal=seal), events, seal=seal)

    def _complete(self, sent: _Sent, events: list[str], *, seal: bool) -> None:
        """After the append of ``events``: write the buffer again if it was lost, then
        settle."""
        if sent.outcome is Outcome.SHORT:  # the buffer was lost: write it again
            assert self._known is not None
            self._expiry_set = False
            restored = self._known[sent.length :] + events
            sent = self._send(restored, sent.length, seal=seal)
        self._settle(sent, events)

    def _encode(self, first_seq: int) -> list[str]:
        due = self._pending[: self._due]
        return [f"{self._head}{first_seq + n}{tail}" for n, tail in enumerate(due)]

    def _send(self, events: list[str], expected: int, *, seal: bool) -> _Sent:
        ttl_s = 0 if self._expiry_set else self._ttl_s
        sent = _append(
            self._append_script, self._names, events, epoch=self.epoch, expected=expected,
            ttl_s=ttl_s, seal=seal,
        )  # fmt: skip
        self.revoked = sent.revoked or self.revoked
        return sent

    def _settle(self, sent: _Sent, events: list[str]) -> None:
        if sent.outcome is Outcome.SEALED:
            log.info(
                "stream of request %s was ended from the database (its turn was ended "
                "there): attempt %d sends no more of it", self.ref.request_id, self.epoch,
            )  # fmt: skip
            self.sealed = True
            self._drop()
            return
        if sent.outcome is not Outcome.APPENDED:
            log.warning(
                "stream of request %s refused attempt %d's events (%s): it lost the turn",
                self.ref.request_id, self.epoch, sent.outcome.name.lower(),
            )  # fmt: skip
            self.lost = True
            self._drop()
            return
        assert self._known is not None
        self._known.extend(events)
        del self._pending[: len(events)]
        self._due = 0
        self._expiry_set = True


# -- rebuilding from the database --------------------------------------------------------------


@dataclass(frozen=True)
class StoredEnd:
    """A finished turn as the database holds it: its final status and stored reply."""

    status: str
    error: str | None
    reply: UIMessage | None
    base: UIMessage | None = None  # an approval's continuation: the reply its chunks apply to


StoredTurn = Callable[[], "StoredEnd | None"]  # None while the turn is not finished


def seal_from_store(
    client: redis.Redis, keys: Keys, ref: StreamRef, end: StoredEnd, *, ttl_s: int
) -> None:
    """Complete a finished turn's stream from the database: the reply's missing chunks (or, if
    the stream does not lead to the stored reply, none) and the ``done`` event. Raises
    ``BrokerUnavailableError``."""
    with broker_errors("completing a stream from the database"):
        _seal_from_store(client, _Keys.of(keys, ref), ref, end, ttl_s=ttl_s)


def _seal_from_store(
    client: redis.Redis, names: _Keys, ref: StreamRef, end: StoredEnd, *, ttl_s: int
) -> None:
    script = client.register_script(_APPEND_LUA)
    for _ in range(5):  # the buffer moved under us: read it again
        raw = client.lrange(names.buffer, 0, -1)
        events = [decode_event(item) for item in raw]
        missing = _missing(ref, events, end)
        tails = [chunk_tail(json.dumps(c, separators=(",", ":"))) for c in missing]
        tails.append(done_tail(end.status, end.error))
        head = _head(ref, STORE_EPOCH)
        encoded = [f"{head}{len(raw) + n}{tail}" for n, tail in enumerate(tails)]
        sent = _append(
            script, names, encoded, epoch=STORE_EPOCH, expected=len(raw), ttl_s=ttl_s,
            seal=True, strict=True,
        )  # fmt: skip
        if sent.outcome is not Outcome.MOVED:
            return


def _missing(ref: StreamRef, events: list[StreamEvent], end: StoredEnd) -> list[dict[str, Any]]:
    if end.reply is None:
        return []
    chunks = [event.chunk for event in events if event.chunk is not None]
    finished = end.status == Status.COMPLETED
    if chunks:
        rest = replay.suffix(chunks, end.reply, finished=finished, base=end.base)
    elif end.base is None:
        return replay.render(end.reply, finished=finished)
    else:
        rest = replay.extension(end.reply, end.base, finished=finished)
    if rest is None:
        log.warning("stream of request %s does not lead to its stored reply", ref.request_id)
        return []
    return rest


def stored_by_attempt(client: redis.Redis, keys: Keys, ref: StreamRef) -> bool:
    """Whether the turn's attempt stored its reply after its stream was ended from the
    database (``StreamWriter.done``). Raises redis errors."""
    return bool(client.hexists(_Keys.of(keys, ref).state, "stored"))


def forget(client: redis.Redis, keys: Keys, ref: StreamRef, end: StoredEnd, *, ttl_s: int) -> None:
    """Delete a turn's stream (its submission was deleted). Its live readers get ``end`` as
    the ``done`` after the last event (published only: nothing of the stream is kept), and
    its state stays, sealed, for ``ttl_s``, with its revocation flag until that expires: an
    attempt still running it (cancelled just before the delete, its flag not read yet) finds
    the stream sealed at its next append and stops, as for a cancel, instead of writing the
    stream back and running on. Raises ``BrokerUnavailableError``."""
    names = _Keys.of(keys, ref)
    with broker_errors("deleting a stream"):
        length = client.llen(names.buffer)
        done = f"{_head(ref, STORE_EPOCH)}{length}{done_tail(end.status, end.error)}"
        with client.pipeline() as pipe:
            pipe.delete(names.buffer, names.state)
            pipe.hset(names.state, "sealed", "1")
            pipe.expire(names.state, ttl_s)
            pipe.publish(names.channel, done)
            pipe.execute()


# -- reading -----------------------------------------------------------------------------------


def buffered_events(
    client: redis.Redis, keys: Keys, ref: StreamRef, *, after_seq: int = -1
) -> list[StreamEvent]:
    """The buffer's events with seq > after_seq, in order."""
    raw = client.lrange(keys.stream_buffer(ref.agent, ref.turn_id), after_seq + 1, -1)
    return [decode_event(item) for item in raw]


class _Follower:
    """State of one reader: the last seq delivered, the deadline, the rebuild watch."""

    def __init__(self, ref: StreamRef, after_seq: int, timeout_s: float | None) -> None:
        self.ref = ref
        self.last_seq = after_seq
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.finished = False  # the done was delivered, or the stream ended at last_seq
        self.ended_at_seq: int | None = None  # last seq seen when the database said "ended"
        self.last_attempt: int | None = None  # who wrote the event at last_seq (delivered here)

    def accept(self, event: StreamEvent) -> bool:
        if event.request_id != self.ref.request_id or event.seq <= self.last_seq:
            return False
        self.last_seq = event.seq
        self.last_attempt = event.attempt or 0
        self.finished = event.done
        return True

    def check_numbering(self, event: StreamEvent) -> None:
        """Raise ``StreamResetError`` when ``event``, at or before the last seq delivered,
        was written by a later attempt than the event delivered there: the buffer was lost
        and written again from seq 0 by a recovered attempt, or rebuilt from the database,
        while this reader read it (seqs grow with the attempt that wrote them in one
        numbering), so what comes next would not continue what it delivered."""
        if self.last_attempt is None or event.seq > self.last_seq:
            return
        if (event.attempt or 0) > self.last_attempt:
            raise StreamResetError(self.ref.request_id, self.last_seq, None)

    def remaining_s(self, poll_s: float) -> float:
        if self.deadline is None:
            return poll_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"stream of request {self.ref.request_id} did not finish in time "
                f"(last seq {self.last_seq})"
            )
        return min(poll_s, left)


@dataclass(frozen=True)
class _Reading:
    client: redis.Redis
    keys: Keys
    ref: StreamRef
    stored: StoredTurn | None
    ttl_s: int


def follow(
    client: redis.Redis,
    keys: Keys,
    ref: StreamRef,
    *,
    after_seq: int | None = None,
    timeout_s: float | None = None,
    poll_s: float = 1.0,
    stored: StoredTurn | None = None,
    ttl_s: int = 86_400,
    live: bool = True,
) -> Iterator[StreamEvent]:
    """Replay then follow a turn's events until its ``done`` event.

    Subscribes (``live``) before it returns, so an unreachable Redis raises here, not at the
    first event. Raises TimeoutError when ``timeout_s`` passes first. Every ``poll_s`` without
    a message the buffer is re-read (an event published while the subscription was
    reconnecting is not lost) and ``stored`` is asked whether the turn ended: a finished turn
    whose stream has no events, or did not grow for a whole poll, is completed from the
    database. ``live=False`` yields what the stream holds now and returns.

    A reader resumed (``after_seq`` >= 0) exactly at the ``done`` event's seq gets nothing.
    One resumed past the end of a stream that has ended raises ``StreamResetError``: here, or
    while reading once it completed the stream from the database itself. Its position is from
    another numbering (the buffer was lost and rebuilt from seq 0) or bogus.
    """
    reading = _Reading(client, keys, ref, stored, ttl_s)
    state = _Follower(ref, -1 if after_seq is None else after_seq, timeout_s)
    if _at_the_end(reading, state.last_seq):
        return iter(())  # resumed at the end: nothing more will come
    if not live:
        return iter(list(_catch_up(reading, state)))
    pubsub = open_pubsub(client)
    try:
        pubsub.subscribe(keys.chunk_channel(ref.agent))
    except BaseException:
        pubsub.close()
        raise
    return _follow(reading, state, pubsub, poll_s)


def _follow(
    reading: _Reading, state: _Follower, pubsub: PubSub, poll_s: float
) -> Iterator[StreamEvent]:
    try:
        yield from _catch_up(reading, state)
        while not state.finished:
            message = pubsub.get_message(timeout=state.remaining_s(poll_s))
            if message is None:
                yield from _catch_up(reading, state, idle=True)
                continue
            yield from _deliver_live(reading, state, message)
    finally:
        pubsub.close()


def _at_the_end(reading: _Reading, seq: int) -> bool:
    """Whether a reader resumed after ``seq`` (>= 0) has nothing more to read: the stream
    ended (its last event is ``done``) at ``seq``. Raises ``StreamResetError`` when it ended
    before ``seq``, a position the stream never reached."""
    if seq < 0:
        return False
    ref = reading.ref
    last = reading.client.lindex(reading.keys.stream_buffer(ref.agent, ref.turn_id), -1)
    if last is None:
        return False
    event = decode_event(last)
    if not event.done or event.seq > seq:
        return False
    if event.seq < seq:
        raise StreamResetError(ref.request_id, seq, event.seq)
    return True


def _catch_up(
    reading: _Reading, state: _Follower, *, idle: bool = False, rebuild: bool = True
) -> Iterator[StreamEvent]:
    events = _events_after(reading, state)
    for event in events:
        if state.accept(event):
            yield event
            if state.finished:
                return
    if rebuild and not state.finished and _rebuilt(reading, state, idle=idle, grew=bool(events)):
        yield from _catch_up(reading, state, rebuild=False)
        if not state.finished and _at_the_end(reading, state.last_seq):
            state.finished = True  # the stream ended exactly where this reader resumed


def _events_after(reading: _Reading, state: _Follower) -> list[StreamEvent]:
    """The buffer's events after the reader's position; once it delivered one here, read
    from that one on, to check the numbering did not change under it (the same round trip)."""
    checked = state.last_attempt is not None and state.last_seq >= 0
    after = state.last_seq - 1 if checked else state.last_seq
    events = buffered_events(reading.client, reading.keys, reading.ref, after_seq=after)
    if checked and events:
        state.check_numbering(events[0])
        return events[1:]
    return events


def _rebuilt(reading: _Reading, state: _Follower, *, idle: bool, grew: bool) -> bool:
    """Complete the stream from the database if the turn ended and the stream holds nothing,
    or did not grow between two idle polls that saw the end. True once it was written."""
    if reading.stored is None or grew:
        state.ended_at_seq = None
        return False
    fresh = state.last_seq < 0
    if not (fresh or idle):
        return False
    end = reading.stored()
    if end is None:
        state.ended_at_seq = None
        return False
    if not fresh and state.ended_at_seq != state.last_seq:
        state.ended_at_seq = state.last_seq  # give the writer one more poll to send its end
        return False
    seal_from_store(reading.client, reading.keys, reading.ref, end, ttl_s=reading.ttl_s)
    return True


def _deliver_live(
    reading: _Reading, state: _Follower, message: dict[str, Any]
) -> Iterator[StreamEvent]:
    event = decode_event(message["data"])
    if event.request_id != state.ref.request_id:
        return
    state.check_numbering(event)
    if event.seq > state.last_seq + 1:  # a gap: fill it from the buffer first
        yield from _catch_up(reading, state)
    if state.accept(event):
        yield event


def broker_errors_mapped(start: Callable[[], Iterator[StreamEvent]]) -> Iterator[StreamEvent]:
    """Start reading a stream and re-raise Redis failures, when starting (at once) or while
    reading, as ``BrokerUnavailableError``."""
    try:
        events = start()
    except redis.RedisError as error:
        raise _unavailable(error) from error
    return _mapped(events)


def _mapped(events: Iterator[StreamEvent]) -> Iterator[StreamEvent]:
    try:
        yield from events
    except redis.RedisError as error:
        raise _unavailable(error) from error


def _unavailable(error: redis.RedisError) -> BrokerUnavailableError:
    return BrokerUnavailableError(f"Redis unavailable while reading a stream: {error}")


def follow_agent(
    client: redis.Redis, keys: Keys, agent: str, *, timeout_s: float | None = None
) -> Iterator[StreamEvent]:
    """Every event of every request of one agent, live (no replay), until ``timeout_s``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pubsub = open_pubsub(client)
    try:
        pubsub.subscribe(keys.chunk_channel(agent))
        while deadline is None or time.monotonic() < deadline:
            wait_s = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            message = pubsub.get_message(timeout=wait_s)
            if message is not None:
                yield decode_event(message["data"])
    finally:
        pubsub.close()
