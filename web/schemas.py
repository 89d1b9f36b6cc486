"""Request and response bodies of the HTTP API, as pydantic models.

Fields are snake_case; messages and chunks keep the AI SDK's camelCase wire names (they are
``UIMessage``/chunk JSON as the core stores them). The OpenAPI document is generated from these
models (``web.openapi``), so a field added here is documented there.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StringConstraints,
)

from think_jobs.messages import UIMessage
from think_jobs.results import (
    Approval,
    ApprovalStatus,
    SubmissionInspection,
    SubmissionStatus,
    SubmitMessagesResult,
)
from think_jobs.validation import (
    AGENT_NAME_MAX_CHARS,
    ID_MAX_CHARS,
    IDENTIFIER_PATTERN,
    KEY_PATTERN,
    REASON_MAX_CHARS,
    REASON_PATTERN,
)

# Ids travel in URLs: the core's rule (printable ASCII without "/", not "." or ".."), so every
# id the API accepts can be inspected, cancelled and deleted at its Location. Keys travel in
# headers too: the same without spaces.
Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=ID_MAX_CHARS, pattern=IDENTIFIER_PATTERN),
]
Key = Annotated[str, StringConstraints(min_length=1, max_length=ID_MAX_CHARS, pattern=KEY_PATTERN)]
AgentName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=AGENT_NAME_MAX_CHARS, pattern=IDENTIFIER_PATTERN),
]
# A stream position (``Last-Event-ID``, ``after_seq``): ASCII digits only, at most 18 of them
# (every seq fits in 64 bits; ``int()`` alone takes "²" and chokes on 5,000 digits).
SEQ_DIGITS = 18
EVENT_ID_PATTERN = rf"^[0-9]{{1,{SEQ_DIGITS}}}$"
WEBHOOK_TIMESTAMP_PATTERN = r"^[0-9]{1,12}$"  # Standard Webhooks: Unix seconds
Reason = Annotated[str, StringConstraints(max_length=REASON_MAX_CHARS, pattern=REASON_PATTERN)]
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _rfc3339_text(value: Any) -> Any:
    """Only date-time text: pydantic alone would read ``0`` or ``1700000000`` as Unix time."""
    if not isinstance(value, str) or not _RFC3339.fullmatch(value):
        raise ValueError("expected an RFC 3339 date-time with an offset, e.g. 2026-11-30T12:00:00Z")
    return value


Timestamp = Annotated[AwareDatetime, BeforeValidator(_rfc3339_text)]


_INTEGER = re.compile(rf"^-?[0-9]{{1,{SEQ_DIGITS}}}$")


def _integer_text(value: Any) -> Any:
    """Only ASCII digits (and a minus), at most 18: pydantic alone would take " 1", "+1" or
    "1_000", and Python's int() takes "²" and fails on thousands of digits."""
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        raise ValueError(f"expected a whole number of at most {SEQ_DIGITS} digits, e.g. 10")
    return value


QueryInt = Annotated[int, BeforeValidator(_integer_text)]
# A bounded query integer: the bounds go on the integer itself, so the document shows them as
# minimum/maximum (on the validator-wrapped type pydantic would leave a bare "ge").
SeqQuery = Annotated[int, Field(ge=-1, le=10**SEQ_DIGITS - 1), BeforeValidator(_integer_text)]


def _message_list(value: Any) -> list[Any]:
    """Only the list shape is checked here; the core validates each message and names the
    bad field (``messages[0].parts[1].text: Field required``)."""
    if not isinstance(value, list):
        raise ValueError("expected a list of messages")
    return value


# Documented as UIMessage[], validated by the core: its errors are the contract.
WireMessages = Annotated[
    list[Any], PlainValidator(_message_list, json_schema_input_type=list[UIMessage])
]


class ChatMessage(UIMessage):
    """A message of a chat request (documentation only): a ``UIMessage`` whose id follows the
    id rule, because the newest user message's id becomes its submission's id."""

    id: Identifier


ChatMessages = Annotated[
    list[Any], PlainValidator(_message_list, json_schema_input_type=list[ChatMessage])
]
ChatTrigger = Literal["submit-message", "regenerate-message"]


