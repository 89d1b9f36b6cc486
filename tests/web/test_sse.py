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
