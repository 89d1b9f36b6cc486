"""Coalesced stream writes (issue 19), against a Redis server of the test's own.

A chunk that comes within a flush window of the writer's last send is held and goes out with
what follows in one append; the process's one flusher thread sends it when the window ends if
nothing follows. Script calls are counted by the server itself (``INFO commandstats``), which
is why each test has a Redis of its own. Windows here are long (a second or more) so that
"held" never depends on how fast this machine runs the next line.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

import pytest
import redis

from tests.support.builders import PATIENCE_S, wait_until
from tests.support.processes import PrivateRedis
from think_jobs.keys import Keys
from think_jobs.transport.streams import StreamRef, StreamWriter, buffered_events

REF = StreamRef("Agent:a", "req-1", 7)
KEYS = Keys("coalescing")
HELD_S = 60.0  # a window nothing in a test outlasts: held chunks go out only with done()
FLUSHED_S = 1.0  # a window the flusher ends while the test waits


def delta(text: str) -> str:
    return json.dumps({"type": "text-delta", "id": "t", "delta": text})


def writer(
    client: redis.Redis, window_s: float, may_send: Callable[[], bool] = lambda: True
) -> StreamWriter:
    return StreamWriter(
        client, KEYS, REF, epoch=1, ttl_s=60, prefix=[], may_send=may_send,
        flush_window_s=window_s,
    )  # fmt: skip


def texts(client: redis.Redis) -> list[object]:
    """The buffer's events as text, checking their seqs are 0, 1, 2... on the way."""
    events = buffered_events(client, KEYS, REF)
    assert [e.seq for e in events] == list(range(len(events)))
    return [(e.chunk or {}).get("delta", "done" if e.done else e.chunk) for e in events]


def script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


def buffered(client: redis.Redis) -> int:
    return int(client.llen(KEYS.stream_buffer(REF.agent, REF.turn_id)))


def test_a_burst_within_the_window_is_stored_in_order_by_one_append(
    client: redis.Redis,
) -> None:
    stream = writer(client, HELD_S)
    stream.chunk(delta("0"))
    assert buffered(client) == 1  # a lone chunk goes out at once
    before = script_calls(client)
    for n in range(1, 200):
        stream.chunk(delta(str(n)))
    assert buffered(client) == 1  # held: the last send was less than a window ago
    assert stream.done("completed", None)
    assert texts(client) == [str(n) for n in range(200)] + ["done"]
    assert script_calls(client) - before == 1  # 199 chunks and the done: one call


def test_without_a_window_every_chunk_is_sent_alone(client: redis.Redis) -> None:
    stream = writer(client, 0.0)
    stream.chunk(delta("0"))
    before = script_calls(client)  # after the first call (which loads the script)
    for n in range(1, 50):
        stream.chunk(delta(str(n)))
        assert buffered(client) == n + 1
    assert script_calls(client) - before == 49


def test_a_held_chunk_is_sent_by_the_flusher_without_a_further_chunk(
    client: redis.Redis,
) -> None:
    senders: list[str] = []

    def may_send() -> bool:
        senders.append(threading.current_thread().name)
        return True

    stream = writer(client, FLUSHED_S, may_send=may_send)
    stream.chunk(delta("a"))
    stream.chunk(delta("b"))
    stream.chunk(json.dumps({"type": "text-end", "id": "t"}), defer=True)
    wait_until(lambda: buffered(client) == 2, PATIENCE_S)
    assert texts(client) == ["a", "b"]  # the deferred framing chunk waits for done
    assert senders == [threading.current_thread().name, "think-jobs-stream-flusher"]
    assert stream.done("completed", None)
    assert texts(client)[2:] == [{"type": "text-end", "id": "t"}, "done"]


def test_a_writer_whose_lease_lapses_while_it_holds_chunks_sends_none_of_them(
    client: redis.Redis,
) -> None:
    valid = True
    refused = threading.Event()

    def may_send() -> bool:
        if not valid:
            refused.set()
        return valid

    stream = writer(client, FLUSHED_S, may_send=may_send)
    stream.chunk(delta("a"))
    stream.chunk(delta("b"))
    stream.chunk(delta("c"))
    valid = False
    assert refused.wait(PATIENCE_S)  # the flusher asked, was refused, and sent nothing
    stream.close()  # the attempt's own thread asks once more, and learns it is lost
    assert stream.lost
    assert texts(client) == ["a"]


