"""AI SDK v5 UI message stream chunks: what a turn streams to the browser, one JSON per event.

Models yield these (as models or plain dicts), the runner frames them, Redis carries them and a
JavaScript ``useChat`` client reads them unchanged, so the field sets and camelCase keys follow
the AI SDK exactly. A turn streams thousands of chunks, so ``parse_chunk`` and
``chunk_to_wire`` are on the hot path: one module-level ``TypeAdapter`` validates dicts and
model instances are passed through without revalidation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from think_jobs.errors import MessageValidationError
from think_jobs.messages import ProviderMetadata, WireModel, describe_missing_tag, join_path

FinishReason = Literal[
    "stop", "length", "content-filter", "tool-calls", "error", "other", "unknown"
]


class ChunkModel(WireModel):
    """Base of every chunk model (lets ``parse_chunk`` pass instances through cheaply)."""

    type: str


class StartChunk(ChunkModel):
    """Opens the assistant message; the runner sends it."""

    type: Literal["start"] = "start"
    message_id: str | None = None
    message_metadata: dict[str, Any] | None = None


class StartStepChunk(ChunkModel):
    """A model step (one LLM call) begins."""

    type: Literal["start-step"] = "start-step"


class FinishStepChunk(ChunkModel):
    """A model step ended; open text and reasoning blocks are closed."""

    type: Literal["finish-step"] = "finish-step"


class TextStartChunk(ChunkModel):
    """Opens a text block identified by ``id``."""

    type: Literal["text-start"] = "text-start"
    id: str
    provider_metadata: ProviderMetadata | None = None


class TextDeltaChunk(ChunkModel):
    """Appends ``delta`` to the open text block ``id``."""

    type: Literal["text-delta"] = "text-delta"
    id: str
    delta: str
    provider_metadata: ProviderMetadata | None = None


class TextEndChunk(ChunkModel):
    """Closes the text block ``id``."""

    type: Literal["text-end"] = "text-end"
    id: str
    provider_metadata: ProviderMetadata | None = None


class ReasoningStartChunk(ChunkModel):
    """Opens a reasoning block identified by ``id``."""

    type: Literal["reasoning-start"] = "reasoning-start"
    id: str
    provider_metadata: ProviderMetadata | None = None


class ReasoningDeltaChunk(ChunkModel):
    """Appends ``delta`` to the open reasoning block ``id``."""

    type: Literal["reasoning-delta"] = "reasoning-delta"
    id: str
    delta: str
    provider_metadata: ProviderMetadata | None = None


class ReasoningEndChunk(ChunkModel):
    """Closes the reasoning block ``id``."""

    type: Literal["reasoning-end"] = "reasoning-end"
    id: str
    provider_metadata: ProviderMetadata | None = None


ToolName = Annotated[str, Field(min_length=1)]  # a part's type is ``tool-<name>``


class ToolInputStartChunk(ChunkModel):
    """A tool call begins; its input JSON follows as ``tool-input-delta`` text."""

    type: Literal["tool-input-start"] = "tool-input-start"
    tool_call_id: str
    tool_name: ToolName
    provider_executed: bool | None = None
    dynamic: bool | None = None


class ToolInputDeltaChunk(ChunkModel):
    """A piece of the tool call's input JSON text."""

    type: Literal["tool-input-delta"] = "tool-input-delta"
    tool_call_id: str
    input_text_delta: str


class ToolInputAvailableChunk(ChunkModel):
    """The tool call's complete, parsed input."""

    type: Literal["tool-input-available"] = "tool-input-available"
    tool_call_id: str
    tool_name: ToolName
    input: Any = None
    provider_executed: bool | None = None
    provider_metadata: ProviderMetadata | None = None
    dynamic: bool | None = None


class ToolInputErrorChunk(ChunkModel):
    """The tool call's input could not be used (unparsable, schema mismatch, unknown tool)."""

    type: Literal["tool-input-error"] = "tool-input-error"
    tool_call_id: str
    tool_name: ToolName
    input: Any = None
    provider_executed: bool | None = None
    provider_metadata: ProviderMetadata | None = None
    dynamic: bool | None = None
    error_text: str


class ToolOutputAvailableChunk(ChunkModel):
    """The tool's result (``preliminary`` for intermediate results of a streaming tool)."""

    type: Literal["tool-output-available"] = "tool-output-available"
    tool_call_id: str
    output: Any = None
    provider_executed: bool | None = None
    dynamic: bool | None = None
    preliminary: bool | None = None


class ToolOutputErrorChunk(ChunkModel):
    """The tool raised; ``error_text`` says why."""

    type: Literal["tool-output-error"] = "tool-output-error"
    tool_call_id: str
    error_text: str
    provider_executed: bool | None = None
    dynamic: bool | None = None


