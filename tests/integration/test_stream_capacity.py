"""Streams when Redis connections run short (issue 19): no chunk is ever silently dropped.

A real in-process worker runs more turns at once than its stream pool has connections (or
holds none at all for a while); every turn's public stream, read live with ``agent.stream``
from before the turn started, must equal its stored reply: contiguous seqs, one ``done`` as
the last event, every event written live by the turn's own attempt (none rebuilt from the
database after the fact).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import REGISTRY

from tests.support.builders import buffer_key, user, wait_for_status
from think_jobs import ModelRequest, StreamEvent, Think, ThinkJobs
from think_jobs.messages import message_text
from think_jobs.testing import worker
from think_jobs.transport.clients import STREAM_HEADROOM

TURNS = 8
WORDS = [f"w{i} " for i in range(30)]
_together = threading.Barrier(TURNS, timeout=60)  # every turn is mid-stream at once
_progress = threading.Event()  # set by the Starved turn after its tenth word
_go_on = threading.Event()  # ... which then waits for this


def _words(request: ModelRequest, after_first: Any = None) -> Iterator[dict[str, Any]]:
    yield {"type": "text-start", "id": "t0"}
    for count, word in enumerate(WORDS):
        yield {"type": "text-delta", "id": "t0", "delta": word}
        if count == 0 and after_first is not None:
            after_first()
        if request.signal.wait(0.01):
            return
    yield {"type": "text-end", "id": "t0"}


class Together:
    """Streams its first word, waits until every turn of the test has, then the rest."""

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        yield from _words(request, after_first=_together.wait)


class Crowded(Think):
    def get_model(self) -> Together:
        return Together()


class Marking:
    """Streams ten words, says so, waits for the test to let it go on, streams the rest."""

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        for count, chunk in enumerate(_words(request)):
            yield chunk
            if count == 10:
                _progress.set()
                _go_on.wait(60)


class Starved(Think):
    def get_model(self) -> Marking:
        return Marking()


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _submit(agent: Think) -> str:
    request_id = str(uuid.uuid4())
    agent.submit_messages([user("go")], submission_id=request_id)
    return request_id


def _read_live(pool: ThreadPoolExecutor, agent: Think, request_id: str) -> Any:
    """Subscribe now (``agent.stream`` subscribes before it returns), read in a thread."""
    events = agent.stream(request_id, timeout_s=120)
    return pool.submit(list, events)


def assert_streamed_as_stored(agent: Think, events: list[StreamEvent]) -> None:
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.done for e in events].count(True) == 1 and events[-1].done
    assert events[-1].status == "completed"
    assert {e.attempt for e in events} == {1}  # all written live, none rebuilt from the store
    chunks = [e.chunk for e in events if e.chunk is not None]
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == "".join(WORDS) == message_text(agent.get_messages()[-1])


def test_more_streaming_turns_than_stream_connections_lose_nothing(
    make_jobs: Any,
) -> None:
    jobs: ThinkJobs = make_jobs(redis_stream_connections=2)
    agents = [jobs.get_agent(Crowded, f"c{i}") for i in range(TURNS)]
    waits_before = _metric("think_jobs_stream_connection_waits_total")
    with ThreadPoolExecutor(TURNS) as readers:
        reading = [(agent, _read_live(readers, agent, _submit(agent))) for agent in agents]
        with worker(jobs, concurrency=TURNS):
            results = [(agent, future.result(timeout=120)) for agent, future in reading]
    assert jobs.clients.stream_connections == 2  # a configured size is kept
    for agent, events in results:
        assert_streamed_as_stored(agent, events)
    # one turn held the one lendable connection; the others wrote through the reserved one
    waits = _metric("think_jobs_stream_connection_waits_total") - waits_before
    assert waits == TURNS - 1


def test_a_turn_that_finds_no_connection_waits_and_sends_its_chunks_later(
    make_jobs: Any,
) -> None:
    jobs: ThinkJobs = make_jobs(redis_stream_connections=1, broker_publish_timeout_s=0.2)
    agent = jobs.get_agent(Starved, "s")
    _progress.clear()
    _go_on.clear()
    pool = jobs.clients.stream.connection_pool
    taken = pool.get_connection()  # the pool's only connection: every publish must wait
    with ThreadPoolExecutor(1) as readers:
        request_id = _submit(agent)
        reading = _read_live(readers, agent, request_id)
        with worker(jobs):
            assert _progress.wait(60)  # the turn streamed ten words meanwhile...
            assert jobs.redis.llen(buffer_key(agent, request_id)) == 0  # ...none sent yet
            pool.release(taken)
            _go_on.set()
            wait_for_status(agent, request_id, "completed")
            events = reading.result(timeout=120)
    assert_streamed_as_stored(agent, events)


def test_a_worker_sizes_its_stream_pool_from_its_concurrency(make_jobs: Any) -> None:
    jobs: ThinkJobs = make_jobs()
    with worker(jobs, concurrency=3):
        assert jobs.clients.stream_connections == 100  # never below redis-py's default
    big: ThinkJobs = make_jobs()
    with worker(big, concurrency=120):
        assert big.clients.stream_connections == 120 + STREAM_HEADROOM
        assert big.redis.connection_pool.max_connections == 120 + STREAM_HEADROOM


def test_a_turn_client_given_back_serves_the_next_turn_with_its_connection(
    make_jobs: Any,
) -> None:
    clients = make_jobs().clients
    first = clients.turn_stream()
    first.ping()
    connection = first.connection
    clients.release(first)
    again = clients.turn_stream()
    assert again is first and again.connection is connection  # no new client, same socket
    assert again.ping()
    other = clients.turn_stream()  # the first is held again: another one is made
    assert other is not first
    clients.release(again)
    clients.release(other)
    clients.size_for_concurrency(500)  # a bigger pool replaces the old one...
    fresh = clients.turn_stream()
    assert fresh is not first and fresh is not other  # ...whose idle clients were closed
    assert first.connection is None and fresh.connection_pool.max_connections == 508
    clients.release(fresh)


def test_new_connections_carry_the_identity_built_once_per_process(
    make_jobs: Any, monkeypatch: Any
) -> None:
    """redis-py 8 reads its version from the package metadata for each connection it makes
    unless told (~1 ms of CPU each): ours are told, and still say which redis-py they are."""
    import importlib.metadata

    import redis

    def no_lookup(name: str) -> str:
        raise AssertionError(f"package metadata read for {name!r} while connecting")

    clients = make_jobs().clients
    monkeypatch.setattr(importlib.metadata, "version", no_lookup)
    turn = clients.turn_stream()
    assert turn.ping() and clients.redis.ping() and clients.stream.ping()
    pool = clients.redis.connection_pool
    general = pool.get_connection()
    try:
        for connection in (turn.connection, general):
            assert connection is not None
            assert connection.driver_info.name == "redis-py"
            assert connection.driver_info.lib_version == redis.__version__
    finally:
        pool.release(general)
        clients.release(turn)
