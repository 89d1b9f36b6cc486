"""AI SDK v5 ``UIMessage`` models, so what we store and stream is exactly what ``useChat`` reads.

A message is validated once at the edge (``coerce_message``) and trusted from then on. Python
code uses snake_case attributes; the wire (JSON for browsers and the database) uses the AI SDK's
camelCase keys through aliases, so a JavaScript client needs no translation layer. Models forbid
extra keys so that a typo such as ``toolCallID`` is an error instead of silently lost data, and
validation errors are rewritten to name the bad field with a path the caller can act on
(``messages[0].parts[1].text: Field required``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from think_jobs.errors import MessageValidationError

Role = Literal["system", "user", "assistant"]
TextState = Literal["streaming", "done"]
ToolState = Literal["input-streaming", "input-available", "output-available", "output-error"]
ProviderMetadata = dict[str, dict[str, Any]]


class WireModel(BaseModel):
    """Base of every wire shape: camelCase aliases out, snake_case or camelCase in, no extras."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
    )


class TextPart(WireModel):
    """Assistant or user text; ``state`` is ``streaming`` until the text block ended."""

    type: Literal["text"] = "text"
    text: str
    state: TextState | None = None
    provider_metadata: ProviderMetadata | None = None


class ReasoningPart(WireModel):
    """Model reasoning text, shaped like a text part."""

    type: Literal["reasoning"] = "reasoning"
    text: str
    state: TextState | None = None
    provider_metadata: ProviderMetadata | None = None


class _ToolCallPart(WireModel):
    """Fields shared by static (``tool-<name>``) and dynamic tool parts."""

    type: str
    tool_call_id: str
    state: ToolState
    input: Any = None
    output: Any = None
    error_text: str | None = None
    raw_input: Any = None
    provider_executed: StrictBool | None = None  # JSON true/false only, not "yes" or 1
    call_provider_metadata: ProviderMetadata | None = None
    preliminary: StrictBool | None = None


class ToolPart(_ToolCallPart):
    """A call of a tool known in advance; the tool name is part of ``type`` (``tool-weather``)."""

    type: Annotated[str, Field(pattern=r"^tool-.+$")]

    @property
    def tool_name(self) -> str:
        """The name after the ``tool-`` prefix."""
        return self.type[len("tool-") :]


class DynamicToolPart(_ToolCallPart):
    """A call of a tool not known when the UI was typed (MCP and the like)."""

    type: Literal["dynamic-tool"] = "dynamic-tool"
    tool_name: str


class SourceUrlPart(WireModel):
    """A web source the model cited."""

    type: Literal["source-url"] = "source-url"
    source_id: str
    url: str
    title: str | None = None
    provider_metadata: ProviderMetadata | None = None


class SourceDocumentPart(WireModel):
    """A document source the model cited."""

    type: Literal["source-document"] = "source-document"
    source_id: str
    media_type: str
    title: str
    filename: str | None = None
    provider_metadata: ProviderMetadata | None = None


class FilePart(WireModel):
    """A file, by URL (a data URL for inline content)."""

    type: Literal["file"] = "file"
    media_type: str
    filename: str | None = None
    url: str
    provider_metadata: ProviderMetadata | None = None


class DataPart(WireModel):
    """Application data; the name is part of ``type`` (``data-weather``)."""

    type: Annotated[str, Field(pattern=r"^data-.+$")]
    id: str | None = None
    data: Any = None


class StepStartPart(WireModel):
    """Marks where a new model step (LLM call) of the turn begins."""

    type: Literal["step-start"] = "step-start"


PART_TYPES: tuple[str, ...] = (
    "text",
    "reasoning",
    "tool-<name>",
    "dynamic-tool",
    "source-url",
    "source-document",
    "file",
    "data-<name>",
    "step-start",
)


def _part_tag(value: Any) -> str | None:
    """Discriminator: the part's ``type``, with ``tool-*`` / ``data-*`` families folded."""
    kind = value.get("type") if isinstance(value, Mapping) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return None
    if kind.startswith("tool-"):
        return "tool-*"
    if kind.startswith("data-"):
        return "data-*"
    return kind


Part = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ReasoningPart, Tag("reasoning")]
    | Annotated[ToolPart, Tag("tool-*")]
    | Annotated[DynamicToolPart, Tag("dynamic-tool")]
    | Annotated[SourceUrlPart, Tag("source-url")]
    | Annotated[SourceDocumentPart, Tag("source-document")]
    | Annotated[FilePart, Tag("file")]
    | Annotated[DataPart, Tag("data-*")]
    | Annotated[StepStartPart, Tag("step-start")],
    Discriminator(_part_tag),
]


