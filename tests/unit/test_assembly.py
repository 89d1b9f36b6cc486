"""MessageAssembler over realistic AI SDK v5 streams."""

from __future__ import annotations

from typing import Any

import pytest

from think_jobs.assembly import MessageAssembler, merge_metadata
from think_jobs.chunks import TextDeltaChunk, parse_chunk
from think_jobs.errors import MessageValidationError
from think_jobs.messages import DynamicToolPart, TextPart, ToolPart, stored_message_problem


def _feed(assembler: MessageAssembler, *chunks: dict[str, Any]) -> MessageAssembler:
    for chunk in chunks:
        assembler.feed(parse_chunk(chunk))
    return assembler


def _assemble(*chunks: dict[str, Any], **kwargs: Any) -> MessageAssembler:
    return _feed(MessageAssembler("m1", **kwargs), *chunks)


def _parts(assembler: MessageAssembler) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = assembler.message.to_wire()["parts"]
    return parts


def _text(block: str, *deltas: str) -> list[dict[str, Any]]:
    return [
        {"type": "text-start", "id": block},
        *({"type": "text-delta", "id": block, "delta": d} for d in deltas),
        {"type": "text-end", "id": block},
    ]


def test_plain_text_stream() -> None:
    assembler = _assemble(
        {"type": "start", "messageId": "m1"},
        {"type": "start-step"},
        *_text("t1", "Hel", "lo", "!"),
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    )
    assert assembler.message.to_wire() == {
        "id": "m1",
        "role": "assistant",
        "parts": [{"type": "step-start"}, {"type": "text", "text": "Hello!", "state": "done"}],
    }
    assert assembler.finish_reason == "stop"
    assert assembler.has_content
    assert assembler.error_text is None


def test_two_text_blocks_stay_separate_even_when_interleaved() -> None:
    assembler = _assemble(
        {"type": "text-start", "id": "a"},
        {"type": "text-start", "id": "b"},
        {"type": "text-delta", "id": "a", "delta": "one"},
        {"type": "text-delta", "id": "b", "delta": "two"},
        {"type": "text-end", "id": "a"},
        {"type": "text-delta", "id": "b", "delta": "!"},
    )
    assert _parts(assembler) == [
        {"type": "text", "text": "one", "state": "done"},
        {"type": "text", "text": "two!", "state": "streaming"},
    ]


def test_reasoning_then_text() -> None:
    assembler = _assemble(
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r1"},
        {"type": "reasoning-delta", "id": "r1", "delta": "Think"},
        {"type": "reasoning-delta", "id": "r1", "delta": "ing", "providerMetadata": {"a": {}}},
        {"type": "reasoning-end", "id": "r1"},
        *_text("t1", "Answer"),
    )
    assert _parts(assembler) == [
        {"type": "step-start"},
        {"type": "reasoning", "text": "Thinking", "state": "done", "providerMetadata": {"a": {}}},
        {"type": "text", "text": "Answer", "state": "done"},
    ]


def test_tool_call_round_trip() -> None:
    assembler = _assemble(
        {"type": "start-step"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"city":'},
    )
    streaming = _parts(assembler)[1]
    assert streaming == {"type": "tool-weather", "toolCallId": "c1", "state": "input-streaming"}

    _feed(
        assembler,
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '"Oslo"}'},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "weather",
            "input": {"city": "Oslo"},
            "providerMetadata": {"openai": {"id": "x"}},
        },
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"temp": 3}},
        {"type": "finish-step"},
        {"type": "start-step"},
        *_text("t2", "It is 3 degrees."),
    )

    parts = _parts(assembler)
    assert parts[1] == {
        "type": "tool-weather",
        "toolCallId": "c1",
        "state": "output-available",
        "input": {"city": "Oslo"},
        "output": {"temp": 3},
        "callProviderMetadata": {"openai": {"id": "x"}},
    }
    assert [p["type"] for p in parts] == ["step-start", "tool-weather", "step-start", "text"]


