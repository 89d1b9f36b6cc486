"""UIMessage models: wire round trips, snake_case construction, and path-naming errors."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from think_jobs.errors import MessageValidationError
from think_jobs.messages import (
    DataPart,
    DynamicToolPart,
    FilePart,
    ReasoningPart,
    SourceDocumentPart,
    SourceUrlPart,
    StepStartPart,
    TextPart,
    ToolPart,
    UIMessage,
    coerce_message,
    coerce_messages,
    message_text,
    new_message_id,
    unappliable_reason,
    user_text_message,
)

PM = {"openai": {"itemId": "x1"}}

WIRE_PARTS: list[tuple[dict[str, Any], type[Any]]] = [
    ({"type": "text", "text": "Hi", "state": "done", "providerMetadata": PM}, TextPart),
    ({"type": "reasoning", "text": "Hmm", "state": "streaming"}, ReasoningPart),
    (
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {"city": "Oslo"},
            "output": {"temp": 3},
            "providerExecuted": False,
            "callProviderMetadata": PM,
            "preliminary": True,
        },
        ToolPart,
    ),
    (
        {
            "type": "tool-weather",
            "toolCallId": "c2",
            "state": "output-error",
            "rawInput": "{bad",
            "errorText": "bad input",
        },
        ToolPart,
    ),
    (
        {
            "type": "dynamic-tool",
            "toolName": "mcp_search",
            "toolCallId": "c3",
            "state": "input-streaming",
        },
        DynamicToolPart,
    ),
    (
        {"type": "source-url", "sourceId": "s1", "url": "https://a.example", "title": "A"},
        SourceUrlPart,
    ),
    (
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "application/pdf",
            "title": "Report",
            "filename": "r.pdf",
        },
        SourceDocumentPart,
    ),
    (
        {"type": "file", "mediaType": "image/png", "filename": "a.png", "url": "data:,x"},
        FilePart,
    ),
    ({"type": "data-weather", "id": "d1", "data": {"temp": [1, 2]}}, DataPart),
    ({"type": "step-start"}, StepStartPart),
]


def _wire_message(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"id": "m1", "role": "assistant", "parts": list(parts), "metadata": {"k": 1}}


@pytest.mark.parametrize(("wire", "cls"), WIRE_PARTS, ids=lambda v: getattr(v, "__name__", ""))
def test_each_part_round_trips_through_wire_json(wire: dict[str, Any], cls: type[Any]) -> None:
    message = coerce_message(_wire_message(wire))
    assert isinstance(message.parts[0], cls)
    assert message.to_wire() == _wire_message(wire)


def test_python_attributes_are_snake_case() -> None:
    message = coerce_message(_wire_message(WIRE_PARTS[2][0], WIRE_PARTS[7][0]))
    tool, file = message.parts
    assert isinstance(tool, ToolPart) and isinstance(file, FilePart)
    assert tool.tool_call_id == "c1"
    assert tool.tool_name == "weather"
    assert tool.call_provider_metadata == PM
    assert file.media_type == "image/png"


def test_snake_case_construction_serialises_camel_case() -> None:
    part = ToolPart(type="tool-weather", tool_call_id="c1", state="output-error", error_text="boom")
    message = UIMessage(id="m1", role="assistant", parts=[part, StepStartPart()])
    assert message.to_wire() == {
        "id": "m1",
        "role": "assistant",
        "parts": [
            {
                "type": "tool-weather",
                "toolCallId": "c1",
                "state": "output-error",
                "errorText": "boom",
            },
            {"type": "step-start"},
        ],
    }


def test_snake_case_keys_are_accepted_in_dicts() -> None:
    message = coerce_message(
        {
            "id": "m1",
            "role": "user",
            "parts": [{"type": "file", "media_type": "text/plain", "url": "data:,x"}],
        }
    )
    assert message.to_wire()["parts"] == [
        {"type": "file", "mediaType": "text/plain", "url": "data:,x"}
    ]


def test_message_objects_pass_through_unchanged() -> None:
    message = user_text_message("hi")
    assert coerce_message(message) is message
    assert coerce_messages([message, message.to_wire()]) == [message, message]


def test_unknown_part_type_is_rejected_with_the_valid_types() -> None:
    with pytest.raises(MessageValidationError) as info:
        coerce_messages([_wire_message({"type": "foo"})])
    assert str(info.value) == (
        'messages[0].parts[0]: unknown message part type "foo"; expected one of text, '
        "reasoning, tool-<name>, dynamic-tool, source-url, source-document, file, "
        "data-<name>, step-start"
    )


def test_errors_name_the_field_with_a_path() -> None:
    bad = _wire_message({"type": "text", "text": "ok"}, {"type": "text"})
    with pytest.raises(MessageValidationError) as info:
        coerce_messages([user_text_message("x"), bad])
    assert str(info.value) == "messages[1].parts[1].text: Field required"


def test_several_errors_are_joined_one_per_field() -> None:
    bad = {
        "id": "m1",
        "role": "robot",
        "parts": [{"type": "tool-x", "toolCallID": "c1", "state": "input-available"}],
    }
    with pytest.raises(MessageValidationError) as info:
        coerce_message(bad)
    assert str(info.value) == (
        "message.role: Input should be 'system', 'user' or 'assistant'; "
        "message.parts[0].toolCallId: Field required; "
        "message.parts[0].toolCallID: Extra inputs are not permitted"
    )


def test_errors_from_several_messages_are_all_reported() -> None:
    with pytest.raises(MessageValidationError) as info:
        coerce_messages([{"role": "user", "parts": []}, user_text_message("ok"), "hi"])  # type: ignore[list-item]
    assert str(info.value) == (
        "messages[0].id: Field required; messages[2]: expected a message object, got str"
    )


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        ("text", "message.parts[0]: expected a message part object, got str"),
        ({"text": "x"}, "message.parts[0].type: Field required"),
        ({"type": 3}, "message.parts[0].type: expected a string, got int"),
        (
            {"type": "tool-", "toolCallId": "c", "state": "input-available"},
            "message.parts[0].type: String should match pattern '^tool-.+$'",
        ),
        (
            {"type": "tool-x", "toolCallId": "c", "state": "done"},
            "message.parts[0].state: Input should be 'input-streaming', 'input-available', "
            "'approval-requested', 'approval-responded', 'output-available', 'output-error' or "
            "'output-denied'",
        ),
        (
            {"type": "tool-x", "toolCallId": "c", "state": "input-available", "preliminary": "yes"},
            "message.parts[0].preliminary: Input should be a valid boolean",
        ),
    ],
)
def test_malformed_parts(part: Any, expected: str) -> None:
    with pytest.raises(MessageValidationError) as info:
        coerce_message(_wire_message(part))
    assert str(info.value) == expected


def test_a_single_message_is_not_a_message_list() -> None:
    with pytest.raises(MessageValidationError, match="expected a list of messages, got dict"):
        coerce_messages(_wire_message())  # type: ignore[arg-type]


def test_validation_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        coerce_message({"id": "m", "role": "user"})


def test_user_text_message_accepts_the_empty_string() -> None:
    message = user_text_message("")
    assert message.role == "user"
    assert message.parts == [TextPart(text="")]
    assert uuid.UUID(message.id).version == 4
    assert message.to_wire() == {
        "id": message.id,
        "role": "user",
        "parts": [{"type": "text", "text": ""}],
    }


def test_message_text_joins_text_parts_only() -> None:
    message = UIMessage(
        id="m",
        role="assistant",
        parts=[
            ReasoningPart(text="thinking"),
            TextPart(text="Hello, "),
            StepStartPart(),
            TextPart(text="world"),
        ],
    )
    assert message_text(message) == "Hello, world"


def test_new_message_ids_are_unique_uuid4() -> None:
    first, second = new_message_id(), new_message_id()
    assert first != second
    assert uuid.UUID(first).version == 4


def test_a_validated_message_with_an_answered_approval_validates_again() -> None:
    """``coerce_messages`` takes ``UIMessage`` objects too: a tool part's ``approval`` (a typed
    field, not free JSON) walks as the JSON it stands for."""
    from think_jobs.messages import coerce_messages

    part = {
        "type": "tool-pay",
        "toolCallId": "c",
        "state": "approval-responded",
        "input": {},
        "approval": {"id": "a1", "approved": True},
    }
    message = coerce_message({"id": "m", "role": "assistant", "parts": [part]})
    assert coerce_messages([message]) == [message]


@pytest.mark.parametrize(
    ("approval", "field"),
    [
        ({"id": "a/1", "approved": True}, "approval.id"),
        ({"id": "", "approved": True}, "approval.id"),
        ({"id": "a1", "approved": False, "reason": "x" * 2001}, "approval.reason"),
        ({"id": "a1", "approved": False, "reason": "no\x00"}, "approval.reason"),
    ],
)
def test_an_approval_that_could_not_be_looked_up_or_stored_is_refused(
    approval: dict[str, Any], field: str
) -> None:
    """An approval's id follows the id rule and its reason the stored reason's (at most 2,000
    characters, no NUL): the chat route answers approvals read from messages, so what a message
    may carry is what an answer may be (the API document says so too)."""
    part = {
        "type": "tool-pay",
        "toolCallId": "c",
        "state": "approval-responded",
        "input": {},
        "approval": approval,
    }
    with pytest.raises(MessageValidationError, match=rf"parts\[0\]\.{field}"):
        coerce_message({"id": "m", "role": "assistant", "parts": [part]})


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        (None, None),  # a continuation brings no messages
        ([{"id": "m1", "role": "user", "parts": []}], None),
        ({"id": "m1"}, "messages: expected a list, got dict"),
        ([{"id": "m1", "role": "user"}, 1], "messages[1]: expected an object, got int"),
        ([{"role": "user"}], "messages[0]: no id"),
        ([{"id": 7, "role": "user"}], "messages[0]: an id that is not a string but int"),
        (
            [{"id": "m" * 256, "role": "user"}],
            "messages[0]: an id of 256 characters; at most 255 can be stored",
        ),
        (
            [{"id": "m\x01", "role": "user"}],
            "messages[0]: an id holding control characters or a lone surrogate",
        ),
        (
            [{"id": "m1", "role": "robot"}],
            "messages[0]: role 'robot': expected one of system, user, assistant",
        ),
    ],
)
def test_unappliable_reason_names_the_first_message_a_claim_cannot_apply(
    stored: Any, reason: str | None
) -> None:
    assert unappliable_reason(stored) == reason