def test_chunks_held_when_the_final_write_released_the_lease_go_out_with_done(
    client: redis.Redis,
) -> None:
    released = False
    refused = threading.Event()

    def may_send() -> bool:  # a lease given back says no, as a lapsed one does
        if released:
            refused.set()
        return not released

    stream = writer(client, FLUSHED_S, may_send=may_send)
    stream.chunk(delta("a"))
    stream.chunk(delta("b"))
    released = True  # the turn's final write committed and released the lease
    assert refused.wait(PATIENCE_S)  # the flusher was refused: b stays held, not lost
    assert stream.done("completed", None)
    assert texts(client) == ["a", "b", "done"]


def test_close_sends_what_is_held_and_then_nothing(client: redis.Redis) -> None:
    stream = writer(client, HELD_S)
    stream.chunk(delta("a"))
    stream.chunk(delta("b"))
    stream.chunk(json.dumps({"type": "finish-step"}), defer=True)
    stream.close()  # an interrupted attempt: what was held, not the framing after it
    assert texts(client) == ["a", "b"]


def test_nothing_is_sent_after_close(client: redis.Redis) -> None:
    stream = writer(client, 0.0)  # a chunk would go out at once
    stream.chunk(delta("a"))
    stream.close()
    stream.chunk(delta("late"))
    stream.close()
    assert texts(client) == ["a"]


def test_a_held_chunk_whose_send_failed_goes_out_after_the_back_off(
    server: PrivateRedis, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    stream = writer(client, FLUSHED_S)
    stream.chunk(delta("a"))
    server.stop()
    stream.chunk(delta("b"))  # held; the flusher's send fails, and b is kept
    wait_until(lambda: "stream publish failed" in caplog.text, PATIENCE_S)
    server.start()  # empty, as a Redis without persistence restarts
    wait_until(lambda: _buffered_or_zero(client) == 2, PATIENCE_S)
    assert texts(client) == ["a", "b"]  # written again from what the writer knew
    assert stream.done("completed", None)
    assert texts(client) == ["a", "b", "done"]


def _buffered_or_zero(client: redis.Redis) -> int:
    try:
        return buffered(client)
    except redis.RedisError:
        return 0


def test_one_flusher_thread_serves_every_writer(client: redis.Redis) -> None:
    streams = [
        StreamWriter(
            client, KEYS, StreamRef("Agent:a", f"r{n}", n), epoch=1, ttl_s=60, prefix=[],
            flush_window_s=FLUSHED_S,
        )
        for n in range(20)
    ]  # fmt: skip
    for stream in streams:
        stream.chunk(delta("a"))
        stream.chunk(delta("b"))
    key = KEYS.stream_buffer
    wait_until(lambda: all(client.llen(key("Agent:a", n)) == 2 for n in range(20)), PATIENCE_S)
    names = [thread.name for thread in threading.enumerate()]
    assert names.count("think-jobs-stream-flusher") == 1


def test_a_forked_child_flushes_with_a_flusher_of_its_own(server: PrivateRedis) -> None:
    parent = redis.Redis.from_url(server.url)
    first = writer(parent, FLUSHED_S)
    first.chunk(delta("a"))
    first.chunk(delta("b"))  # the parent's flusher thread is running now
    wait_until(lambda: buffered(parent) == 2, PATIENCE_S)
    pid = os.fork()
    if pid == 0:  # the child: the parent's flusher thread did not come along
        os._exit(_flush_in_child(server.url))
    _, status = os.waitpid(pid, 0)
    parent.close()
    assert os.waitstatus_to_exitcode(status) == 0


def _flush_in_child(url: str) -> int:
    try:
        client = redis.Redis.from_url(url)
        ref = StreamRef("Agent:a", "child", 8)
        stream = StreamWriter(client, KEYS, ref, epoch=1, ttl_s=60, prefix=[], flush_window_s=0.2)
        stream.chunk(delta("a"))
        stream.chunk(delta("b"))
        wait_until(lambda: client.llen(KEYS.stream_buffer(ref.agent, ref.turn_id)) == 2, 30)
        return 0
    except BaseException:
        return 1
