"""Chunks over Redis: a per-request replay buffer plus one pub/sub channel per agent.

Writers (the process running a turn) append each event to the request's LIST (index == seq)
and PUBLISH it on the agent's channel in one pipelined round trip, which also reads the
request's revocation flag. Turns of one agent never overlap, so the agent channel carries one
request at a time and a reader filters by request id.

Readers subscribe first, then replay the buffer, then follow live, dropping seqs already seen:
"snapshot then subscribe" would lose chunks published in between.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import redis
from redis.client import PubSub
from redis.commands.core import Script

from think_jobs.errors import BrokerUnavailableError
from think_jobs.keys import Keys
from think_jobs.results import StreamEvent

log = logging.getLogger(__name__)

_RETRY_S = 1.0  # after a failed publish, skip publishing this long


def open_pubsub(client: redis.Redis) -> PubSub:
    """A pub/sub connection that skips subscribe confirmations."""
    pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    return pubsub


def encode_chunk_event(request_id: str, seq: int, chunk_json: str) -> str:
    return f'{{"request_id":{json.dumps(request_id)},"seq":{seq},"chunk":{chunk_json}}}'


def encode_done_event(request_id: str, seq: int, status: str, error: str | None) -> str:
    event = {"request_id": request_id, "seq": seq, "done": True, "status": status, "error": error}
    return json.dumps(event)


def decode_event(raw: bytes | str) -> StreamEvent:
    return StreamEvent.model_validate_json(raw)


# Appends events to a request's buffer and publishes them, in order, in one server-side step;
# returns whether the request's revocation flag is set. KEYS: buffer, flag. ARGV: channel, TTL
# in seconds (0: leave the TTL alone), events...
_PUBLISH_LUA = """
for i = 3, #ARGV do
  redis.call('RPUSH', KEYS[1], ARGV[i])
  redis.call('PUBLISH', ARGV[1], ARGV[i])
end
if tonumber(ARGV[2]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return redis.call('EXISTS', KEYS[2])
"""


class StreamWriter:
    """Appends one request's events; never raises because Redis is unavailable.

    Framing chunks (``start``, ``text-start``, ``finish``...) may be deferred: they go out with
    the next chunk that is not deferred, in order, in the same round trip. Content chunks go
    out at once, so cancellation still stops a turn within one chunk. The buffer's TTL is set
    by the first send and refreshed by ``done``.

    A turn the model completed must not fail because its stream could not be published: the
    database record is the truth. After a failure, publishing is retried at most once a second
    and readers see the gap as missing seqs.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        agent: str,
        request_id: str,
        *,
        ttl_s: int,
        start_seq: int = 0,
    ) -> None:
        self._script: Script = client.register_script(_PUBLISH_LUA)  # EVALSHA, EVAL on a miss
        self._request_id = request_id
        self._buffer = keys.stream_buffer(agent, request_id)
        self._channel = keys.chunk_channel(agent)
        self._revoked = keys.revoked(agent, request_id)
        self._ttl_s = ttl_s
        self.next_seq = start_seq
        self._pending: list[str] = []
        self._expiry_set = False
        self._failed_at: float | None = None
        self.revoked = False

    def chunk(self, chunk_json: str, *, defer: bool = False) -> None:
        """Publish one chunk (already AI SDK JSON), or queue it behind the next; updates
        ``revoked`` whenever it sends."""
        self._pending.append(encode_chunk_event(self._request_id, self.next_seq, chunk_json))
        self.next_seq += 1
        if not defer:
            self._flush()

    def done(self, status: str, error: str | None) -> None:
        self._pending.append(encode_done_event(self._request_id, self.next_seq, status, error))
        self.next_seq += 1
        self._expiry_set = False  # the final send refreshes the TTL
        self._flush(force=True)

    def _flush(self, *, force: bool = False) -> None:
        failed_at = self._failed_at
        recently_failed = failed_at is not None and time.monotonic() - failed_at < _RETRY_S
        events, self._pending = self._pending, []
        if not events or (recently_failed and not force):
            return
        try:
            self.revoked = self._send(events) or self.revoked
        except redis.RedisError as error:
            if self._failed_at is None:
                log.warning("stream publish failed for %s: %s", self._request_id, error)
            self._failed_at = time.monotonic()
            return
        self._failed_at = None

    def _send(self, events: list[str]) -> bool:
        """One command: append, publish, (set the TTL,) read the revocation flag."""
        ttl_s = 0 if self._expiry_set else self._ttl_s
        keys = [self._buffer, self._revoked]
        revoked = self._script(keys=keys, args=[self._channel, ttl_s, *events])
        self._expiry_set = True
        return bool(revoked)


