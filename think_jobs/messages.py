"""AI SDK v5 ``UIMessage`` models, so what we store and stream is exactly what ``useChat`` reads.

A message is validated once at the edge (``coerce_message``) and trusted from then on. Python
code uses snake_case attributes; the wire (JSON for browsers and the database) uses the AI SDK's
camelCase keys through aliases, so a JavaScript client needs no translation layer. Models forbid
extra keys so that a typo such as ``toolCallID`` is an error instead of silently lost data, and
validation errors are rewritten to name the bad field with a path the caller can act on
(``messages[0].parts[1].text: Field required``). The edge also applies the input limits
(``think_jobs.limits``: depth, bytes, parts, messages), so whatever is stored reads back;
``stored_messages`` names the message at fault (``StoredMessageError``) if one still does not.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from think_jobs.errors import MessageValidationError, StoredMessageError
from think_jobs.json_text import array_elements, leading_id
from think_jobs.limits import (
    DEFAULT_LIMITS,
    ID_MAX_CHARS,
    IDENTIFIER_PATTERN,
    REASON_MAX_CHARS,
    REASON_PATTERN,
    Limits,
    entries,
    has_control_characters,
    is_unicode,
    over_limit,
    value_problem,
)

Role = Literal["system", "user", "assistant"]
ROLES: tuple[str, ...] = get_args(Role)
TextState = Literal["streaming", "done"]
ToolState = Literal[
    "input-streaming",
    "input-available",
    "approval-requested",
    "approval-responded",
    "output-available",
    "output-error",
    "output-denied",
]
AWAITING_ANSWER: tuple[ToolState, ...] = (
    "approval-requested",
    "approval-responded",
)  # a call an approval's answer applies to
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


class ToolApproval(WireModel):
    """A tool call's approval (AI SDK v6+): its id, and once answered the decision and why.
    The id follows the id rule and the reason the rule of a stored reason, so that an answer
    read from a message can be looked up and stored."""

    id: Annotated[
        str,
        StringConstraints(min_length=1, max_length=ID_MAX_CHARS, pattern=IDENTIFIER_PATTERN),
    ]
    approved: StrictBool | None = None
    reason: (
        Annotated[str, StringConstraints(max_length=REASON_MAX_CHARS, pattern=REASON_PATTERN)]
        | None
    ) = None


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
    approval: ToolApproval | None = None


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
    """Discriminator: the part's ``type``, with ``tool-*`` / ``data-*`` families folded.
    Called for every part validated or serialised: the common types are tested before the
    ``Mapping`` ABC, whose check costs several times more."""
    if isinstance(value, dict):
        kind = value.get("type")
    elif isinstance(value, WireModel) or not isinstance(value, Mapping):
        kind = getattr(value, "type", None)
    else:
        kind = value.get("type")
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


def readable_message(raw: str | None) -> UIMessage | None:
    """A stored message's JSON read back, or None when there is none or it no longer reads
    (a reader that rebuilds a stream's end goes on without it)."""
    if raw is None:
        return None
    try:
        return UIMessage.model_validate_json(raw)
    except ValueError:
        return None


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
    return f"{where}: {error['msg']}" if where else error["msg"]


def _message_error_text(exc: ValidationError, path: str) -> str:
    return "; ".join(_describe_message_error(error, path) for error in exc.errors())


def coerce_message(
    value: UIMessage | Mapping[str, Any],
    *,
    path: str = "message",
    limits: Limits = DEFAULT_LIMITS,
) -> UIMessage:
    """Validate one message given as a model or a dict with wire (or snake_case) keys.

    A ``UIMessage`` is returned as is (not copied). Errors, and messages over ``limits``,
    raise ``MessageValidationError`` whose text names each bad field, prefixed with ``path``.
    """
    return _sized_message(value, path, limits)[0]


def _sized_message(
    value: UIMessage | Mapping[str, Any], path: str, limits: Limits
) -> tuple[UIMessage, int]:
    """The validated message and its size in bytes as compact UTF-8 JSON."""
    if not isinstance(value, UIMessage | Mapping):
        raise MessageValidationError(
            f"{path}: expected a message object, got {type(value).__name__}"
        )
    _raise_if(_shape_problems(value, path, limits))
    message = value if isinstance(value, UIMessage) else _validated(value, path)
    size = message_bytes(message)
    problems = _label_problems(message, path)
    if size > limits.message_bytes:
        measured = f"{size} bytes as JSON"
        problems.append(over_limit(path, measured, limits.message_bytes, "max_message_bytes"))
    _raise_if(problems)
    return message, size


def message_bytes(message: UIMessage) -> int:
    """The message's size as compact UTF-8 JSON: what ``max_message_bytes`` bounds."""
    return len(_SERIALIZER.to_json(message, by_alias=True, exclude_none=True))


def _validated(value: Mapping[str, Any], path: str) -> UIMessage:
    try:
        return UIMessage.model_validate(dict(value))
    except ValidationError as exc:
        raise MessageValidationError(_message_error_text(exc, path)) from exc


def _raise_if(problems: list[str]) -> None:
    if problems:
        raise MessageValidationError("; ".join(problems))


def _shape_problems(value: object, path: str, limits: Limits) -> list[str]:
    """Parts per message, and every field a JSON value within the depth limit (before
    pydantic sees it: its serializer fails past ~250 levels, its JSON reader at 200)."""
    problems: list[str | None] = []
    for key, child in entries(value):
        where = f"{path}.{key}"
        if key == "parts" and isinstance(child, list | tuple):
            problems.extend(_parts_problems(child, where, limits))
        else:
            problems.append(value_problem(child, where, depth_limit=limits.json_depth))
    return [problem for problem in problems if problem is not None]


def _parts_problems(parts: Sequence[object], where: str, limits: Limits) -> list[str | None]:
    if len(parts) > limits.parts_per_message:
        measured = f"{len(parts)} parts"
        return [over_limit(where, measured, limits.parts_per_message, "max_parts_per_message")]
    return [
        value_problem(_plain(child), f"{where}[{index}].{key}", depth_limit=limits.json_depth)
        for index, part in enumerate(parts)
        for key, child in entries(part)
    ]


def _plain(value: object) -> object:
    """A part's typed field (a tool part's ``approval``) as the JSON it stands for."""
    if isinstance(value, WireModel):
        return value.model_dump(mode="python", by_alias=True, exclude_none=True)
    return value


_LABELS = ("type", "id", "tool_call_id", "tool_name", "source_id", "media_type")


def _label_problems(message: UIMessage, path: str) -> list[str]:
    """Ids and names stay short and hold no control characters (the message id is a
    VARCHAR(255) column, which cannot hold NUL; a tool call's id names its approval's row):
    the rule a model's chunks follow too (``engine.model_loop.label_problem``)."""
    problems = [_label_problem(message.id, f"{path}.id")]
    for index, part in enumerate(message.parts):
        fields = type(part).model_fields
        for name in _LABELS:
            label = getattr(part, name) if name in fields else None
            if isinstance(label, str):
                where = f"{path}.parts[{index}].{fields[name].alias or name}"
                problems.append(_label_problem(label, where))
    return [problem for problem in problems if problem is not None]


def _label_problem(label: str, where: str) -> str | None:
    if len(label) > ID_MAX_CHARS:
        return f"{where}: {len(label)} characters; the limit is {ID_MAX_CHARS}"
    if has_control_characters(label):
        return f"{where}: must not contain control characters"
    return None


def coerce_messages(
    values: Iterable[UIMessage | Mapping[str, Any]], *, limits: Limits = DEFAULT_LIMITS
) -> list[UIMessage]:
    """Validate a list of messages; the error lists every bad field as ``messages[<i>]...``.

    ``limits`` also bounds how many messages there are and their bytes in all.
    """
    if isinstance(values, str | bytes | Mapping):
        raise MessageValidationError(
            f"messages: expected a list of messages, got {type(values).__name__}"
        )
    items = list(values)
    _raise_if(_count_problems(items, limits))
    sized: list[tuple[UIMessage, int]] = []
    problems: list[str] = []
    for index, value in enumerate(items):
        try:
            sized.append(_sized_message(value, f"messages[{index}]", limits))
        except MessageValidationError as exc:
            problems.append(str(exc))
    _raise_if(problems or _total_problems(sum(size for _m, size in sized), limits))
    return [message for message, _size in sized]


def _count_problems(items: list[Any], limits: Limits) -> list[str]:
    if len(items) <= limits.messages_per_submission:
        return []
    most = limits.messages_per_submission
    measured = f"{len(items)} messages, at most {most} messages per submission"
    return [over_limit("messages", measured, most, "max_messages_per_submission")]


def _total_problems(total: int, limits: Limits) -> list[str]:
    if total <= limits.submission_bytes:
        return []
    measured = f"{total} bytes as JSON in all"
    return [over_limit("messages", measured, limits.submission_bytes, "max_submission_bytes")]


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
    "ToolApproval",
    "ToolPart",
    "ToolState",
    "UIMessage",
    "WireModel",
    "coerce_message",
    "coerce_messages",
    "describe_missing_tag",
    "join_path",
    "message_bytes",
    "message_text",
    "new_message_id",
    "stored_message_problem",
    "stored_messages",
    "unappliable_reason",
    "user_text_message",
]