def test_streaming_tool_input_is_parsed_once_it_is_complete_json() -> None:
    assembler = _assemble(
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"city":'},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '"Oslo"}'},
    )
    assert _parts(assembler)[0]["input"] == {"city": "Oslo"}
    assert _parts(assembler)[0]["state"] == "input-streaming"


@pytest.mark.parametrize(
    "text",
    [
        '{"a":' + "[" * 210 + "]" * 210 + "}",  # past pydantic's reader: fails to read back
        '{"q":"\\ud83d"}',  # a lone surrogate, as six ASCII characters
        '{"n": NaN}',
        "[" * 5000 + "]" * 5000,  # json.loads raises RecursionError
        "[" * 100_000,
    ],
)
def test_a_streaming_tool_input_that_could_not_be_stored_stays_unparsed(text: str) -> None:
    assembler = _assemble(
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": text},
    )
    [part] = assembler.message.parts
    assert isinstance(part, ToolPart)
    assert (part.state, part.input) == ("input-streaming", None)
    assert stored_message_problem(assembler.message.model_dump_json(by_alias=True)) is None


def test_a_streaming_tool_input_is_kept_within_the_assemblers_depth_limit() -> None:
    chunks = (
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "[[[1]]]"},
    )
    assert _parts(_assemble(*chunks, json_depth=3))[0]["input"] == [[[1]]]
    assert "input" not in _parts(_assemble(*chunks, json_depth=2))[0]


def test_tool_input_available_without_start_creates_the_part() -> None:
    assembler = _assemble(
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "add", "input": {}},
    )
    (part,) = assembler.message.parts
    assert isinstance(part, ToolPart)
    assert part.tool_name == "add"
    assert part.state == "input-available"


def test_tool_output_error() -> None:
    assembler = _assemble(
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "add", "input": {"a": 1}},
        {"type": "tool-output-error", "toolCallId": "c1", "errorText": "ZeroDivisionError"},
    )
    assert _parts(assembler) == [
        {
            "type": "tool-add",
            "toolCallId": "c1",
            "state": "output-error",
            "input": {"a": 1},
            "errorText": "ZeroDivisionError",
        }
    ]


def test_tool_input_error() -> None:
    assembler = _assemble(
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "add"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "{nope"},
        {
            "type": "tool-input-error",
            "toolCallId": "c1",
            "toolName": "add",
            "input": "{nope",
            "errorText": "invalid JSON",
        },
    )
    assert _parts(assembler) == [
        {
            "type": "tool-add",
            "toolCallId": "c1",
            "state": "output-error",
            "input": "{nope",
            "errorText": "invalid JSON",
        }
    ]


def test_dynamic_tool_chunks_make_dynamic_tool_parts() -> None:
    assembler = _assemble(
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "mcp", "dynamic": True},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "mcp",
            "input": {"q": 1},
            "dynamic": True,
            "providerExecuted": True,
        },
        {"type": "tool-output-available", "toolCallId": "c1", "output": "ok", "dynamic": True},
    )
    (part,) = assembler.message.parts
    assert isinstance(part, DynamicToolPart)
    assert _parts(assembler) == [
        {
            "type": "dynamic-tool",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {"q": 1},
            "output": "ok",
            "providerExecuted": True,
            "toolName": "mcp",
        }
    ]


def test_sources_and_files_become_parts() -> None:
    assembler = _assemble(
        {"type": "source-url", "sourceId": "s1", "url": "https://a.example", "title": "A"},
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "application/pdf",
            "title": "Doc",
            "providerMetadata": {"p": {"k": 1}},
        },
        {"type": "file", "url": "data:image/png;base64,AA==", "mediaType": "image/png"},
    )
    assert _parts(assembler) == [
        {"type": "source-url", "sourceId": "s1", "url": "https://a.example", "title": "A"},
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "application/pdf",
            "title": "Doc",
            "providerMetadata": {"p": {"k": 1}},
        },
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AA=="},
    ]


