"""SSE: replay then live with no gap, Last-Event-ID resume, heartbeats, [DONE], disconnects."""

from __future__ import annotations

from collections.abc import Iterator

from flask import Flask
from flask.testing import FlaskClient

from tests.apps.agents import Recorder
from tests.support.builders import buffer_key, directive, user, wait_for_status
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL, SseEvent, agent_url, read_all, sse_events, stream_text
from think_jobs import ThinkJobs
from think_jobs.chunks import parse_chunk
from think_jobs.engine.submissions import find_turn
from think_jobs.testing import wait_until, worker
from web import create_app

WORDS = " ".join(f"w{i}" for i in range(30))


def stream_url(request_id: str) -> str:
    return agent_url(rest=f"/requests/{request_id}/stream")


def completed(client: FlaskClient, jobs: ThinkJobs, text: str = WORDS) -> str:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="s", text=text)])
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
    return result.submission_id


def assert_ai_sdk_stream(events: list[SseEvent], status: str) -> None:
    """What an AI SDK client reads: chunk JSON it knows, ids = seq, the status, then [DONE]."""
    data = [e for e in events if e.data is not None]
    assert data[-1].data == "[DONE]"
    chunks = [e.chunk for e in data[:-1]]
    for chunk in chunks:
        assert chunk is not None
        parse_chunk(chunk)  # raises on anything the protocol does not define
    assert chunks[-1] == {
        "type": "data-think-status",
        "data": {"status": status, "error": chunks[-1]["data"]["error"]},  # type: ignore[index]
        "transient": True,
    }


def test_replay_of_a_finished_turn(client: FlaskClient, web_jobs: ThinkJobs) -> None:
    request_id = completed(client, web_jobs)
    response = client.get(stream_url(request_id), headers=FULL)
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert "no-cache" in response.headers["Cache-Control"]
    events = read_all(response)
    ids = [int(e.id) for e in events if e.id is not None]
    assert ids == list(range(len(ids)))
    assert stream_text(events) == WORDS
    assert_ai_sdk_stream(events, "completed")
    assert events[0].data is None  # "retry:" first, so headers go out at once


def test_last_event_id_and_after_seq_resume(client: FlaskClient, web_jobs: ThinkJobs) -> None:
    request_id = completed(client, web_jobs)
    total = len([e for e in read_all(client.get(stream_url(request_id), headers=FULL)) if e.id])

    def first_id(last_event_id: str | None = None, after_seq: str | None = None) -> int:
        headers = FULL if last_event_id is None else {**FULL, "Last-Event-ID": last_event_id}
        query = {} if after_seq is None else {"after_seq": after_seq}
        response = client.get(stream_url(request_id), headers=headers, query_string=query)
        return int(next(e.id for e in read_all(response) if e.id is not None))

    assert first_id(last_event_id="5") == 6
    assert first_id(after_seq="9") == 10
    assert first_id(last_event_id="12", after_seq="3") == 13  # the later one wins
    garbage = client.get(stream_url(request_id), headers={**FULL, "Last-Event-ID": "garbage"})
    assert garbage.status_code == 400  # ASCII digits only (issue 15)
    last = client.get(stream_url(request_id), headers={**FULL, "Last-Event-ID": str(total - 1)})
    assert [e.data for e in read_all(last) if e.data] == ["[DONE]"]  # nothing left to send


def test_live_stream_follows_a_running_turn_to_its_cancellation(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="slow", text=WORDS, stall_after=3)])
    response = client.get(stream_url(result.submission_id), headers=FULL)
    events: list[SseEvent] = []
    with worker(web_jobs):
        reader = sse_events(response.iter_encoded())
        _read_until(reader, events, lambda: stream_text(events).count("w") == 3)
        cancel = agent_url(rest=f"/submissions/{result.submission_id}/cancel")
        assert client.post(cancel, headers=FULL).status_code == 200
        _read_until(reader, events, lambda: events[-1].data == "[DONE]")
    ids = [int(e.id) for e in events if e.id is not None]
    assert ids == list(range(len(ids)))  # no gap, no duplicate between replay and live
    assert stream_text(events) == "w0 w1 w2 "
    assert_ai_sdk_stream(events, "aborted")