class ToolApprovalRequestChunk(ChunkModel):
    """The tool call waits for a human's approval (``respond_to_approval``) before it runs."""

    type: Literal["tool-approval-request"] = "tool-approval-request"
    approval_id: str
    tool_call_id: str


class ToolOutputDeniedChunk(ChunkModel):
    """The tool call was denied (or its approval expired): it did not run."""

    type: Literal["tool-output-denied"] = "tool-output-denied"
    tool_call_id: str


class SourceUrlChunk(ChunkModel):
    """A web source the model cited."""

    type: Literal["source-url"] = "source-url"
    source_id: str
    url: str
    title: str | None = None
    provider_metadata: ProviderMetadata | None = None


class SourceDocumentChunk(ChunkModel):
    """A document source the model cited."""

    type: Literal["source-document"] = "source-document"
    source_id: str
    media_type: str
    title: str
    filename: str | None = None
    provider_metadata: ProviderMetadata | None = None


class FileChunk(ChunkModel):
    """A file the model produced, by URL (a data URL for inline content)."""

    type: Literal["file"] = "file"
    url: str
    media_type: str
    provider_metadata: ProviderMetadata | None = None


class DataChunk(ChunkModel):
    """Application data (``data-<name>``); ``transient`` data is streamed but not stored."""

    type: Annotated[str, Field(pattern=r"^data-.+$")]
    id: str | None = None
    data: Any = None
    transient: bool | None = None


class MessageMetadataChunk(ChunkModel):
    """Metadata merged into the message's ``metadata``."""

    type: Literal["message-metadata"] = "message-metadata"
    message_metadata: dict[str, Any]


class FinishChunk(ChunkModel):
    """Closes the assistant message; the runner sends it."""

    type: Literal["finish"] = "finish"
    finish_reason: FinishReason | None = None
    message_metadata: dict[str, Any] | None = None


class AbortChunk(ChunkModel):
    """The turn was cancelled; the runner sends it."""

    type: Literal["abort"] = "abort"
    reason: str | None = None


class ErrorChunk(ChunkModel):
    """Something went wrong; the stream shows ``error_text`` to the user."""

    type: Literal["error"] = "error"
    error_text: str


_TAGGED: dict[str, type[ChunkModel]] = {
    "start": StartChunk,
    "start-step": StartStepChunk,
    "finish-step": FinishStepChunk,
    "text-start": TextStartChunk,
    "text-delta": TextDeltaChunk,
    "text-end": TextEndChunk,
    "reasoning-start": ReasoningStartChunk,
    "reasoning-delta": ReasoningDeltaChunk,
    "reasoning-end": ReasoningEndChunk,
    "tool-input-start": ToolInputStartChunk,
    "tool-input-delta": ToolInputDeltaChunk,
    "tool-input-available": ToolInputAvailableChunk,
    "tool-input-error": ToolInputErrorChunk,
    "tool-output-available": ToolOutputAvailableChunk,
    "tool-output-error": ToolOutputErrorChunk,
    "tool-approval-request": ToolApprovalRequestChunk,
    "tool-output-denied": ToolOutputDeniedChunk,
    "source-url": SourceUrlChunk,
    "source-document": SourceDocumentChunk,
    "file": FileChunk,
    "data-*": DataChunk,
    "message-metadata": MessageMetadataChunk,
    "finish": FinishChunk,
    "abort": AbortChunk,
    "error": ErrorChunk,
}

CHUNK_TYPES: tuple[str, ...] = tuple("data-<name>" if tag == "data-*" else tag for tag in _TAGGED)