def test_data_parts_transient_skipped_and_replaced_by_id() -> None:
    assembler = _assemble(
        {"type": "data-progress", "data": {"pct": 10}, "transient": True},
        {"type": "data-weather", "id": "w", "data": {"status": "loading"}},
        {"type": "data-other", "id": "w", "data": 1},
        {"type": "data-weather", "data": "no id, appended"},
        {"type": "data-weather", "id": "w", "data": {"status": "done"}},
    )
    assert _parts(assembler) == [
        {"type": "data-weather", "id": "w", "data": {"status": "done"}},
        {"type": "data-other", "id": "w", "data": 1},
        {"type": "data-weather", "data": "no id, appended"},
    ]


def test_metadata_is_deep_merged_from_start_metadata_and_finish() -> None:
    assembler = _assemble(
        {"type": "start", "messageId": "m2", "messageMetadata": {"model": "x", "usage": {"in": 1}}},
        {"type": "message-metadata", "messageMetadata": {"usage": {"out": 2}}},
        {"type": "finish", "messageMetadata": {"model": "y"}},
        metadata={"createdAt": 5},
    )
    message = assembler.message
    assert message.id == "m2"
    assert message.metadata == {"createdAt": 5, "model": "y", "usage": {"in": 1, "out": 2}}
    assert assembler.finish_reason is None


def test_merge_metadata_replaces_non_dicts() -> None:
    assert merge_metadata(None, {"a": [1]}) == {"a": [1]}
    assert merge_metadata({"a": {"b": 1}}, {"a": 2}) == {"a": 2}


def test_error_abort_and_finish_step_change_no_parts() -> None:
    assembler = _assemble(
        {"type": "start-step"},
        {"type": "error", "errorText": "first"},
        {"type": "error", "errorText": "rate limited"},
        {"type": "finish-step"},
        {"type": "abort", "reason": "user"},
    )
    assert _parts(assembler) == [{"type": "step-start"}]
    assert assembler.error_text == "rate limited"
    assert assembler.aborted
    assert not assembler.has_content


def test_snapshots_are_independent_of_later_feeds() -> None:
    assembler = _assemble(
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "a"},
        {"type": "data-x", "id": "d", "data": {"n": [1]}},
        {"type": "message-metadata", "messageMetadata": {"k": {"v": 1}}},
    )
    snapshot = assembler.message
    _feed(
        assembler,
        {"type": "text-delta", "id": "t", "delta": "b"},
        {"type": "text-end", "id": "t"},
        {"type": "data-x", "id": "d", "data": {"n": [2]}},
        {"type": "message-metadata", "messageMetadata": {"k": {"v": 2}}},
    )
    assert snapshot.to_wire() == {
        "id": "m1",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "a", "state": "streaming"},
            {"type": "data-x", "id": "d", "data": {"n": [1]}},
        ],
        "metadata": {"k": {"v": 1}},
    }
    later = assembler.message
    assert later.parts[0] == TextPart(text="ab", state="done")
    later.parts.clear()
    assert len(assembler.message.parts) == 2


def test_parts_matching_copies_only_the_parts_it_finds_as_they_are_now() -> None:
    assembler = _assemble(
        {"type": "start-step"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "open"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"city": "Oslo"}'},
    )
    texts = assembler.parts_matching(lambda part: part.type == "text")
    tools = assembler.parts_matching(lambda part: isinstance(part, ToolPart))
    assert texts == [TextPart(text="open", state="streaming")]  # the open block so far
    assert len(tools) == 1 and isinstance(tools[0], ToolPart)
    assert tools[0].input == {"city": "Oslo"}  # the streamed input, parsed
    tools[0].input["city"] = "Bergen"
    assert _parts(assembler)[2]["input"] == {"city": "Oslo"}  # a copy: the reply is unchanged


def test_continuation_extends_initial_parts() -> None:
    first = _assemble(
        {"type": "start-step"},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "ask", "input": {}},
    ).message
    assembler = MessageAssembler("m1", parts=first.parts, metadata=first.metadata)
    assembler.feed(parse_chunk({"type": "tool-output-available", "toolCallId": "c1", "output": 1}))
    assert _parts(assembler)[1]["state"] == "output-available"
    assert first.parts[1].state == "input-available"  # type: ignore[union-attr]