def _read_until(reader: Iterator[SseEvent], into: list[SseEvent], done: object) -> None:
    for event in reader:
        into.append(event)
        if done():  # type: ignore[operator]
            return
    raise AssertionError("stream ended early")


def test_heartbeats_while_waiting_and_disconnect_closes_the_subscription(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([user("queued, no worker")])
    channel = web_jobs.keys.chunk_channel(agent.address)

    def subscribers() -> int:
        return int(web_jobs.redis.pubsub_numsub(channel)[0][1])

    response = client.get(stream_url(result.submission_id), headers=FULL)
    reader = sse_events(response.iter_encoded())
    assert next(reader).data is None  # retry
    ping = next(reader)
    assert ping.comments == ["ping"] and ping.data is None
    assert next(reader).comments == ["ping"]
    response.close()  # what the server does when the client went away
    wait_until(lambda: subscribers() == 0)


def test_a_stream_ends_at_its_maximum_duration_and_resumes(web_jobs: ThinkJobs) -> None:
    app = create_app(web_jobs, {**TEST_CONFIG, "THINK_JOBS_SSE_MAX_DURATION_S": 1.0})
    client = app.test_client()
    agent = web_jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="later", text="done later")])
    first = read_all(client.get(stream_url(result.submission_id), headers=FULL))
    assert all(e.data != "[DONE]" for e in first)  # ended without finishing: reconnect
    with worker(web_jobs):
        wait_for_status(agent, result.submission_id, "completed")
    resumed = read_all(client.get(stream_url(result.submission_id), headers=FULL))
    assert stream_text(resumed) == "done later"
    assert_ai_sdk_stream(resumed, "completed")


