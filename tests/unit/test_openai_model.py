"""OpenAIChatModel against a loopback OpenAI-compatible server speaking the real SSE format.

No Redis or database: the tests drive ``model.stream`` directly (and once through the
``TurnRunner`` for a full tool round trip), with the official ``openai`` client on the wire.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.openai_server import (
    Completion,
    HttpError,
    OpenAIServer,
    Pause,
    StreamError,
    openai_server,
    reasoning,
    refused_port,
    text,
    tool_call,
)
from think_jobs.assembly import MessageAssembler
from think_jobs.engine.model_loop import TurnRunner
from think_jobs.messages import (
    DynamicToolPart,
    FilePart,
    ReasoningPart,
    StepStartPart,
    TextPart,
    ToolPart,
    UIMessage,
    user_text_message,
)
from think_jobs.models import OpenAIChatModel
from think_jobs.models.base import ModelRequest
from think_jobs.models.openai_convert import to_openai_messages, to_openai_tools
from think_jobs.signals import AbortController, AbortSignal
from think_jobs.tools import Tool, tool

pytestmark = pytest.mark.timeout(30)

Chunks = list[dict[str, Any]]


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with openai_server() as running:
        yield running


def _model(server: OpenAIServer, **kwargs: Any) -> OpenAIChatModel:
    kwargs.setdefault("max_retries", 0)
    return OpenAIChatModel("gpt-test", base_url=server.base_url, api_key="sk-test", **kwargs)


def _request(text: str = "hi", **kwargs: Any) -> ModelRequest:
    kwargs.setdefault("system", "You are terse.")
    return ModelRequest(messages=[user_text_message(text)], **kwargs)


def _run(model: OpenAIChatModel, request: ModelRequest | None = None) -> Chunks:
    return list(model.stream(request or _request()))


def _weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"city": city, "temp": 21}


WEATHER = tool(name="weather")(_weather)


# -- streaming text and reasoning ------------------------------------------------------------


def test_text_streams_as_one_text_block(server: OpenAIServer) -> None:
    server.script(Completion([text("Hel"), text("lo!")]))

    chunks = _run(_model(server), _request("Say hello"))

    assert chunks == [
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Hel"},
        {"type": "text-delta", "id": "text-0", "delta": "lo!"},
        {"type": "text-end", "id": "text-0"},
    ]
    [body] = server.requests
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello"},
    ]
    assert "tools" not in body
    assert server.received[0].headers["authorization"] == "Bearer sk-test"


def test_block_ids_carry_the_step(server: OpenAIServer) -> None:
    server.script(Completion([text("ok")]))

    chunks = _run(_model(server), _request(step=3))

    assert {chunk["id"] for chunk in chunks} == {"text-3"}


def test_reasoning_content_streams_before_the_text(server: OpenAIServer) -> None:
    server.script(Completion([reasoning("Think"), reasoning("ing."), text("Done")]))

    chunks = _run(_model(server))

    assert chunks == [
        {"type": "reasoning-start", "id": "reasoning-0"},
        {"type": "reasoning-delta", "id": "reasoning-0", "delta": "Think"},
        {"type": "reasoning-delta", "id": "reasoning-0", "delta": "ing."},
        {"type": "reasoning-end", "id": "reasoning-0"},
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Done"},
        {"type": "text-end", "id": "text-0"},
    ]


def test_reasoning_field_and_reopened_blocks_get_fresh_ids(server: OpenAIServer) -> None:
    server.script(Completion([reasoning("a", key="reasoning"), text("b"), reasoning("c")]))

    chunks = _run(_model(server))

    assert [(chunk["type"], chunk["id"]) for chunk in chunks] == [
        ("reasoning-start", "reasoning-0"),
        ("reasoning-delta", "reasoning-0"),
        ("reasoning-end", "reasoning-0"),
        ("text-start", "text-0"),
        ("text-delta", "text-0"),
        ("text-end", "text-0"),
        ("reasoning-start", "reasoning-0-1"),
        ("reasoning-delta", "reasoning-0-1"),
        ("reasoning-end", "reasoning-0-1"),
    ]


# -- tool calls -------------------------------------------------------------------------------


def test_tool_call_arguments_stream_in_pieces(server: OpenAIServer) -> None:
    server.script(
        Completion(
            [
                text("Checking."),
                tool_call(0, id="call_1", name="weather", arguments=""),
                tool_call(0, arguments='{"ci'),
                tool_call(0, arguments='ty": "Pa'),
                tool_call(0, arguments='ris"}'),
            ],
            finish_reason="tool_calls",
        )
    )

    chunks = _run(_model(server), _request(tools={"weather": WEATHER}))

    call = {"toolCallId": "call_1"}
    assert chunks == [
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Checking."},
        {"type": "text-end", "id": "text-0"},
        {"type": "tool-input-start", **call, "toolName": "weather"},
        {"type": "tool-input-delta", **call, "inputTextDelta": '{"ci'},
        {"type": "tool-input-delta", **call, "inputTextDelta": 'ty": "Pa'},
        {"type": "tool-input-delta", **call, "inputTextDelta": 'ris"}'},
        {"type": "tool-input-available", **call, "toolName": "weather", "input": {"city": "Paris"}},
    ]
    [body] = server.requests
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Current weather for a city.",
                "parameters": dict(WEATHER.input_schema),
            },
        }
    ]


def test_parallel_tool_calls_each_get_their_own_chunks(server: OpenAIServer) -> None:
    server.script(
        Completion(
            [
                tool_call(0, id="call_a", name="weather", arguments=""),
                tool_call(1, id="call_b", name="weather", arguments='{"city":'),
                tool_call(0, arguments='{"city": "Oslo"}'),
                tool_call(1, arguments=' "Rome"}'),
            ],
            finish_reason="tool_calls",
        )
    )

    chunks = _run(_model(server))

    assert chunks == [
        {"type": "tool-input-start", "toolCallId": "call_a", "toolName": "weather"},
        {"type": "tool-input-start", "toolCallId": "call_b", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "call_b", "inputTextDelta": '{"city":'},
        {"type": "tool-input-delta", "toolCallId": "call_a", "inputTextDelta": '{"city": "Oslo"}'},
        {"type": "tool-input-delta", "toolCallId": "call_b", "inputTextDelta": ' "Rome"}'},
        {
            "type": "tool-input-available",
            "toolCallId": "call_a",
            "toolName": "weather",
            "input": {"city": "Oslo"},
        },
        {
            "type": "tool-input-available",
            "toolCallId": "call_b",
            "toolName": "weather",
            "input": {"city": "Rome"},
        },
    ]


def test_invalid_tool_arguments_become_a_tool_input_error(server: OpenAIServer) -> None:
    server.script(
        Completion([tool_call(0, id="call_x", name="weather", arguments='{"city": ')]),
        Completion([tool_call(0, id="call_y", name="weather", arguments="[1, 2]")]),
    )
    model = _model(server)

    *_, unparsable = _run(model)
    *_, not_an_object = _run(model)

    assert unparsable["type"] == "tool-input-error"
    assert unparsable["toolCallId"] == "call_x"
    assert unparsable["toolName"] == "weather"
    assert unparsable["input"] == '{"city": '
    assert unparsable["errorText"].startswith("invalid JSON in tool call arguments")
    assert not_an_object["type"] == "tool-input-error"
    assert not_an_object["errorText"] == "tool call arguments must be a JSON object, got list"


def test_arguments_nested_past_the_parser_become_a_tool_input_error(server: OpenAIServer) -> None:
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"  # json.loads: RecursionError
    server.script(Completion([tool_call(0, id="call_d", name="weather", arguments=deep)]))

    *_, nested = _run(_model(server))

    assert nested["type"] == "tool-input-error"
    assert (nested["toolCallId"], nested["toolName"], nested["input"]) == (
        "call_d",
        "weather",
        deep,
    )
    assert nested["errorText"] == (
        "invalid JSON in tool call arguments: nested too deeply for the JSON parser"
    )


def test_empty_arguments_mean_no_input_and_missing_ids_are_made_up(server: OpenAIServer) -> None:
    server.script(Completion([tool_call(0, name="now", arguments="")]))

    chunks = _run(_model(server), _request(step=1))

    assert chunks == [
        {"type": "tool-input-start", "toolCallId": "call-1-0", "toolName": "now"},
        {"type": "tool-input-available", "toolCallId": "call-1-0", "toolName": "now", "input": {}},
    ]


# -- provider errors, retries, timeouts -------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"), [(500, "server_error"), (400, "invalid_request_error")]
)
def test_error_status_becomes_one_error_chunk(server: OpenAIServer, status: int, kind: str) -> None:
    server.script(HttpError(status, "The model `gpt-test` is overloaded.", type=kind))

    chunks = _run(_model(server))

    assert chunks == [{"type": "error", "errorText": "The model `gpt-test` is overloaded."}]
    assert len(server.requests) == 1


def test_retries_are_configurable(server: OpenAIServer) -> None:
    server.script(HttpError(500, "first"), HttpError(503, "second"))

    chunks = _run(_model(server, max_retries=1))

    assert chunks == [{"type": "error", "errorText": "second"}]
    assert len(server.requests) == 2


def test_a_retry_can_recover(server: OpenAIServer) -> None:
    server.script(HttpError(429, "slow down", type="rate_limit_error"), Completion([text("ok")]))

    chunks = _run(_model(server, max_retries=1))

    assert [chunk["type"] for chunk in chunks] == ["text-start", "text-delta", "text-end"]
    assert server.requests[0] == server.requests[1]


def test_error_event_mid_stream_becomes_an_error_chunk(server: OpenAIServer) -> None:
    server.script(Completion([text("par"), StreamError("context length exceeded")]))

    chunks = _run(_model(server))

    assert chunks[-1] == {"type": "error", "errorText": "context length exceeded"}
    assert chunks[:2] == [
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "par"},
    ]


def test_connection_refused_becomes_an_error_chunk() -> None:
    with refused_port() as port:
        model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
        chunks = _run(model)

    [chunk] = chunks
    assert chunk["type"] == "error"
    assert chunk["errorText"].startswith("Connection error.")


def test_read_timeout_becomes_an_error_chunk(server: OpenAIServer) -> None:
    server.script(Completion([text("slow"), Pause()]))

    chunks = _run(_model(server, timeout_s=0.3))

    assert chunks[-1] == {"type": "error", "errorText": "Request timed out."}


# -- abort ------------------------------------------------------------------------------------


def _wait_until_reading(thread: threading.Thread, timeout_s: float = 5.0) -> None:
    """Wait until ``thread`` is blocked reading the socket, so the abort has to wake a blocked
    read. Best effort: if the HTTP library's frames look different, abort after the timeout
    (the test still checks the outcome, only slower)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is not None and frame.f_code.co_name in {"read", "recv", "recv_into"}:
            return
        time.sleep(0.001)