class UIMessage(WireModel):
    """One chat message as the AI SDK's ``useChat`` sees it."""

    id: str
    role: Role
    parts: list[Part]
    metadata: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict with the AI SDK's camelCase keys; ``None`` fields are left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def new_message_id() -> str:
    """A fresh message id (uuid4 text)."""
    return str(uuid.uuid4())


def user_text_message(text: str) -> UIMessage:
    """A user message with one text part; the empty string is a valid (empty) message."""
    return UIMessage(id=new_message_id(), role="user", parts=[TextPart(text=text)])


def message_text(message: UIMessage) -> str:
    """The message's text parts joined without separator (reasoning is not text)."""
    return "".join(part.text for part in message.parts if isinstance(part, TextPart))


def join_path(prefix: str, loc: Sequence[str | int]) -> str:
    """``join_path("messages[0]", ("parts", 1, "text"))`` → ``messages[0].parts[1].text``."""
    out = prefix
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        else:
            out += f".{item}" if out else item
    return out


def describe_missing_tag(value: Any, path: str, what: str) -> str:
    """Why a discriminator found no ``type``: missing, not a string, or not an object at all."""
    if not isinstance(value, Mapping):
        return f"{path}: expected {what} object, got {type(value).__name__}"
    if "type" not in value:
        return f"{join_path(path, ['type'])}: Field required"
    return f"{join_path(path, ['type'])}: expected a string, got {type(value['type']).__name__}"


def _without_part_tag(loc: Sequence[str | int]) -> list[str | int]:
    """Drop the union tag pydantic puts after ``parts[i]`` in error locations."""
    items = list(loc)
    if len(items) >= 3 and items[0] == "parts" and isinstance(items[1], int):
        del items[2]
    return items


def _describe_message_error(error: ErrorDetails, path: str) -> str:
    loc = _without_part_tag(error["loc"])
    where = join_path(path, loc)
    if error["type"] == "union_tag_invalid":
        tag = (error.get("ctx") or {}).get("tag")
        expected = ", ".join(PART_TYPES)
        return f"{where}: unknown message part type {json.dumps(tag)}; expected one of {expected}"
    if error["type"] == "union_tag_not_found":
        return describe_missing_tag(error["input"], where, "a message part")
    return f"{where}: {error['msg']}"


def _message_error_text(exc: ValidationError, path: str) -> str:
    return "; ".join(_describe_message_error(error, path) for error in exc.errors())


def coerce_message(value: UIMessage | Mapping[str, Any], *, path: str = "message") -> UIMessage:
    """Validate one message given as a model or a dict with wire (or snake_case) keys.

    A ``UIMessage`` is returned as is (not copied). Errors raise ``MessageValidationError``
    whose text names each bad field, prefixed with ``path``.
    """
    if isinstance(value, UIMessage):
        return value
    if not isinstance(value, Mapping):
        raise MessageValidationError(
            f"{path}: expected a message object, got {type(value).__name__}"
        )
    try:
        return UIMessage.model_validate(dict(value))
    except ValidationError as exc:
        raise MessageValidationError(_message_error_text(exc, path)) from exc


def coerce_messages(values: Iterable[UIMessage | Mapping[str, Any]]) -> list[UIMessage]:
    """Validate a list of messages; the error lists every bad field as ``messages[<i>]...``."""
    if isinstance(values, str | bytes | Mapping):
        raise MessageValidationError(
            f"messages: expected a list of messages, got {type(values).__name__}"
        )
    messages: list[UIMessage] = []
    problems: list[str] = []
    for index, value in enumerate(values):
        try:
            messages.append(coerce_message(value, path=f"messages[{index}]"))
        except MessageValidationError as exc:
            problems.append(str(exc))
    if problems:
        raise MessageValidationError("; ".join(problems))
    return messages


__all__ = [
    "PART_TYPES",
    "DataPart",
    "DynamicToolPart",
    "FilePart",
    "Part",
    "ProviderMetadata",
    "ReasoningPart",
    "Role",
    "SourceDocumentPart",
    "SourceUrlPart",
    "StepStartPart",
    "TextPart",
    "TextState",
    "ToolPart",
    "ToolState",
    "UIMessage",
    "WireModel",
    "coerce_message",
    "coerce_messages",
    "describe_missing_tag",
    "join_path",
    "message_text",
    "new_message_id",
    "user_text_message",
]


_MESSAGE_LIST: TypeAdapter[list[UIMessage]] = TypeAdapter(list[UIMessage])


def stored_messages(json_array: str) -> list[UIMessage]:
    """Messages read back from storage (a JSON array): validated once, in one pass."""
    return _MESSAGE_LIST.validate_json(json_array)
