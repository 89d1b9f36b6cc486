"""The chat transport endpoints (issue 18, part 1) against real services and a real worker:
``POST /api/agents/{type}/chat`` as the AI SDK's ``DefaultChatTransport`` sends it, the reconnect
URL ``GET .../chat/{name}/stream`` (204 only when nothing is running or waiting), ``POST
.../chat/{name}/stop``, their auth, their errors, and their place in the OpenAPI document."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.core.result import Ok
from werkzeug.test import TestResponse

from tests.apps.agents import Recorder
from tests.support.builders import directive, texts, user, wait_for_status
from tests.web.conftest import TEST_CONFIG
from tests.web.support import (
    FULL,
    FULL_TOKEN,
    READ,
    SseEvent,
    csrf_from,
    keeps_its_flaw,
    log_in,
    read_all,
    sent_as_generated,
    sse_events,
    stream_text,
)
from think_jobs import SubmissionStatus, Think, ThinkJobs
from think_jobs.chunks import parse_chunk
from think_jobs.testing import worker
from web import create_app

CHAT = "/api/agents/Recorder/chat"
WORDS = " ".join(f"w{i}" for i in range(8))


def body(name: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """What ``DefaultChatTransport`` POSTs (``messageId`` is left out when undefined)."""
    return {"id": name, "messages": list(messages), "trigger": "submit-message", **extra}


def regenerate(name: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**body(name, *messages), "trigger": "regenerate-message", **extra}


def chat(client: FlaskClient, payload: dict[str, Any], headers: Any = FULL) -> TestResponse:
    return client.post(CHAT, headers=headers, json=payload)


def stream_of(name: str) -> str:
    return f"{CHAT}/{name}/stream"


def stop_of(name: str) -> str:
    return f"{CHAT}/{name}/stop"


def chunks(events: list[SseEvent]) -> list[dict[str, Any]]:
    return [e.chunk for e in events if e.chunk is not None]


def status_of(events: list[SseEvent]) -> str:
    """The final status an AI SDK client reads (a transient data part), after which [DONE]."""
    data = [e.data for e in events if e.data is not None]
    assert data[-1] == "[DONE]", data[-3:]
    last = chunks(events)[-1]
    assert last["type"] == "data-think-status" and last["transient"] is True
    return str(last["data"]["status"])


def read_until(reader: Iterator[SseEvent], into: list[SseEvent], done: Any) -> None:
    for event in reader:
        into.append(event)
        if done():
            return
    raise AssertionError(f"the stream ended early: {stream_text(into)!r}")


def error_of(response: TestResponse) -> dict[str, Any]:
    found = response.json
    assert isinstance(found, dict) and set(found) == {"error"}, found
    assert set(found["error"]) == {"type", "message", "details"}
    error: dict[str, Any] = found["error"]
    return error


def submissions(agent: Think) -> list[str]:
    return [s.submission_id for s in agent.list_submissions(limit=100)]


# -- POST .../chat -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_chat_post_admits_the_newest_user_message_and_streams_its_turn(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "c1")
    with worker(web_jobs):
        response = chat(client, body("c1", directive("u-1", label="one", text=WORDS)))
        assert response.status_code == 200
        assert response.mimetype == "text/event-stream"
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        events = read_all(response)
    for chunk in chunks(events):
        parse_chunk(chunk)  # every chunk is one the AI SDK's protocol defines
    assert stream_text(events) == WORDS
    assert status_of(events) == "completed"
    submission = agent.inspect_submission("u-1")  # the message's id is the submission's
    assert submission is not None and submission.metadata == {"source": "chat"}
    (user_message, reply) = agent.get_messages()
    assert user_message.id == "u-1" and texts(agent)[1] == ("assistant", WORDS)
    assert chunks(events)[0] == {"type": "start", "messageId": reply.id}


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_retried_post_adds_nothing_and_earlier_messages_are_not_applied_again(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "c2")
    first = directive("u-1", label="one", text="first reply")
    with worker(web_jobs):
        once = read_all(chat(client, body("c2", first)))
        again = read_all(chat(client, body("c2", first)))
        assert chunks(again) == chunks(once)  # the same turn, replayed
        assert submissions(agent) == ["u-1"]
        client_copy = {"id": agent.get_messages()[1].id, "role": "assistant", "parts": []}
        foreign = user("never sent through this chat", "u-0")
        second = directive("u-2", label="two", text="second reply")
        later = read_all(chat(client, body("c2", foreign, first, client_copy, second)))
    assert stream_text(later) == "second reply"
    assert submissions(agent) == ["u-2", "u-1"]
    assert [m.id for m in agent.get_messages()][::2] == ["u-1", "u-2"]
    assert [text for _role, text in texts(agent)][1::2] == ["first reply", "second reply"]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_chat_past_the_request_size_limit_goes_on_when_only_its_newest_message_is_sent(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    """With ``DefaultChatTransport``'s default body, a chat whose history passes
    ``max_request_bytes`` (1 MiB) is refused (413) at every later message; the server reads
    only the newest one, so the body ``prepareSendMessagesRequest`` sends (docs/web.md,
    examples/chat) keeps the chat going."""
    agent = web_jobs.get_agent(Recorder, "c9")
    first = directive("u-1", label="one", text="first reply", pad="x" * 600_000)
    second = directive("u-2", label="two", text="second reply", pad="y" * 600_000)
    third = directive("u-3", label="three", text="third reply")
    with worker(web_jobs):
        read_all(chat(client, body("c9", first)))
        read_all(chat(client, body("c9", second)))
        history = [m.to_wire() for m in agent.get_messages()]
        whole = chat(client, body("c9", *history, third))
        assert whole.status_code == 413
        newest = read_all(chat(client, body("c9", third)))
    assert stream_text(newest) == "third reply" and status_of(newest) == "completed"
    assert [m.id for m in agent.get_messages()][::2] == ["u-1", "u-2", "u-3"]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_two_quick_posts_are_answered_in_order(client: FlaskClient, web_jobs: ThinkJobs) -> None:
    agent = web_jobs.get_agent(Recorder, "c3")
    one = directive("u-1", label="one", text="answer one", delay_s=0.02)
    two = directive("u-2", label="two", text="answer two")
    first = chat(client, body("c3", one))  # both admitted before any worker runs
    second = chat(client, body("c3", one, two))
    with worker(web_jobs, concurrency=2):
        assert stream_text(read_all(second)) == "answer two"
        assert stream_text(read_all(first)) == "answer one"
    assert [role for role, _text in texts(agent)] == ["user", "assistant", "user", "assistant"]
    assert [text for _role, text in texts(agent)][1::2] == ["answer one", "answer two"]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_an_edited_message_is_a_409_and_changes_nothing(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "c4")
    with worker(web_jobs):
        read_all(chat(client, body("c4", directive("u-1", label="one", text="kept"))))
        edited = chat(client, body("c4", user("something else", "u-1"), messageId="u-1"))
    assert edited.status_code == 409 and error_of(edited)["type"] == "message_edited"
    assert texts(agent) == [("user", texts(agent)[0][1]), ("assistant", "kept")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_regenerate_replaces_the_last_reply_with_a_new_turn(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "c5")
    asked = directive("u-1", label="one", text="the reply")
    with worker(web_jobs):
        read_all(chat(client, body("c5", asked)))
        old = agent.get_messages()[1].id
        events = read_all(chat(client, regenerate("c5", asked)))
        assert stream_text(events) == "the reply" and status_of(events) == "completed"
        new = agent.get_messages()[1].id
        assert chunks(events)[0] == {"type": "start", "messageId": new} and new != old
        assert [m.role for m in agent.get_messages()] == ["user", "assistant"]
        named = chat(client, regenerate("c5", asked, messageId=new))
        assert named.status_code == 200
        read_all(named)
        stale = chat(client, regenerate("c5", asked, messageId=old))
    assert stale.status_code == 409 and error_of(stale)["type"] == "regenerate_conflict"
    regenerations = [s for s in agent.list_submissions() if s.submission_id != "u-1"]
    assert len(regenerations) == 2
    assert all(
        s.metadata == {"source": "chat", "trigger": "regenerate-message"} for s in regenerations
    )


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_regenerate_sent_twice_while_waiting_is_one_turn(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "c6")
    asked = directive("u-1", label="one", text="the reply")
    with worker(web_jobs):
        read_all(chat(client, body("c6", asked)))
    first = chat(client, regenerate("c6", asked))  # no worker now: it waits
    second = chat(client, regenerate("c6", asked))
    assert len(submissions(agent)) == 2  # u-1 and one regeneration
    with worker(web_jobs):
        assert chunks(read_all(second)) == chunks(read_all(first))
    assert texts(agent)[1] == ("assistant", "the reply")


# -- GET .../chat/{name}/stream ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite"])
def test_resume_answers_an_accepted_turn_before_its_first_chunk_and_204_when_idle(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    assert client.get(stream_of("c7"), headers=FULL).status_code == 204  # no such agent yet
    chat(client, body("c7", directive("u-1", label="one", text=WORDS))).close()
    resumed = client.get(stream_of("c7"), headers=FULL)  # accepted, no worker: no chunk yet
    assert resumed.status_code == 200 and resumed.mimetype == "text/event-stream"
    assert resumed.headers["x-vercel-ai-ui-message-stream"] == "v1"
    events: list[SseEvent] = []
    reader = sse_events(resumed.iter_encoded())
    read_until(reader, events, lambda: events[-1].comments == ["ping"])
    with worker(web_jobs):
        read_until(reader, events, lambda: events[-1].data == "[DONE]")
    assert stream_text(events) == WORDS and status_of(events) == "completed"
    assert client.get(stream_of("c7"), headers=FULL).status_code == 204  # finished


@pytest.mark.parametrize("backend", ["postgres"])
def test_resume_mid_stream_replays_from_the_start_and_stop_keeps_the_partial_reply(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "c8")
    stalled = directive("u-1", label="one", text=WORDS, stall_after=3)
    with worker(web_jobs):
        first: list[SseEvent] = []
        read_until(
            sse_events(chat(client, body("c8", stalled)).iter_encoded()),
            first,
            lambda: stream_text(first) == "w0 w1 w2 ",
        )
        resumed: list[SseEvent] = []
        reader = sse_events(client.get(stream_of("c8"), headers=FULL).iter_encoded())
        read_until(reader, resumed, lambda: stream_text(resumed) == "w0 w1 w2 ")
        assert chunks(resumed) == chunks(first)  # from the start: the same chunks, once
        seq = next(e.id for e in first if e.chunk and e.chunk["type"] == "text-delta")
        after = client.get(stream_of("c8"), headers={**FULL, "Last-Event-ID": seq})
        assert stream_text(read_until_text(after, "w1 w2 ")) == "w1 w2 "
        stopped = client.post(stop_of("c8"), headers=FULL)
        assert stopped.status_code == 200 and stopped.json is not None
        assert stopped.json["submission_id"] == "u-1" and stopped.json["status"] == "aborted"
        read_until(reader, resumed, lambda: resumed[-1].data == "[DONE]")
        wait_for_status(agent, "u-1", "aborted")
    assert status_of(resumed) == "aborted"
    assert texts(agent)[1] == ("assistant", "w0 w1 w2 ")  # the partial reply is kept
    assert client.post(stop_of("c8"), headers=FULL).status_code == 204  # nothing to stop


def read_until_text(response: TestResponse, text: str) -> list[SseEvent]:
    events: list[SseEvent] = []
    read_until(sse_events(response.iter_encoded()), events, lambda: stream_text(events) == text)
    response.close()
    return events


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_active_turn_is_the_running_one_else_the_oldest_waiting(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "c9")
    one, two = (directive(f"u-{i}", label=str(i), text=f"reply {i}") for i in (1, 2))
    chat(client, body("c9", one)).close()
    chat(client, body("c9", one, two)).close()
    stopped = client.post(stop_of("c9"), headers=FULL, json={"reason": "changed my mind"})
    assert stopped.json is not None and stopped.json["submission_id"] == "u-1"
    assert stopped.json["status"] == "aborted" and stopped.json["error"] == "changed my mind"
    waiting = agent.inspect_submission("u-2")
    assert waiting is not None and waiting.status == SubmissionStatus.PENDING
    with worker(web_jobs):
        events = read_all(client.get(stream_of("c9"), headers=FULL))
    assert stream_text(events) == "reply 2"
    assert texts(agent)[1:] == [("assistant", "reply 2")]


# -- errors and auth -----------------------------------------------------------------------------

BAD_BODIES = {
    "agent name with a slash": body("a/b", user("hi", "u-1")),
    "agent name '..'": body("..", user("hi", "u-1")),
    "message id with a slash": body("c", user("hi", "u/1")),
    "earlier message id with a slash": body("c", user("hi", "u/0"), user("hi", "u-1")),
    "no user message": body("c", {"id": "a-1", "role": "assistant", "parts": []}),
    "no messages": body("c"),
    "a trigger it does not know": {**body("c", user("hi", "u-1")), "trigger": "resume-stream"},
    "an unknown field": body("c", user("hi", "u-1"), extra=True),
    "a bad messageId": body("c", user("hi", "u-1"), messageId="a/b"),
    "a malformed message": body("c", {"id": "u-1", "role": "user", "parts": [{"x": 1}]}),
    "messages not a list": {**body("c"), "messages": {"id": "u-1"}},
}


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_chat_requests_are_400_and_store_nothing(client: FlaskClient, case: str) -> None:
    response = chat(client, BAD_BODIES[case])
    assert response.status_code == 400, response.json
    assert error_of(response)["type"] in {"validation_error", "message_validation"}
    assert client.get("/api/agents", headers=FULL).json == {
        "agent_types": ["Recorder", "Support"],
        "agents": [],
    }


@pytest.mark.parametrize("backend", ["sqlite"])
def test_unknown_types_bad_names_and_bad_event_ids(client: FlaskClient) -> None:
    unknown = client.post("/api/agents/Nobody/chat", headers=FULL, json=body("c", user("hi")))
    assert unknown.status_code == 404 and error_of(unknown)["type"] == "agent_not_registered"
    assert client.get("/api/agents/Nobody/chat/c/stream", headers=FULL).status_code == 404
    for name in ("%2E%2E", "a%20", "n" * 201):
        for response in (
            client.get(stream_of(name), headers=FULL),
            client.post(stop_of(name), headers=FULL),
        ):
            assert response.status_code == 400 and error_of(response)["type"] == "validation_error"
    garbage = client.get(stream_of("c"), headers={**FULL, "Last-Event-ID": "x"})
    assert garbage.status_code == 400
    not_json = client.post(CHAT, headers=FULL, data="{", content_type="application/json")
    assert not_json.status_code == 400 and error_of(not_json)["type"] == "invalid_json"


@pytest.mark.parametrize("backend", ["sqlite"])
def test_chat_auth_is_the_apis(app: Flask, web_jobs: ThinkJobs) -> None:
    client = app.test_client()
    payload = body("c", user("hi", "u-1"))
    assert chat(client, payload, headers={}).status_code == 401
    assert chat(client, payload, headers=READ).status_code == 403
    assert client.post(stop_of("c"), headers=READ).status_code == 403
    assert client.get(stream_of("c"), headers=READ).status_code == 204
    assert client.get(stream_of("c")).status_code == 401
    page = log_in(client, FULL_TOKEN)
    assert page.status_code == 302
    refused = chat(client, payload, headers={})  # the admin session, without the CSRF header
    assert refused.status_code == 403 and error_of(refused)["type"] == "csrf_failed"
    token = csrf_from(client.get("/admin/").get_data(as_text=True))
    accepted = chat(client, payload, headers={"X-CSRF-Token": token})
    assert accepted.status_code == 200
    accepted.close()
    assert client.get(stream_of("c")).status_code == 200
    assert client.post(stop_of("c"), headers={"X-CSRF-Token": token}).status_code == 200
    assert web_jobs.get_agent(Recorder, "c").list_submissions()[0].status == "aborted"


# -- the OpenAPI document ------------------------------------------------------------------------

CHAT_OPERATIONS = {
    ("post", "/api/agents/{agent_type}/chat"),
    ("get", "/api/agents/{agent_type}/chat/{agent_name}/stream"),
    ("post", "/api/agents/{agent_type}/chat/{agent_name}/stop"),
}


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_document_describes_the_chat_routes(client: FlaskClient) -> None:
    document = client.get("/api/openapi.json").json
    assert document is not None
    found = {(m, p) for p, item in document["paths"].items() for m in item}
    assert found >= CHAT_OPERATIONS
    send = document["paths"]["/api/agents/{agent_type}/chat"]["post"]
    assert send["security"] == [{"bearerAuth": []}] and send["x-think-jobs-scope"] == "write"
    assert "text/event-stream" in send["responses"]["200"]["content"]
    assert set(send["responses"]) >= {"200", "400", "401", "403", "404", "409", "413", "415"}
    schemas = document["components"]["schemas"]
    chat_body = schemas["ChatBody"]
    assert set(chat_body["required"]) == {"id", "messages", "trigger"}
    assert set(chat_body["properties"]) == {"id", "messages", "trigger", "messageId"}
    assert chat_body["additionalProperties"] is False
    assert chat_body["properties"]["trigger"]["enum"] == ["submit-message", "regenerate-message"]
    messages = chat_body["properties"]["messages"]
    assert messages["items"] == {"$ref": "#/components/schemas/ChatMessage"}
    assert messages["contains"]["properties"]["role"] == {"const": "user"}
    assert (
        schemas["ChatMessage"]["properties"]["id"]["pattern"]
        == (schemas["SubmitBody"]["properties"]["submission_id"]["anyOf"][0]["pattern"])
    )
    approval = schemas["ToolApproval"]["properties"]  # what the POST answers must be storable
    assert approval["id"]["pattern"] == chat_body["properties"]["id"]["pattern"]
    assert (
        approval["reason"]["anyOf"][0]
        == schemas["ApprovalAnswer"]["properties"]["reason"]["anyOf"][0]
    )
    resume = document["paths"]["/api/agents/{agent_type}/chat/{agent_name}/stream"]["get"]
    assert set(resume["responses"]) >= {"200", "204"}
    assert [p["name"] for p in resume["parameters"]] == [
        "agent_name",
        "agent_type",
        "Last-Event-ID",
    ]
    stop = document["paths"]["/api/agents/{agent_type}/chat/{agent_name}/stop"]["post"]
    assert stop["requestBody"]["required"] is False
    assert stop["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SubmissionInspection"
    }


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzz_the_chat_routes_against_the_document(
    web_jobs: ThinkJobs, mode: GenerationMode
) -> None:
    """No 500s; every answer matches the document; what it allows is accepted, what it does
    not is a 400 (schemathesis' checks)."""
    # A turn no worker runs: each stream ends at its maximum duration, kept short.
    config = {
        **TEST_CONFIG,
        "THINK_JOBS_SSE_HEARTBEAT_S": 0.02,
        "THINK_JOBS_SSE_MAX_DURATION_S": 0.05,
    }
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", create_app(web_jobs, config))
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()
        operations.append(result.ok())
    chat_operations = [
        op for op in operations if (op.method.lower(), op.full_path) in CHAT_OPERATIONS
    ]
    assert len(chat_operations) == 3
    strategies = [op.as_strategy(generation_mode=mode) for op in chat_operations]

    @given(case=st.one_of(*strategies).filter(keeps_its_flaw).filter(sent_as_generated))
    @settings(
        max_examples=int(os.environ.get("FUZZ_EXAMPLES", "100")),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def exchange(case: Case[Any]) -> None:
        case.call_and_validate(headers=FULL)

    exchange()