def test_abort_hangs_up_the_stream_at_once(server: OpenAIServer) -> None:
    pause = Pause()
    server.script(Completion([text("a"), text("b"), pause, text("never sent")]))
    controller = AbortController()
    stream = _model(server, timeout_s=60).stream(_request(signal=controller.signal))

    first = [next(stream) for _ in range(3)]
    assert pause.reached.wait(5)
    reader = threading.current_thread()

    def abort_once_reading() -> None:
        _wait_until_reading(reader)
        controller.abort()

    aborter = threading.Thread(target=abort_once_reading)
    aborter.start()
    started = time.monotonic()
    rest = list(stream)
    elapsed = time.monotonic() - started
    aborter.join(5)

    assert first == [
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "a"},
        {"type": "text-delta", "id": "text-0", "delta": "b"},
    ]
    assert rest == []  # quietly: no error chunk, nothing after the abort
    assert elapsed < 5, "the abort did not wake the blocked read"
    assert server.disconnected.wait(5)
    assert not pause.release.is_set()


def test_already_aborted_request_sends_nothing(server: OpenAIServer) -> None:
    chunks = _run(_model(server), _request(signal=AbortSignal.aborted_with("stop")))

    assert chunks == []
    assert server.requests == []


def test_closing_the_iterator_closes_the_connection(server: OpenAIServer) -> None:
    pause = Pause()
    server.script(Completion([text("a"), pause]))
    stream = _model(server).stream(_request())

    assert next(stream)["type"] == "text-start"
    assert pause.reached.wait(5)
    stream.close()

    assert server.disconnected.wait(5)


