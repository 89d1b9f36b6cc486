"""Build a ``UIMessage`` from a UI message chunk stream, the way the AI SDK's client does.

The server must store exactly the message a ``useChat`` client would have assembled from the
same stream, so this mirrors the AI SDK's ``processUIMessageStream``: text and reasoning blocks
grow by id, tool parts move through their states by ``toolCallId``, data parts with an id are
replaced in place, metadata is deep-merged. Text deltas are the bulk of a turn, so they are
buffered and joined lazily instead of re-concatenating the part's text on every delta.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from think_jobs.chunks import (
    AbortChunk,
    Chunk,
    ChunkModel,
    DataChunk,
    ErrorChunk,
    FileChunk,
    FinishChunk,
    FinishReason,
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
    ToolApprovalRequestChunk,
    ToolInputAvailableChunk,
    ToolInputDeltaChunk,
    ToolInputErrorChunk,
    ToolInputStartChunk,
    ToolOutputAvailableChunk,
    ToolOutputDeniedChunk,
    ToolOutputErrorChunk,
    parse_chunk,
)
from think_jobs.errors import MessageValidationError
from think_jobs.limits import DEFAULT_LIMITS, value_problem
from think_jobs.messages import (
    DataPart,
    DynamicToolPart,
    FilePart,
    Part,
    ReasoningPart,
    Role,
    SourceDocumentPart,
    SourceUrlPart,
    StepStartPart,
    TextPart,
    ToolApproval,
    ToolPart,
    UIMessage,
)

_AnyToolPart = ToolPart | DynamicToolPart


@dataclass
class _OpenBlock:
    """A text or reasoning part still receiving deltas, with the deltas not yet joined in."""

    part: TextPart | ReasoningPart
    pending: list[str] = field(default_factory=list)

    def flush(self) -> None:
        if self.pending:
            self.part.text += "".join(self.pending)
            self.pending.clear()


def merge_metadata(base: dict[str, Any] | None, update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge like the AI SDK's ``mergeObjects``: nested dicts merge, anything else replaces."""
    merged = dict(base or {})
    for key, value in update.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            merged[key] = merge_metadata(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class MessageAssembler:
    """Feed chunks in stream order; read ``message`` for a snapshot at any point.

    ``parts`` (deep-copied) lets a continuation extend a stored partial message: its tool parts
    can still receive outputs and its data parts can be replaced by id. ``json_depth`` bounds
    the input parsed from a tool call's streamed text (``max_json_depth``; the runner sets it).
    """

    def __init__(
        self,
        message_id: str,
        *,
        role: Role = "assistant",
        metadata: Mapping[str, Any] | None = None,
        parts: Iterable[Part] | None = None,
        json_depth: int = DEFAULT_LIMITS.json_depth,
    ) -> None:
        self.json_depth = json_depth
        self._message_id = message_id
        self._role: Role = role
        self._metadata = copy.deepcopy(dict(metadata)) if metadata is not None else None
        self._parts: list[Part] = [part.model_copy(deep=True) for part in parts or ()]
        self._texts: dict[str, _OpenBlock] = {}
        self._reasonings: dict[str, _OpenBlock] = {}
        self._tools: dict[str, _AnyToolPart] = {}
        self._tool_inputs: dict[str, list[str]] = {}
        self._data: dict[tuple[str, str], DataPart] = {}
        self._finish_reason: FinishReason | None = None
        self._error_text: str | None = None
        self._aborted = False
        for part in self._parts:
            self._index(part)

    # -- reading -------------------------------------------------------------------------------

    @property
    def message(self) -> UIMessage:
        """A deep copy of the message so far, safe to store while feeding continues."""
        self._flush_open_blocks()
        self._parse_streaming_inputs()
        return UIMessage(
            id=self._message_id,
            role=self._role,
            parts=[part.model_copy(deep=True) for part in self._parts],
            metadata=copy.deepcopy(self._metadata),
        )

    def parts_matching(self, keep: Callable[[Part], bool]) -> list[Part]:
        """Deep copies of the parts so far that ``keep`` accepts: a scan that copies only what
        it finds (``message`` copies every part)."""
        self._flush_open_blocks()
        self._parse_streaming_inputs()
        return [part.model_copy(deep=True) for part in self._parts if keep(part)]

    @property
    def part_count(self) -> int:
        """How many parts the message has so far."""
        return len(self._parts)

    @property
    def message_id(self) -> str:
        """The message id (a ``start`` chunk with ``messageId`` changes it, as in the AI SDK)."""
        return self._message_id

    @property
    def has_content(self) -> bool:
        """Whether any part other than ``step-start`` exists."""
        return any(not isinstance(part, StepStartPart) for part in self._parts)

    @property
    def finish_reason(self) -> FinishReason | None:
        """The ``finishReason`` of the ``finish`` chunk, if one was fed."""
        return self._finish_reason

    @property
    def error_text(self) -> str | None:
        """The ``errorText`` of the last ``error`` chunk fed, if any."""
        return self._error_text

    @property
    def aborted(self) -> bool:
        """Whether an ``abort`` chunk was fed."""
        return self._aborted

    # -- feeding -------------------------------------------------------------------------------

    def respond(self, tool_call_id: str, approval: ToolApproval) -> None:
        """Record the answer to a tool call's approval (``approval-responded``; the AI SDK's
        UI stream has no chunk for it: the tool's output or ``tool-output-denied`` follows)."""
        part = self._known_tool(tool_call_id, "approval response")
        self._set_tool_state(
            part, provider_executed=None, state="approval-responded", input=part.input
        )
        part.approval = approval

    def feed(self, chunk: Chunk | Mapping[str, Any]) -> None:
        """Apply one chunk (a model, or a wire dict which is validated first)."""
        if not isinstance(chunk, ChunkModel):
            chunk = parse_chunk(chunk)
        _HANDLERS[type(chunk)](self, chunk)

    def _on_start(self, chunk: StartChunk) -> None:
        if chunk.message_id is not None:
            self._message_id = chunk.message_id
        self._merge_metadata(chunk.message_metadata)

    def _on_start_step(self, chunk: StartStepChunk) -> None:
        self._parts.append(StepStartPart())

    def _on_finish_step(self, chunk: FinishStepChunk) -> None:
        self._flush_open_blocks()
        self._texts.clear()
        self._reasonings.clear()

    def _on_text_start(self, chunk: TextStartChunk) -> None:
        part = TextPart(text="", state="streaming", provider_metadata=chunk.provider_metadata)
        self._parts.append(part)
        self._open(self._texts, chunk.id, part)

    def _on_text_delta(self, chunk: TextDeltaChunk) -> None:
        self._append_delta(self._texts, chunk.id, chunk.delta, chunk, "text")

    def _on_text_end(self, chunk: TextEndChunk) -> None:
        self._close_block(self._texts, chunk, "text")

    def _on_reasoning_start(self, chunk: ReasoningStartChunk) -> None:
        part = ReasoningPart(text="", state="streaming", provider_metadata=chunk.provider_metadata)
        self._parts.append(part)
        self._open(self._reasonings, chunk.id, part)

    def _on_reasoning_delta(self, chunk: ReasoningDeltaChunk) -> None:
        self._append_delta(self._reasonings, chunk.id, chunk.delta, chunk, "reasoning")

    def _on_reasoning_end(self, chunk: ReasoningEndChunk) -> None:
        self._close_block(self._reasonings, chunk, "reasoning")

    def _on_tool_input_start(self, chunk: ToolInputStartChunk) -> None:
        self._tool_inputs[chunk.tool_call_id] = []
        self._upsert_tool(
            chunk.tool_call_id,
            chunk.tool_name,
            dynamic=bool(chunk.dynamic),
            provider_executed=chunk.provider_executed,
            state="input-streaming",
            input=None,
        )

    def _on_tool_input_delta(self, chunk: ToolInputDeltaChunk) -> None:
        pieces = self._tool_inputs.get(chunk.tool_call_id)
        if pieces is None:
            raise MessageValidationError(
                f"tool-input-delta for unknown toolCallId {json.dumps(chunk.tool_call_id)} "
                "(no tool-input-start for it)"
            )
        pieces.append(chunk.input_text_delta)

    def _on_tool_input_available(self, chunk: ToolInputAvailableChunk) -> None:
        self._tool_inputs.pop(chunk.tool_call_id, None)
        part = self._upsert_tool(
            chunk.tool_call_id,
            chunk.tool_name,
            dynamic=bool(chunk.dynamic),
            provider_executed=chunk.provider_executed,
            state="input-available",
            input=copy.deepcopy(chunk.input),
        )
        if chunk.provider_metadata is not None:
            part.call_provider_metadata = copy.deepcopy(chunk.provider_metadata)

    def _on_tool_input_error(self, chunk: ToolInputErrorChunk) -> None:
        self._tool_inputs.pop(chunk.tool_call_id, None)
        part = self._upsert_tool(
            chunk.tool_call_id,
            chunk.tool_name,
            dynamic=bool(chunk.dynamic),
            provider_executed=chunk.provider_executed,
            state="output-error",
            input=copy.deepcopy(chunk.input),
            error_text=chunk.error_text,
        )
        if chunk.provider_metadata is not None:
            part.call_provider_metadata = copy.deepcopy(chunk.provider_metadata)

    def _on_tool_output_available(self, chunk: ToolOutputAvailableChunk) -> None:
        part = self._known_tool(chunk.tool_call_id, chunk.type)
        self._set_tool_state(
            part,
            provider_executed=chunk.provider_executed,
            state="output-available",
            input=part.input,
            output=copy.deepcopy(chunk.output),
            preliminary=chunk.preliminary,
        )

    def _on_tool_output_error(self, chunk: ToolOutputErrorChunk) -> None:
        part = self._known_tool(chunk.tool_call_id, chunk.type)
        self._set_tool_state(
            part,
            provider_executed=chunk.provider_executed,
            state="output-error",
            input=part.input,
            error_text=chunk.error_text,
        )

    def _on_tool_approval_request(self, chunk: ToolApprovalRequestChunk) -> None:
        part = self._known_tool(chunk.tool_call_id, chunk.type)
        self._set_tool_state(
            part, provider_executed=None, state="approval-requested", input=part.input
        )
        part.approval = ToolApproval(id=chunk.approval_id)

    def _on_tool_output_denied(self, chunk: ToolOutputDeniedChunk) -> None:
        part = self._known_tool(chunk.tool_call_id, chunk.type)
        self._set_tool_state(part, provider_executed=None, state="output-denied", input=part.input)

    def _on_source_url(self, chunk: SourceUrlChunk) -> None:
        data = chunk.model_dump(exclude_none=True, by_alias=False)
        self._parts.append(SourceUrlPart(**data))

    def _on_source_document(self, chunk: SourceDocumentChunk) -> None:
        data = chunk.model_dump(exclude_none=True, by_alias=False)
        self._parts.append(SourceDocumentPart(**data))

    def _on_file(self, chunk: FileChunk) -> None:
        data = chunk.model_dump(exclude_none=True, by_alias=False)
        self._parts.append(FilePart(**data))

    def _on_data(self, chunk: DataChunk) -> None:
        if chunk.transient:
            return
        existing = self._data.get((chunk.type, chunk.id)) if chunk.id is not None else None
        if existing is not None:
            existing.data = copy.deepcopy(chunk.data)
            return
        part = DataPart(type=chunk.type, id=chunk.id, data=copy.deepcopy(chunk.data))
        self._parts.append(part)
        self._index(part)

    def _on_message_metadata(self, chunk: MessageMetadataChunk) -> None:
        self._merge_metadata(chunk.message_metadata)

    def _on_finish(self, chunk: FinishChunk) -> None:
        if chunk.finish_reason is not None:
            self._finish_reason = chunk.finish_reason
        self._merge_metadata(chunk.message_metadata)

    def _on_abort(self, chunk: AbortChunk) -> None:
        self._aborted = True

    def _on_error(self, chunk: ErrorChunk) -> None:
        self._error_text = chunk.error_text

    # -- helpers -------------------------------------------------------------------------------

    def _index(self, part: Part) -> None:
        if isinstance(part, ToolPart | DynamicToolPart):
            self._tools[part.tool_call_id] = part
        elif isinstance(part, DataPart) and part.id is not None:
            self._data[(part.type, part.id)] = part

    def _merge_metadata(self, update: Mapping[str, Any] | None) -> None:
        if update is not None:
            self._metadata = merge_metadata(self._metadata, update)

    @staticmethod
    def _open(blocks: dict[str, _OpenBlock], block_id: str, part: TextPart | ReasoningPart) -> None:
        """A block id reused (a continuation after an interrupted attempt) starts a new part;
        the old one keeps the text it received, as in the AI SDK's client."""
        previous = blocks.get(block_id)
        if previous is not None:
            previous.flush()
        blocks[block_id] = _OpenBlock(part)

    def _append_delta(
        self,
        blocks: dict[str, _OpenBlock],
        block_id: str,
        delta: str,
        chunk: TextDeltaChunk | ReasoningDeltaChunk,
        kind: str,
    ) -> None:
        block = blocks.get(block_id)
        if block is None:
            raise _unknown_block(chunk.type, kind, block_id)
        block.pending.append(delta)
        if chunk.provider_metadata is not None:
            block.part.provider_metadata = chunk.provider_metadata

    def _close_block(
        self, blocks: dict[str, _OpenBlock], chunk: TextEndChunk | ReasoningEndChunk, kind: str
    ) -> None:
        block = blocks.pop(chunk.id, None)
        if block is None:
            raise _unknown_block(chunk.type, kind, chunk.id)
        block.flush()
        block.part.state = "done"
        if chunk.provider_metadata is not None:
            block.part.provider_metadata = chunk.provider_metadata

    def _flush_open_blocks(self) -> None:
        for block in (*self._texts.values(), *self._reasonings.values()):
            block.flush()

    def _parse_streaming_inputs(self) -> None:
        """Best effort: a streaming tool input that is already complete JSON, and a value that
        could be stored and read back, becomes ``input`` (the call may never get its
        ``tool-input-available``: the model ended its stream, or the turn ended first)."""
        for tool_call_id, pieces in self._tool_inputs.items():
            part = self._tools[tool_call_id]
            if part.state != "input-streaming" or not pieces:
                continue
            parsed = parsed_json("".join(pieces), self.json_depth)
            if parsed is not _UNPARSED:
                part.input = parsed

    def _known_tool(self, tool_call_id: str, chunk_type: str) -> _AnyToolPart:
        part = self._tools.get(tool_call_id)
        if part is None:
            raise MessageValidationError(
                f"{chunk_type} for unknown toolCallId {json.dumps(tool_call_id)} "
                "(no tool part with that id in the message)"
            )
        return part

    def _upsert_tool(
        self,
        tool_call_id: str,
        tool_name: str,
        *,
        dynamic: bool,
        provider_executed: bool | None,
        **state: Any,
    ) -> _AnyToolPart:
        part = self._tools.get(tool_call_id)
        if part is None:
            part = _new_tool_part(tool_call_id, tool_name, dynamic=dynamic, **state)
            self._parts.append(part)
            self._index(part)
        self._set_tool_state(part, provider_executed=provider_executed, **state)
        return part

    @staticmethod
    def _set_tool_state(
        part: _AnyToolPart, *, provider_executed: bool | None, **state: Any
    ) -> None:
        """Set the new state's fields and clear the other state fields, as the AI SDK does."""
        part.state = state["state"]
        part.input = state.get("input")
        part.output = state.get("output")
        part.error_text = state.get("error_text")
        part.preliminary = state.get("preliminary")
        if provider_executed is not None:
            part.provider_executed = provider_executed


_UNPARSED = object()


def parsed_json(text: str, depth_limit: int) -> Any:
    """The JSON value ``text`` holds if it is one that could be stored and read back (within
    ``depth_limit`` levels, no lone surrogate, no NaN: ``value_problem``), else ``_UNPARSED``.
    Text nested past the parser's own recursion limit is not JSON here either."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return _UNPARSED
    if value_problem(value, "input", depth_limit=depth_limit) is not None:
        return _UNPARSED
    return value


def _new_tool_part(
    tool_call_id: str, tool_name: str, *, dynamic: bool, **state: Any
) -> _AnyToolPart:
    if dynamic:
        return DynamicToolPart(tool_call_id=tool_call_id, tool_name=tool_name, **state)
    return ToolPart(type=f"tool-{tool_name}", tool_call_id=tool_call_id, **state)


def _unknown_block(chunk_type: str, kind: str, block_id: str) -> MessageValidationError:
    return MessageValidationError(
        f"{chunk_type} for unknown {kind} part id {json.dumps(block_id)} "
        f"(no open {kind}-start with that id)"
    )


_HANDLERS: dict[type[ChunkModel], Callable[[MessageAssembler, Any], None]] = {
    StartChunk: MessageAssembler._on_start,
    StartStepChunk: MessageAssembler._on_start_step,
    FinishStepChunk: MessageAssembler._on_finish_step,
    TextStartChunk: MessageAssembler._on_text_start,
    TextDeltaChunk: MessageAssembler._on_text_delta,
    TextEndChunk: MessageAssembler._on_text_end,
    ReasoningStartChunk: MessageAssembler._on_reasoning_start,
    ReasoningDeltaChunk: MessageAssembler._on_reasoning_delta,
    ReasoningEndChunk: MessageAssembler._on_reasoning_end,
    ToolInputStartChunk: MessageAssembler._on_tool_input_start,
    ToolInputDeltaChunk: MessageAssembler._on_tool_input_delta,
    ToolInputAvailableChunk: MessageAssembler._on_tool_input_available,
    ToolInputErrorChunk: MessageAssembler._on_tool_input_error,
    ToolOutputAvailableChunk: MessageAssembler._on_tool_output_available,
    ToolOutputErrorChunk: MessageAssembler._on_tool_output_error,
    ToolApprovalRequestChunk: MessageAssembler._on_tool_approval_request,
    ToolOutputDeniedChunk: MessageAssembler._on_tool_output_denied,
    SourceUrlChunk: MessageAssembler._on_source_url,
    SourceDocumentChunk: MessageAssembler._on_source_document,
    FileChunk: MessageAssembler._on_file,
    DataChunk: MessageAssembler._on_data,
    MessageMetadataChunk: MessageAssembler._on_message_metadata,
    FinishChunk: MessageAssembler._on_finish,
    AbortChunk: MessageAssembler._on_abort,
    ErrorChunk: MessageAssembler._on_error,
}

__all__ = ["MessageAssembler", "merge_metadata"]
