"""SPEC §7 streaming: replay buffer + pub/sub, per-request seq, no gap and no duplicate."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from tests.apps.agents import Recorder
from tests.support.builders import buffer_key, directive, user, wait_for_status, wait_until
from tests.support.hung_tools import HUNG, TOOL_RUNS, UNHANG, Hanger
from tests.support.processes import free_port
from think_jobs import (
    BrokerUnavailableError,
    StreamEvent,
    StreamResetError,
    ThinkJobs,
    UnknownRequestError,
)
from think_jobs.engine.submissions import find_turn
from think_jobs.messages import message_text
from think_jobs.replay import assemble
from think_jobs.testing import worker

WORDS = " ".join(f"w{i}" for i in range(40))


def assert_complete_stream(events: list[StreamEvent]) -> None:
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[-1].done and events[-1].status == "completed"
    kinds = [e.chunk["type"] for e in events[:-1] if e.chunk]
    assert kinds[:3] == ["start", "start-step", "text-start"]
    assert kinds[-3:] == ["text-end", "finish-step", "finish"]
    text = "".join(e.chunk["delta"] for e in events if e.chunk and e.chunk["type"] == "text-delta")
    assert text == WORDS


def test_subscriber_joining_mid_stream_gets_every_chunk_once_in_order(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="s", text=WORDS, delay_s=0.01)])
    buffer = buffer_key(agent, result.submission_id)
    with worker(jobs):
        wait_until(lambda: jobs.redis.llen(buffer) >= 10)
        events = list(agent.stream(result.submission_id, timeout_s=30))
    assert_complete_stream(events)


def test_subscribing_after_the_end_replays_it_all(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="s", text=WORDS)])
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
    events = list(agent.stream(result.submission_id, timeout_s=5))
    assert_complete_stream(events)
    resumed = list(agent.stream(result.submission_id, after_seq=20, timeout_s=5))
    assert [e.seq for e in resumed] == list(range(21, len(events)))


def lose_the_stream(jobs: ThinkJobs, agent: Recorder, request_id: str) -> None:
    """What Redis restarted empty (or the buffer's TTL) leaves of a turn's stream: nothing."""
    turn = find_turn(jobs.services, agent, request_id)
    assert turn is not None
    buffer = jobs.keys.stream_buffer(agent.address, turn.id)
    assert jobs.redis.delete(buffer, jobs.keys.stream_state(agent.address, turn.id)) == 2


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_stream_resumed_past_its_rebuilt_end_raises_stream_reset(jobs: ThinkJobs) -> None:
    """The buffer of a finished turn is lost; the stream a reader rebuilds from the stored
    reply is numbered from 0 again and is shorter. A reader resuming with a position from the
    old numbering past that end is told so (before 2026-12-07: TimeoutError, then [] forever,
    never a done)."""
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="s", text=WORDS)])
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
    assert len(list(agent.stream(result.submission_id, timeout_s=5))) > 21
    lose_the_stream(jobs, agent, result.submission_id)
    resumed = agent.stream(result.submission_id, after_seq=20, timeout_s=10)  # nothing yet
    with pytest.raises(StreamResetError) as raised:
        list(resumed)  # this reader rebuilds the stream: its done is before seq 20
    end = raised.value.ended_at
    assert end is not None  # resumed past the end, not numbered again while read
    assert (raised.value.request_id, raised.value.after_seq) == (result.submission_id, 20)
    assert str(raised.value) == (
        f"stream of request {result.submission_id!r} was resumed after seq 20, but it ended "
        f"at seq {end}: the position is from an older numbering of the stream (its buffer "
        "was lost and rebuilt from the stored reply) or bogus; read the stream again from "
        "its start (after_seq=None, no Last-Event-ID) or the reply from get_messages()"
    )
    with pytest.raises(StreamResetError, match="resumed after seq 20, but it ended at seq"):
        agent.stream(result.submission_id, after_seq=20, timeout_s=10)  # at call time now
    assert list(agent.stream(result.submission_id, after_seq=end, timeout_s=5)) == []
    rebuilt = list(agent.stream(result.submission_id, timeout_s=5))
    assert [e.seq for e in rebuilt] == list(range(end + 1)) and rebuilt[-1].done
    deltas = [e.chunk["delta"] for e in rebuilt if e.chunk and e.chunk["type"] == "text-delta"]
    assert "".join(deltas) == WORDS == message_text(agent.get_messages()[-1])


def test_a_bogus_position_on_a_finished_stream_raises_at_call_time(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="s", text="short")])
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
    end = list(agent.stream(result.submission_id, timeout_s=5))[-1].seq
    for live in (True, False):
        with pytest.raises(StreamResetError, match=f"after seq 10000, but it ended at seq {end}"):
            agent.stream(result.submission_id, after_seq=10_000, timeout_s=5, live=live)
        assert list(agent.stream(result.submission_id, after_seq=end, live=live)) == []


def test_stream_chunks_use_ai_sdk_wire_keys(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="s", text="hi")])
    with worker(jobs):
        events = list(agent.stream(result.submission_id, timeout_s=20))
    start = events[0].chunk
    assert start is not None and start["type"] == "start" and "messageId" in start
    stored = agent.get_messages()[-1]
    assert start["messageId"] == stored.id  # the streamed message is the stored message
    raw = jobs.redis.lrange(buffer_key(agent, result.submission_id), 0, 0)
    assert json.loads(raw[0])["chunk"] == {"type": "start", "messageId": stored.id}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_turn_cancelled_inside_a_slow_tool_stores_the_reply_its_reader_saw(
    jobs: ThinkJobs, gates: None
) -> None:
    """The user stops a turn while its tool runs: a reader sees the turn ended in the
    database and no chunk coming, and ends the stream from there. The tool's output that
    comes back after that end is in no stream, so it is not stored either: the stored reply
    is the one the reader's client holds (before 2026-12-07 it held the output too)."""
    jobs.register(Hanger)
    agent = jobs.get_agent(Hanger, "stopped-in-a-tool")
    first = agent.submit_messages([user("hang")])
    with worker(jobs):
        assert HUNG.wait(30)
        agent.cancel_submission(first.submission_id)
        events = list(agent.stream(first.submission_id, timeout_s=20))
        UNHANG.set()  # the tool returns into an attempt whose stream has ended
        second = agent.submit_messages([user("next")])  # runs once the first one's write is in
        wait_for_status(agent, second.submission_id, "completed")
    assert events[-1].done and events[-1].status == "aborted"
    assert TOOL_RUNS == ["hang"]
    messages = agent.get_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    chunks = [event.chunk for event in events if event.chunk is not None]
    assert assemble(chunks, messages[1].id).parts == messages[1].parts
    assert [getattr(p, "state", None) for p in messages[1].parts] == [None, "input-available"]
    assert message_text(messages[3]) == "ok"


def test_subscribe_follows_every_request_of_an_agent_live(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    seen: list[StreamEvent] = []
    ready = threading.Event()

    def follow() -> None:
        stream = agent.subscribe(timeout_s=30)
        ready.set()
        for event in stream:
            seen.append(event)
            if sum(1 for e in seen if e.done) == 2:
                return

    thread = threading.Thread(target=follow)
    thread.start()
    ready.wait(5)
    wait_until(lambda: jobs.redis.pubsub_numsub(jobs.keys.chunk_channel(agent.address))[0][1] >= 1)
    first = agent.submit_messages([directive(label="1", text="one")])
    second = agent.submit_messages([directive(label="2", text="two")])
    with worker(jobs):
        thread.join(30)
    assert [e.request_id for e in seen if e.done] == [first.submission_id, second.submission_id]


def test_reading_a_stream_without_redis_raises_broker_unavailable(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    agent = jobs.get_agent(Recorder, "a")
    accepted = agent.submit_messages([directive(label="s", text="hi")])  # the row is the record
    with pytest.raises(BrokerUnavailableError, match="Redis unavailable") as raised:
        list(agent.stream(accepted.submission_id, timeout_s=1))
    assert raised.value.__cause__ is not None


def test_streaming_an_unknown_request_says_so(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    with pytest.raises(UnknownRequestError, match="no request 'nope' for agent Recorder:a"):
        agent.stream("nope")