# -- request params ---------------------------------------------------------------------------


def test_extra_params_and_body_overrides_reach_the_request(server: OpenAIServer) -> None:
    server.script(Completion([text("ok")]))
    model = _model(server, extra_params={"temperature": 0.2, "seed": 7, "stream": False})
    body = {"openai": {"temperature": 0.9, "max_tokens": 64}, "other": 1}

    _run(model, _request(body=body))

    [sent] = server.requests
    assert sent["temperature"] == 0.9
    assert sent["seed"] == 7
    assert sent["max_tokens"] == 64
    assert sent["stream"] is True
    assert "other" not in sent


def test_body_overrides_must_be_an_object(server: OpenAIServer) -> None:
    with pytest.raises(ValueError, match='"openai" must be an object'):
        _run(_model(server), _request(body={"openai": "fast"}))


def test_api_key_defaults_to_the_environment_or_a_placeholder(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.script(Completion([text("a")]), Completion([text("b")]))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    _run(OpenAIChatModel("m", base_url=server.base_url, max_retries=0))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    _run(OpenAIChatModel("m", base_url=server.base_url, max_retries=0))

    keys = [request.headers["authorization"] for request in server.received]
    assert keys == ["Bearer not-needed", "Bearer sk-env"]


# -- conversion -------------------------------------------------------------------------------


def _assistant(*parts: Any) -> UIMessage:
    return UIMessage(id="a1", role="assistant", parts=list(parts))


def test_tool_round_trip_converts_to_tool_calls_and_tool_messages() -> None:
    conversation = [
        user_text_message("Weather in Paris and Rome?"),
        _assistant(
            StepStartPart(),
            ReasoningPart(text="need tools", state="done"),
            TextPart(text="Let me check.", state="done"),
            ToolPart(
                type="tool-weather",
                tool_call_id="call_1",
                state="output-available",
                input={"city": "Paris"},
                output={"temp": 21},
            ),
            DynamicToolPart(
                tool_name="lookup",
                tool_call_id="call_2",
                state="output-error",
                input={"city": "Rome"},
                error_text="service down",
            ),
            ToolPart(type="tool-weather", tool_call_id="call_3", state="input-available"),
            StepStartPart(),
            TextPart(text="Paris is 21°C.", state="done"),
        ),
        user_text_message("Thanks"),
    ]

    assert to_openai_messages("Be brief.", conversation) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "service down"},
        {"role": "assistant", "content": "Paris is 21°C."},
        {"role": "user", "content": "Thanks"},
    ]