_MESSAGE_LIST: TypeAdapter[list[UIMessage]] = TypeAdapter(list[UIMessage])
_SERIALIZER = UIMessage.__pydantic_serializer__


def stored_messages(json_array: str) -> list[UIMessage]:
    """Messages read back from storage (a JSON array): validated once, in one pass.

    Raises ``StoredMessageError`` naming the first message that cannot be read (its id, its
    position and why), never a bare pydantic error: the caller can tell the operator which
    message to remove or repair.
    """
    try:
        return _MESSAGE_LIST.validate_json(json_array)
    except ValidationError as exc:
        raise _unreadable(json_array, exc) from exc


def stored_message_problem(json_object: str) -> str | None:
    """Why one stored message (JSON text) does not read back, or None when it does. It is
    read as it is in a conversation: as an element of an array, one level down."""
    try:
        _MESSAGE_LIST.validate_json(f"[{json_object}]")
    except ValidationError as exc:
        errors = exc.errors()
        for error in errors:
            error["loc"] = error["loc"][1:]  # the array index is not the message's
        return "; ".join(_describe_message_error(error, "") for error in errors)
    return None


def unappliable_reason(messages: object) -> str | None:
    """Why a submission's stored messages cannot join the conversation, or None when they can.

    Submissions are validated as they are admitted, so only a row an older version or a
    manual edit left fails here: not a list of objects, each with an id and a role the
    message table can hold. Their parts are looked at when the conversation is read back
    (``stored_messages``); this is the least the rows must be to be written at all.
    """
    if messages is None:
        return None
    if not isinstance(messages, list):
        return f"messages: expected a list, got {type(messages).__name__}"
    for index, message in enumerate(messages):
        problem = _unappliable_message(message)
        if problem is not None:
            return f"messages[{index}]: {problem}"
    return None


def _unappliable_message(message: object) -> str | None:
    if not isinstance(message, dict):
        return f"expected an object, got {type(message).__name__}"
    identity, role = message.get("id"), message.get("role")
    if identity is None or identity == "":
        return "no id"
    if not isinstance(identity, str):
        return f"an id that is not a string but {type(identity).__name__}"
    if len(identity) > ID_MAX_CHARS:
        return f"an id of {len(identity)} characters; at most {ID_MAX_CHARS} can be stored"
    if has_control_characters(identity) or not is_unicode(identity):
        return "an id holding control characters or a lone surrogate"
    if role not in ROLES:
        return f"role {str(role)[:20]!r}: expected one of {', '.join(ROLES)}"
    return None


def _unreadable(json_array: str, exc: ValidationError) -> StoredMessageError:
    for position, text in enumerate(array_elements(json_array)):
        problem = stored_message_problem(text)
        if problem is not None:
            return StoredMessageError(leading_id(text), problem, position)
    return StoredMessageError(None, _message_error_text(exc, "messages"))