def _chunk_tag(value: Any) -> str | None:
    """Discriminator: the chunk's ``type``, with every ``data-*`` folded into one tag."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if type(kind) is not str:
        return None
    return "data-*" if kind.startswith("data-") else kind


Chunk = Annotated[
    Annotated[StartChunk, Tag("start")]
    | Annotated[StartStepChunk, Tag("start-step")]
    | Annotated[FinishStepChunk, Tag("finish-step")]
    | Annotated[TextStartChunk, Tag("text-start")]
    | Annotated[TextDeltaChunk, Tag("text-delta")]
    | Annotated[TextEndChunk, Tag("text-end")]
    | Annotated[ReasoningStartChunk, Tag("reasoning-start")]
    | Annotated[ReasoningDeltaChunk, Tag("reasoning-delta")]
    | Annotated[ReasoningEndChunk, Tag("reasoning-end")]
    | Annotated[ToolInputStartChunk, Tag("tool-input-start")]
    | Annotated[ToolInputDeltaChunk, Tag("tool-input-delta")]
    | Annotated[ToolInputAvailableChunk, Tag("tool-input-available")]
    | Annotated[ToolInputErrorChunk, Tag("tool-input-error")]
    | Annotated[ToolOutputAvailableChunk, Tag("tool-output-available")]
    | Annotated[ToolOutputErrorChunk, Tag("tool-output-error")]
    | Annotated[ToolApprovalRequestChunk, Tag("tool-approval-request")]
    | Annotated[ToolOutputDeniedChunk, Tag("tool-output-denied")]
    | Annotated[SourceUrlChunk, Tag("source-url")]
    | Annotated[SourceDocumentChunk, Tag("source-document")]
    | Annotated[FileChunk, Tag("file")]
    | Annotated[DataChunk, Tag("data-*")]
    | Annotated[MessageMetadataChunk, Tag("message-metadata")]
    | Annotated[FinishChunk, Tag("finish")]
    | Annotated[AbortChunk, Tag("abort")]
    | Annotated[ErrorChunk, Tag("error")],
    Discriminator(_chunk_tag),
]

_CHUNK_ADAPTER: TypeAdapter[Chunk] = TypeAdapter(Chunk)


class _ChunkTypeSet(frozenset[str]):
    """A frozenset of chunk types whose ``in`` also answers yes for any ``data-<name>``."""

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str) and item.startswith("data-") and len(item) > len("data-"):
            return True
        return super().__contains__(item)


FRAMING_CHUNK_TYPES: frozenset[str] = frozenset(
    {"start", "finish", "start-step", "finish-step", "abort"}
)
"""Chunk types only the runner sends: message and step framing, and abort."""

CONTENT_CHUNK_TYPES: frozenset[str] = _ChunkTypeSet(
    tag for tag in _TAGGED if tag != "data-*" and tag not in FRAMING_CHUNK_TYPES
)
"""Chunk types a model may yield. ``"data-weather" in CONTENT_CHUNK_TYPES`` is true too."""


def _describe_chunk_error(error: ErrorDetails, kind: str) -> str:
    if error["type"] == "union_tag_invalid":
        expected = ", ".join(CHUNK_TYPES)
        return f"unknown chunk type {json.dumps(kind)}; expected one of {expected}"
    if error["type"] == "union_tag_not_found":
        return describe_missing_tag(error["input"], "chunk", "a chunk")
    # loc[0] is the union tag; name the chunk by its real type instead.
    return f"{join_path(kind, error['loc'][1:])}: {error['msg']}"


def _chunk_error_text(exc: ValidationError, value: Mapping[str, Any]) -> str:
    kind = value.get("type")
    label = kind if isinstance(kind, str) else "chunk"
    return "; ".join(_describe_chunk_error(error, label) for error in exc.errors())


def parse_chunk(value: Chunk | Mapping[str, Any]) -> Chunk:
    """A chunk model from a model (returned unchanged) or a dict with wire or snake_case keys.

    Raises ``MessageValidationError`` naming the bad field (``text-delta.delta: Field
    required``) or the unknown type.
    """
    if isinstance(value, dict):
        try:
            return _CHUNK_ADAPTER.validate_python(value)
        except ValidationError as exc:
            raise MessageValidationError(_chunk_error_text(exc, value)) from exc
    if isinstance(value, ChunkModel):
        return value
    if isinstance(value, Mapping):
        return parse_chunk(dict(value))
    raise MessageValidationError(f"chunk: expected a chunk object, got {type(value).__name__}")


def chunk_to_wire(chunk: Chunk) -> dict[str, Any]:
    """JSON-ready dict with the AI SDK's camelCase keys; ``None`` fields are left out."""
    return chunk.model_dump(mode="json", by_alias=True, exclude_none=True)


def is_content_chunk(chunk: Chunk) -> bool:
    """Whether a model may yield this chunk (``CONTENT_CHUNK_TYPES``, ``data-*`` included)."""
    return chunk.type in CONTENT_CHUNK_TYPES


__all__ = [
    "CHUNK_TYPES",
    "CONTENT_CHUNK_TYPES",
    "FRAMING_CHUNK_TYPES",
    "AbortChunk",
    "Chunk",
    "ChunkModel",
    "DataChunk",
    "ErrorChunk",
    "FileChunk",
    "FinishChunk",
    "FinishReason",
    "FinishStepChunk",
    "MessageMetadataChunk",
    "ReasoningDeltaChunk",
    "ReasoningEndChunk",
    "ReasoningStartChunk",
    "SourceDocumentChunk",
    "SourceUrlChunk",
    "StartChunk",
    "StartStepChunk",
    "TextDeltaChunk",
    "TextEndChunk",
    "TextStartChunk",
    "ToolApprovalRequestChunk",
    "ToolInputAvailableChunk",
    "ToolInputDeltaChunk",
    "ToolInputErrorChunk",
    "ToolOutputAvailableChunk",
    "ToolOutputDeniedChunk",
    "ToolOutputErrorChunk",
    "chunk_to_wire",
    "is_content_chunk",
    "parse_chunk",
]