def test_tool_only_step_has_no_content_and_string_outputs_are_sent_verbatim() -> None:
    message = _assistant(
        ToolPart(
            type="tool-now",
            tool_call_id="c",
            state="output-available",
            input=None,
            output="12:00",
        )
    )

    assert to_openai_messages("", [message]) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "12:00"},
    ]


def test_user_images_become_content_parts_and_system_messages_stay() -> None:
    user = UIMessage(
        id="u1",
        role="user",
        parts=[
            TextPart(text="What is this?"),
            FilePart(media_type="image/png", url="data:image/png;base64,AAAA"),
            FilePart(media_type="application/pdf", url="https://example.com/a.pdf"),
        ],
    )
    system = UIMessage(id="s1", role="system", parts=[TextPart(text="Use metric units.")])

    assert to_openai_messages("", [system, user]) == [
        {"role": "system", "content": "Use metric units."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
    ]


def test_tools_are_named_by_their_key() -> None:
    bare = Tool(description="", input_schema={"type": "object"}, execute=lambda _: None)

    assert to_openai_tools({"ping": bare}) == [
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}
    ]


# -- through the runner -----------------------------------------------------------------------


def test_runner_tool_loop_sends_the_tool_result_back(server: OpenAIServer) -> None:
    server.script(
        Completion(
            [
                tool_call(0, id="call_1", name="weather", arguments='{"city": '),
                tool_call(0, arguments='"Paris"}'),
            ],
            finish_reason="tool_calls",
        ),
        Completion([text("It is 21 degrees.")]),
    )
    request = _request("Weather in Paris?", tools={"weather": WEATHER})
    emitted: list[Any] = []
    runner = TurnRunner(
        model=_model(server),
        request=request,
        assembler=MessageAssembler("m1"),
        emit=emitted.append,
        should_stop=lambda: False,
        max_steps=4,
    )

    outcome = runner.run()

    assert outcome.status == "completed"
    assert [chunk.type for chunk in emitted][-4:] == [
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    second = server.requests[1]["messages"]
    assert second[2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"city": "Paris", "temp": 21}'},
    ]
