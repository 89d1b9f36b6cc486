"""UI message stream chunks: wire round trips, snake_case input, and error texts."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from think_jobs.chunks import (
    CONTENT_CHUNK_TYPES,
    FRAMING_CHUNK_TYPES,
    AbortChunk,
    DataChunk,
    ErrorChunk,
    FileChunk,
    FinishChunk,
    FinishStepChunk,
    MessageMetadataChunk,
    ReasoningDeltaChunk,
    ReasoningEndChunk,
    ReasoningStartChunk,
    SourceDocumentChunk,
    SourceUrlChunk,
    StartChunk,
    StartStepChunk,
    TextDeltaChunk,
    TextEndChunk,
    TextStartChunk,
    ToolInputAvailableChunk,
    ToolInputDeltaChunk,
    ToolInputErrorChunk,
    ToolInputStartChunk,
    ToolOutputAvailableChunk,
    ToolOutputErrorChunk,
    chunk_to_wire,
    is_content_chunk,
    parse_chunk,
)
from think_jobs.errors import MessageValidationError

PM = {"anthropic": {"signature": "sig"}}

WIRE_CHUNKS: list[tuple[dict[str, Any], type[Any]]] = [
    ({"type": "start", "messageId": "m1", "messageMetadata": {"a": 1}}, StartChunk),
    ({"type": "start-step"}, StartStepChunk),
    ({"type": "finish-step"}, FinishStepChunk),
    ({"type": "text-start", "id": "t1", "providerMetadata": PM}, TextStartChunk),
    ({"type": "text-delta", "id": "t1", "delta": "Hel"}, TextDeltaChunk),
    ({"type": "text-end", "id": "t1"}, TextEndChunk),
    ({"type": "reasoning-start", "id": "r1"}, ReasoningStartChunk),
    (
        {"type": "reasoning-delta", "id": "r1", "delta": "hm", "providerMetadata": PM},
        ReasoningDeltaChunk,
    ),
    ({"type": "reasoning-end", "id": "r1"}, ReasoningEndChunk),
    (
        {
            "type": "tool-input-start",
            "toolCallId": "c1",
            "toolName": "weather",
            "providerExecuted": True,
            "dynamic": True,
        },
        ToolInputStartChunk,
    ),
    (
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"ci'},
        ToolInputDeltaChunk,
    ),
    (
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "weather",
            "input": {"city": "Oslo"},
            "providerExecuted": False,
            "providerMetadata": PM,
            "dynamic": False,
        },
        ToolInputAvailableChunk,
    ),
    (
        {
            "type": "tool-input-error",
            "toolCallId": "c1",
            "toolName": "weather",
            "input": "{bad",
            "errorText": "invalid JSON",
        },
        ToolInputErrorChunk,
    ),
    (
        {
            "type": "tool-output-available",
            "toolCallId": "c1",
            "output": [1, "two"],
            "preliminary": True,
        },
        ToolOutputAvailableChunk,
    ),
    ({"type": "tool-output-error", "toolCallId": "c1", "errorText": "boom"}, ToolOutputErrorChunk),
    (
        {"type": "source-url", "sourceId": "s1", "url": "https://a.example", "title": "A"},
        SourceUrlChunk,
    ),
    (
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "application/pdf",
            "title": "Doc",
            "filename": "d.pdf",
            "providerMetadata": PM,
        },
        SourceDocumentChunk,
    ),
    ({"type": "file", "url": "data:image/png;base64,AA==", "mediaType": "image/png"}, FileChunk),
    ({"type": "data-weather", "id": "d1", "data": {"t": 1}, "transient": True}, DataChunk),
    ({"type": "message-metadata", "messageMetadata": {"usage": {"in": 3}}}, MessageMetadataChunk),
    ({"type": "finish", "finishReason": "tool-calls", "messageMetadata": {"b": 2}}, FinishChunk),
    ({"type": "abort", "reason": "user cancelled"}, AbortChunk),
    ({"type": "error", "errorText": "rate limited"}, ErrorChunk),
]


@pytest.mark.parametrize(("wire", "cls"), WIRE_CHUNKS, ids=lambda v: getattr(v, "__name__", ""))
def test_each_chunk_round_trips_through_wire_json(wire: dict[str, Any], cls: type[Any]) -> None:
    chunk = parse_chunk(wire)
    assert type(chunk) is cls
    assert chunk_to_wire(chunk) == wire
    assert parse_chunk(chunk_to_wire(chunk)) == chunk


def test_every_chunk_class_is_covered() -> None:
    assert len({cls for _, cls in WIRE_CHUNKS}) == 23


def test_python_attributes_are_snake_case() -> None:
    chunk = parse_chunk(WIRE_CHUNKS[11][0])
    assert isinstance(chunk, ToolInputAvailableChunk)
    assert chunk.tool_call_id == "c1"
    assert chunk.provider_metadata == PM


def test_snake_case_dicts_and_constructors_work() -> None:
    parsed = parse_chunk({"type": "tool-input-delta", "tool_call_id": "c", "input_text_delta": "{"})
    built = ToolInputDeltaChunk(tool_call_id="c", input_text_delta="{")
    assert parsed == built
    assert chunk_to_wire(built) == {
        "type": "tool-input-delta",
        "toolCallId": "c",
        "inputTextDelta": "{",
    }


def test_minimal_chunks_leave_optional_fields_out() -> None:
    assert chunk_to_wire(StartChunk()) == {"type": "start"}
    assert chunk_to_wire(FinishChunk()) == {"type": "finish"}
    assert chunk_to_wire(DataChunk(type="data-x", data=None)) == {"type": "data-x"}


def test_null_tool_output_survives_a_round_trip() -> None:
    chunk = parse_chunk({"type": "tool-output-available", "toolCallId": "c", "output": None})
    assert chunk_to_wire(chunk) == {"type": "tool-output-available", "toolCallId": "c"}
    assert parse_chunk(chunk_to_wire(chunk)) == chunk


def test_models_are_returned_unchanged_and_mappings_accepted() -> None:
    chunk = TextDeltaChunk(id="t", delta="x")
    assert parse_chunk(chunk) is chunk
    assert parse_chunk(MappingProxyType({"type": "text-delta", "id": "t", "delta": "x"})) == chunk


def test_unknown_chunk_type_lists_the_valid_types() -> None:
    with pytest.raises(MessageValidationError) as info:
        parse_chunk({"type": "foo"})
    assert str(info.value) == (
        'unknown chunk type "foo"; expected one of start, start-step, finish-step, text-start, '
        "text-delta, text-end, reasoning-start, reasoning-delta, reasoning-end, "
        "tool-input-start, tool-input-delta, tool-input-available, tool-input-error, "
        "tool-output-available, tool-output-error, tool-approval-request, tool-output-denied, "
        "source-url, source-document, file, "
        "data-<name>, message-metadata, finish, abort, error"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"type": "text-delta", "id": "t"}, "text-delta.delta: Field required"),
        (
            {"type": "text-delta", "id": "t", "delta": "x", "text": "y"},
            "text-delta.text: Extra inputs are not permitted",
        ),
        (
            {"type": "tool-output-error", "toolCallId": 1},
            "tool-output-error.toolCallId: Input should be a valid string; "
            "tool-output-error.errorText: Field required",
        ),
        (
            {"type": "data-x", "data": 1, "transient": "maybe"},
            "data-x.transient: Input should be a valid boolean, unable to interpret input",
        ),
        (
            {"type": "finish", "finishReason": "done"},
            "finish.finishReason: Input should be 'stop', 'length', 'content-filter', "
            "'tool-calls', 'error', 'other' or 'unknown'",
        ),
        ({"type": "data-"}, "data-.type: String should match pattern '^data-.+$'"),
        (
            {"type": "tool-input-available", "toolCallId": "c", "toolName": ""},
            "tool-input-available.toolName: String should have at least 1 character",
        ),
        ({"delta": "x"}, "chunk.type: Field required"),
        ({"type": None}, "chunk.type: expected a string, got NoneType"),
        ("text", "chunk: expected a chunk object, got str"),
    ],
)
def test_errors_name_the_field(value: Any, expected: str) -> None:
    with pytest.raises(MessageValidationError) as info:
        parse_chunk(value)
    assert str(info.value) == expected


def test_content_chunk_types_exclude_framing() -> None:
    assert "text-delta" in CONTENT_CHUNK_TYPES
    assert "error" in CONTENT_CHUNK_TYPES
    assert "message-metadata" in CONTENT_CHUNK_TYPES
    assert "data-weather" in CONTENT_CHUNK_TYPES
    assert "data-" not in CONTENT_CHUNK_TYPES
    for framing in FRAMING_CHUNK_TYPES:
        assert framing not in CONTENT_CHUNK_TYPES
    assert is_content_chunk(DataChunk(type="data-x"))
    assert not is_content_chunk(StartStepChunk())