class StrictModel(BaseModel):
    """Unknown fields are errors; instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SubmitBody(StrictModel):
    """``POST .../submissions``. Messages are validated by the core (errors name the field)."""

    messages: WireMessages = Field(json_schema_extra={"minItems": 1})
    submission_id: Identifier | None = None
    idempotency_key: Key | None = Field(
        None, description="Also accepted as the Idempotency-Key header."
    )
    metadata: dict[str, Any] | None = None


class CancelBody(StrictModel):
    """Optional body of the cancel endpoints; ``reason`` becomes the submission's ``error``."""

    reason: Reason | None = None


class ListQuery(StrictModel):
    """Query of ``GET .../submissions``: ``status`` may repeat or be comma-separated."""

    status: list[SubmissionStatus] | None = None
    limit: QueryInt = Field(50, ge=1, le=100)
    before: Identifier | None = Field(
        None,
        description="List what is older than this submission (the previous page's next_before).",
    )


class DeleteManyQuery(StrictModel):
    """Query of ``DELETE .../submissions``; only terminal submissions are ever deleted."""

    status: list[SubmissionStatus] | None = None
    completed_before: Timestamp | None = None
    limit: QueryInt = Field(100, ge=1, le=500)


class StreamQuery(StrictModel):
    """Query of the SSE stream; the ``Last-Event-ID`` header wins when it is later."""

    after_seq: SeqQuery | None = None


class ChatBody(StrictModel):
    """``POST .../chat``: the body the AI SDK's ``DefaultChatTransport`` sends. The chat's
    ``id`` is the agent's name; of ``messages`` only the newest user message is admitted (the
    conversation lives on the server)."""

    id: AgentName = Field(description="The chat id: the agent's name.")
    messages: ChatMessages = Field(
        description="The client's copy of the chat; it must hold a user message.",
        json_schema_extra={
            "minItems": 1,
            "contains": {"type": "object", "properties": {"role": {"const": "user"}}},
        },
    )
    trigger: ChatTrigger
    message_id: Identifier | None = Field(
        None,
        alias="messageId",
        description="regenerate-message: the reply to replace (only the last one can be).",
    )


class AgentSummary(StrictModel):
    agent_type: str
    agent_name: str
    pending: int
    running: int


class AgentList(StrictModel):
    agent_types: list[str] = Field(description="Registered agent classes.")
    agents: list[AgentSummary] = Field(description="Agents that exist (were written to).")


class SubmissionList(StrictModel):
    submissions: list[SubmissionInspection]
    next_before: str | None = Field(
        None, description="Pass as ``before`` for the next (older) page; null on the last page."
    )


class MessageList(StrictModel):
    """The conversation in AI SDK wire form (``UIMessage`` JSON, camelCase keys)."""

    messages: WireMessages


class DeleteResult(StrictModel):
    deleted: int


class RequestCancelled(StrictModel):
    request_id: str


class HealthReport(StrictModel):
    status: Literal["ok", "unavailable"]
    database: Literal["ok", "unavailable"]
    redis: Literal["ok", "unavailable"]


class ErrorDetail(StrictModel):
    type: str
    message: str
    details: Any = None


class ApprovalQuery(StrictModel):
    """Query of ``GET .../approvals``: ``status`` may repeat or be comma-separated."""

    status: list[ApprovalStatus] | None = None


class ApprovalList(StrictModel):
    """The agent's tool approvals, oldest first."""

    approvals: list[Approval]


class ApprovalAnswer(StrictModel):
    """Body of ``POST .../approvals/{approval_id}``: the human's decision and why."""

    approved: StrictBool
    reason: Reason | None = None


class ErrorBody(StrictModel):
    error: ErrorDetail


SCHEMA_MODELS: tuple[type[BaseModel], ...] = (
    AgentList,
    Approval,
    ApprovalAnswer,
    ApprovalList,
    CancelBody,
    ChatBody,
    DeleteResult,
    ErrorBody,
    HealthReport,
    MessageList,
    RequestCancelled,
    SubmissionInspection,
    SubmissionList,
    SubmitBody,
    SubmitMessagesResult,
    UIMessage,
)
