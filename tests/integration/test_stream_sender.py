"""Chunks of many turns in one round trip while the process is busy (``transport.sender``),
against a Redis server of the test's own.

While two or more chunk sends are in flight in the process (``BUSY_AT``), a writer hands its
chunk to the process's sender thread, which sends every writer's due chunks in one pipelined
round trip, each through the same fenced append script. The tests make the process busy the
way real sends do (``StreamSender.sending``) and give each writer a sender of the test's own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import ExitStack

import redis

from tests.support.builders import PATIENCE_S, wait_until
from tests.support.processes import PrivateRedis
from think_jobs.keys import Keys
from think_jobs.transport.sender import BUSY_AT, StreamSender
from think_jobs.transport.streams import StreamRef, StreamWriter, buffered_events

KEYS = Keys("sender")


def ref(n: int) -> StreamRef:
    return StreamRef(f"Agent:a{n}", f"req-{n}", n)


def delta(text: str) -> str:
    return json.dumps({"type": "text-delta", "id": "t", "delta": text})


def writer(
    client: redis.Redis,
    sender: StreamSender,
    at: StreamRef,
    *,
    epoch: int = 1,
    may_send: Callable[[], bool] = lambda: True,
) -> StreamWriter:
    return StreamWriter(
        client, KEYS, at, epoch=epoch, ttl_s=60, prefix=[], may_send=may_send, sender=sender
    )


def texts(client: redis.Redis, at: StreamRef) -> list[object]:
    events = buffered_events(client, KEYS, at)
    assert [e.seq for e in events] == list(range(len(events)))
    return [(e.chunk or {}).get("delta", "done" if e.done else None) for e in events]


def busy(sender: StreamSender, stack: ExitStack) -> None:
    """As many chunk sends in flight as make the process busy."""
    for _ in range(BUSY_AT):
        stack.enter_context(sender.sending())


def test_a_lone_chunk_of_a_process_not_busy_goes_out_at_once(client: redis.Redis) -> None:
    sender = StreamSender()
    stream = writer(client, sender, ref(1))
    stream.chunk(delta("now"))
    assert texts(client, ref(1)) == ["now"]  # sent by its own thread, before chunk() returned
    assert sender.passes == 0


def test_a_busy_process_sends_many_turns_chunks_in_one_round_trip(client: redis.Redis) -> None:
    """The first writer's lease check holds the sender's first pass, so the other nineteen
    writers' chunks all wait for the next: one round trip carries them all."""
    sender = StreamSender()
    checking, go_on = threading.Event(), threading.Event()

    def slow_lease() -> bool:
        checking.set()
        return go_on.wait(PATIENCE_S)

    first = writer(client, sender, ref(0), may_send=slow_lease)
    others = [writer(client, sender, ref(n)) for n in range(1, 20)]
    with ExitStack() as stack:
        busy(sender, stack)
        first.chunk(delta("first"))
        assert checking.wait(PATIENCE_S)
        for n, stream in enumerate(others, start=1):
            stream.chunk(delta(f"chunk {n}"))
        assert all(buffered_events(client, KEYS, ref(n)) == [] for n in range(20))
        go_on.set()
        wait_until(lambda: all(buffered_events(client, KEYS, ref(n)) for n in range(20)))
    assert sender.batches == 2  # the first writer's, then everyone else's together
    assert texts(client, ref(0)) == ["first"]
    for n, stream in enumerate(others, start=1):
        assert texts(client, ref(n)) == [f"chunk {n}"]
        assert stream.done("completed", None)
        assert texts(client, ref(n)) == [f"chunk {n}", "done"]


def test_a_stale_attempt_handed_to_the_sender_is_refused_and_learns_it(
    client: redis.Redis,
) -> None:
    sender = StreamSender()
    old = writer(client, sender, ref(1), epoch=1)
    new = writer(client, sender, ref(1), epoch=2, may_send=lambda: True)
    assert new.take_over()
    new.chunk(delta("new"))  # not busy yet: at once
    with ExitStack() as stack:
        busy(sender, stack)
        old.chunk(delta("stale"))
        wait_until(lambda: old.lost)
    assert texts(client, ref(1)) == ["new"]
    assert not new.lost


def test_the_sender_never_sends_what_the_lease_does_not_allow(client: redis.Redis) -> None:
    """A lease that says no leaves the chunk to the attempt's own thread, which decides."""
    sender = StreamSender()
    stream = writer(client, sender, ref(1), may_send=lambda: False)
    with ExitStack() as stack:
        busy(sender, stack)
        stream.chunk(delta("unfenced"))
        wait_until(lambda: sender.passes >= 1)
    assert buffered_events(client, KEYS, ref(1)) == [] and not stream.lost
    assert stream.done("completed", None)  # after the fenced final write: sent, in order
    assert texts(client, ref(1)) == ["unfenced", "done"]


def test_a_batch_that_cannot_reach_redis_keeps_its_chunks_for_the_next_send(
    server: PrivateRedis, client: redis.Redis
) -> None:
    sender = StreamSender()
    stream = writer(client, sender, ref(1))
    server.stop()
    with ExitStack() as stack:
        busy(sender, stack)
        stream.chunk(delta("kept"))
        wait_until(lambda: sender.passes >= 1)
    server.start()
    assert stream.done("completed", None)
    assert texts(client, ref(1)) == ["kept", "done"]