def test_feed_accepts_wire_dicts() -> None:
    assembler = MessageAssembler("m1", role="user")
    assembler.feed({"type": "text-start", "id": "t"})
    assembler.feed(TextDeltaChunk(id="t", delta="x"))
    assert assembler.message.role == "user"
    assert _parts(assembler) == [{"type": "text", "text": "x", "state": "streaming"}]


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (
            [{"type": "text-delta", "id": "t9", "delta": "x"}],
            'text-delta for unknown text part id "t9" (no open text-start with that id)',
        ),
        (
            [*_text("t", "x"), {"type": "text-delta", "id": "t", "delta": "late"}],
            'text-delta for unknown text part id "t" (no open text-start with that id)',
        ),
        (
            [
                {"type": "text-start", "id": "t"},
                {"type": "finish-step"},
                {"type": "text-end", "id": "t"},
            ],
            'text-end for unknown text part id "t" (no open text-start with that id)',
        ),
        (
            [{"type": "reasoning-delta", "id": "r", "delta": "x"}],
            'reasoning-delta for unknown reasoning part id "r" '
            "(no open reasoning-start with that id)",
        ),
        (
            [{"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": "{"}],
            'tool-input-delta for unknown toolCallId "c" (no tool-input-start for it)',
        ),
        (
            [{"type": "tool-output-available", "toolCallId": "c", "output": 1}],
            'tool-output-available for unknown toolCallId "c" '
            "(no tool part with that id in the message)",
        ),
        (
            [{"type": "tool-output-error", "toolCallId": "c", "errorText": "x"}],
            'tool-output-error for unknown toolCallId "c" '
            "(no tool part with that id in the message)",
        ),
    ],
)
def test_chunks_for_unknown_ids_are_rejected(chunks: list[dict[str, Any]], expected: str) -> None:
    with pytest.raises(MessageValidationError) as info:
        _assemble(*chunks)
    assert str(info.value) == expected


def test_an_approval_moves_the_tool_part_through_the_sdk_states() -> None:
    """``tool-approval-request`` → ``approval-requested`` with the approval's id; an answer
    → ``approval-responded``; then the output keeps the approval, or ``output-denied``."""
    from think_jobs.assembly import MessageAssembler
    from think_jobs.messages import ToolApproval, ToolPart

    assembler = MessageAssembler("m")
    for chunk in (
        {"type": "start-step"},
        {"type": "tool-input-available", "toolCallId": "c", "toolName": "pay", "input": {}},
        {"type": "tool-input-available", "toolCallId": "d", "toolName": "pay", "input": {}},
        {"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "c"},
        {"type": "tool-approval-request", "approvalId": "a2", "toolCallId": "d"},
    ):
        assembler.feed(chunk)
    asked = [p for p in assembler.message.parts if isinstance(p, ToolPart)]
    assert [(p.state, p.approval) for p in asked] == [
        ("approval-requested", ToolApproval(id="a1")),
        ("approval-requested", ToolApproval(id="a2")),
    ]
    assembler.respond("c", ToolApproval(id="a1", approved=True))
    assembler.respond("d", ToolApproval(id="a2", approved=False, reason="no"))
    assembler.feed({"type": "tool-output-available", "toolCallId": "c", "output": 1})
    assembler.feed({"type": "tool-output-denied", "toolCallId": "d"})
    wire = [p for p in assembler.message.to_wire()["parts"] if p["type"] == "tool-pay"]
    assert wire == [
        {
            "type": "tool-pay",
            "toolCallId": "c",
            "state": "output-available",
            "input": {},
            "output": 1,
            "approval": {"id": "a1", "approved": True},
        },
        {
            "type": "tool-pay",
            "toolCallId": "d",
            "state": "output-denied",
            "input": {},
            "approval": {"id": "a2", "approved": False, "reason": "no"},
        },
    ]