def next_seq_of(client: redis.Redis, keys: Keys, agent: str, request_id: str) -> int:
    """Where a continuation of ``request_id`` resumes numbering (the buffer's length)."""
    return int(client.llen(keys.stream_buffer(agent, request_id)))


def buffered_events(
    client: redis.Redis, keys: Keys, agent: str, request_id: str, *, after_seq: int = -1
) -> list[StreamEvent]:
    """The replay buffer's events with seq > after_seq, in order."""
    buffer = keys.stream_buffer(agent, request_id)
    raw = client.lrange(buffer, after_seq + 1, -1)
    events = [decode_event(item) for item in raw]
    if events and events[0].seq != after_seq + 1:  # buffer lost part of its head: scan it all
        events = [decode_event(item) for item in client.lrange(buffer, 0, -1)]
    return [event for event in events if event.seq > after_seq]


class _Follower:
    """State of one reader: the last seq delivered, and the deadline."""

    def __init__(self, request_id: str, after_seq: int, timeout_s: float | None) -> None:
        self.request_id = request_id
        self.last_seq = after_seq
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.finished = False

    def accept(self, event: StreamEvent) -> bool:
        if event.request_id != self.request_id or event.seq <= self.last_seq:
            return False
        self.last_seq = event.seq
        self.finished = event.done
        return True

    def remaining_s(self, poll_s: float) -> float:
        if self.deadline is None:
            return poll_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"stream of request {self.request_id} did not finish in time "
                f"(last seq {self.last_seq})"
            )
        return min(poll_s, left)


def follow(
    client: redis.Redis,
    keys: Keys,
    agent: str,
    request_id: str,
    *,
    after_seq: int | None = None,
    timeout_s: float | None = None,
    poll_s: float = 1.0,
) -> Iterator[StreamEvent]:
    """Replay then follow a request's events until its ``done`` event.

    Raises TimeoutError when ``timeout_s`` passes first. Every ``poll_s`` without a message the
    buffer is re-read, so an event published while the subscription was reconnecting is not lost.
    """
    state = _Follower(request_id, -1 if after_seq is None else after_seq, timeout_s)
    pubsub = open_pubsub(client)
    try:
        pubsub.subscribe(keys.chunk_channel(agent))
        yield from _catch_up(client, keys, agent, state)
        while not state.finished:
            message = pubsub.get_message(timeout=state.remaining_s(poll_s))
            if message is None:
                yield from _catch_up(client, keys, agent, state)
                continue
            yield from _deliver_live(client, keys, agent, state, message)
    finally:
        pubsub.close()


def _catch_up(
    client: redis.Redis, keys: Keys, agent: str, state: _Follower
) -> Iterator[StreamEvent]:
    for event in buffered_events(client, keys, agent, state.request_id, after_seq=state.last_seq):
        if state.accept(event):
            yield event
            if state.finished:
                return


def _deliver_live(
    client: redis.Redis, keys: Keys, agent: str, state: _Follower, message: dict[str, Any]
) -> Iterator[StreamEvent]:
    event = decode_event(message["data"])
    if event.request_id != state.request_id:
        return
    if event.seq > state.last_seq + 1:  # a gap: fill it from the buffer first
        yield from _catch_up(client, keys, agent, state)
    if state.accept(event):
        yield event


def broker_errors_mapped(events: Iterator[StreamEvent]) -> Iterator[StreamEvent]:
    """Re-raise Redis failures while reading a stream as ``BrokerUnavailableError``."""
    try:
        yield from events
    except redis.RedisError as error:
        raise BrokerUnavailableError(
            f"Redis unavailable while reading a stream: {error}"
        ) from error


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