def test_a_finished_turn_whose_events_expired_still_ends(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    request_id = completed(client, web_jobs)
    agent = web_jobs.get_agent(Recorder, "a")
    web_jobs.redis.delete(buffer_key(agent, request_id))
    events = read_all(client.get(stream_url(request_id), headers=FULL))
    assert_ai_sdk_stream(events, "completed")


def lose_the_stream(jobs: ThinkJobs, request_id: str) -> None:
    """What Redis restarted empty (or the buffer's TTL) leaves of a turn's stream: nothing."""
    agent = jobs.get_agent(Recorder, "a")
    turn = find_turn(jobs.services, agent, request_id)
    assert turn is not None
    buffer = jobs.keys.stream_buffer(agent.address, turn.id)
    assert jobs.redis.delete(buffer, jobs.keys.stream_state(agent.address, turn.id)) == 2


def last_id(events: list[SseEvent]) -> int:
    return int([e.id for e in events if e.id is not None][-1])


def assert_reset(events: list[SseEvent], request_id: str, after: int, end: int) -> None:
    """The response ends with an AI SDK error chunk saying why and what to do, then [DONE]:
    no event of the stream, no status, and never a bare [DONE]."""
    data = [e for e in events if e.data is not None]
    assert [e.id for e in data] == [None, None] and data[1].data == "[DONE]"
    error = data[0].chunk
    assert error is not None and parse_chunk(error) is not None
    assert error == {"type": "error", "errorText": reset_text(request_id, after, end)}


def reset_text(request_id: str, after: int, end: int) -> str:
    return (
        f"stream of request {request_id!r} was resumed after seq {after}, but it ended at "
        f"seq {end}: the position is from an older numbering of the stream (its buffer was "
        "lost and rebuilt from the stored reply) or bogus; read the stream again from its "
        "start (after_seq=None, no Last-Event-ID) or the reply from get_messages()"
    )


def test_a_resume_past_the_end_of_a_rebuilt_stream_says_so(web_jobs: ThinkJobs) -> None:
    """A client holding seqs 0..20 reconnects after Redis lost the finished turn's buffer.
    The stream its reader rebuilds from the stored reply is numbered from 0 again and ends
    before 20: the response ends with an error chunk, and a later resume is a 409 (before
    2026-12-07: pings, then a bare [DONE]; the reply stayed truncated, silently)."""
    config = {**TEST_CONFIG, "THINK_JOBS_SSE_HEARTBEAT_S": 2.5}  # above the 1 s poll, as live
    client = create_app(web_jobs, config).test_client()
    request_id = completed(client, web_jobs)
    assert last_id(read_all(client.get(stream_url(request_id), headers=FULL))) > 20
    lose_the_stream(web_jobs, request_id)
    at_20 = {**FULL, "Last-Event-ID": "20"}
    resumed = client.get(stream_url(request_id), headers=at_20)
    assert resumed.status_code == 200  # the buffer is empty: the rebuild happens inside
    events = read_all(resumed)
    whole = read_all(client.get(stream_url(request_id), headers=FULL))  # what to do instead
    assert stream_text(whole) == WORDS
    assert_ai_sdk_stream(whole, "completed")
    end = last_id(whole)
    assert end < 20
    assert_reset(events, request_id, 20, end)
    again = client.get(stream_url(request_id), headers=at_20)
    assert (again.status_code, again.mimetype) == (409, "application/json")
    assert again.get_json()["error"]["type"] == "stream_reset"
    assert again.get_json()["error"]["message"] == reset_text(request_id, 20, end)
    at_end = client.get(stream_url(request_id), headers={**FULL, "Last-Event-ID": str(end)})
    assert [e.data for e in read_all(at_end) if e.data] == ["[DONE]"]  # nothing left, quietly


def test_a_bogus_last_event_id_on_a_finished_stream_is_a_409(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    request_id = completed(client, web_jobs)
    end = last_id(read_all(client.get(stream_url(request_id), headers=FULL)))
    bogus = client.get(stream_url(request_id), headers={**FULL, "Last-Event-ID": "9" * 18})
    assert (bogus.status_code, bogus.mimetype) == (409, "application/json")
    error = bogus.get_json()["error"]
    assert error["type"] == "stream_reset"
    assert error["message"] == reset_text(request_id, int("9" * 18), end)
    query = client.get(stream_url(request_id), headers=FULL, query_string={"after_seq": end + 1})
    assert query.status_code == 409


def test_a_live_response_resumed_past_the_end_its_turn_then_writes_says_so(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    """Resumed at 50 while the turn is queued; the turn then streams fewer events: the
    response learns the end is before its position mid-response (in a later window, or when
    its follower ends the stream from the database) and ends with the error chunk."""
    agent = web_jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="later", text="a short reply")])
    response = client.get(stream_url(result.submission_id), headers={**FULL, "Last-Event-ID": "50"})
    assert response.status_code == 200
    reader = sse_events(response.iter_encoded())
    assert next(reader).data is None and next(reader).comments == ["ping"]  # waiting
    with worker(web_jobs):
        wait_for_status(agent, result.submission_id, "completed")
        events = list(reader)
    end = last_id(read_all(client.get(stream_url(result.submission_id), headers=FULL)))
    assert_reset(events, result.submission_id, 50, end)


def test_streams_of_blocking_turns_and_unknown_requests(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "a")
    saved = agent.save_messages([directive(label="b", text="in process")])
    events = read_all(client.get(stream_url(saved.request_id), headers=FULL))
    assert stream_text(events) == "in process"
    missing = client.get(stream_url("no-such-request"), headers=FULL)
    assert missing.status_code == 404 and missing.mimetype == "application/json"


def test_stream_works_with_the_admin_session_cookie(app: Flask, web_jobs: ThinkJobs) -> None:
    from tests.web.support import FULL_TOKEN, log_in

    client = app.test_client()
    request_id = completed(client, web_jobs, text="for the browser")
    assert client.get(stream_url(request_id)).status_code == 401
    log_in(client, FULL_TOKEN)
    assert stream_text(read_all(client.get(stream_url(request_id)))) == "for the browser"
