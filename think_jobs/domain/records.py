"""The records the layers pass around: a turn as stored, a turn to store, a claim on an agent.

Frozen dataclasses with no behaviour beyond derived properties; storage fills them, the
engine decides with them (``think_jobs.domain.policy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from think_jobs.domain.status import Kind, Status


@dataclass(frozen=True)
class AgentRef:
    """An agent row: its id and identity."""

    id: int
    agent_type: str
    agent_name: str


@dataclass(frozen=True)
class TurnRecord:
    """A snapshot of one stored turn (a row of ``think_turns``)."""

    id: int
    agent_id: int
    seq: int
    request_id: str
    kind: Kind
    trigger: str
    status: Status
    idempotency_key: str | None
    messages: list[Any] | None
    metadata: dict[str, Any] | None
    body: dict[str, Any] | None
    continuation: bool
    error: str | None
    attempt: int
    recoveries: int
    recovered_at_seq: int | None
    assistant_message_id: str | None
    messages_applied: bool
    caller_expires_at: datetime | None
    trace_context: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    followup: dict[str, Any] | None = None
    followup_due_at: datetime | None = None
    awaiting_approval: bool = False  # a continuation holding its place until approvals close
    extends: dict[str, Any] | None = None  # the reply an approval continuation extends

    @property
    def is_submission(self) -> bool:
        return self.kind is Kind.SUBMISSION

    @property
    def active(self) -> bool:
        return not self.status.terminal


@dataclass(frozen=True)
class NewTurn:
    """A turn to admit: everything its row gets from the caller (the rest is defaults, the
    admission number and the database's clock)."""

    request_id: str
    kind: Kind
    trigger: str
    messages: list[dict[str, Any]] | None = None
    idempotency_key: str | None = None
    metadata: dict[str, Any] | None = None
    body: dict[str, Any] | None = None
    continuation: bool = False
    caller_ttl_s: float | None = None  # blocking turns: how long the caller counts as alive
    trace_context: dict[str, Any] | None = None
    assistant_message_id: str | None = None  # a continuation extends this reply
    awaiting_approval: bool = False
    extends: dict[str, Any] | None = None  # that reply as the turn that asked stored it


@dataclass(frozen=True)
class ApprovalAsked:
    """A tool call an attempt stopped at, to wait for a human's approval."""

    approval_id: str
    tool_name: str
    tool_call_id: str
    input: Any


@dataclass(frozen=True)
class ApprovalAnswer:
    """What a continuation applies to a tool call that waited: run it, or tell the model no."""

    approval_id: str
    tool_call_id: str
    approved: bool
    reason: str | None


@dataclass(frozen=True)
class HeadBrief:
    """Just enough of an agent's next turn to decide who should run it."""

    seq: int
    kind: Kind
    status: Status
    messages_applied: bool
    awaiting_approval: bool = False


@dataclass(frozen=True)
class Admission:
    """A turn admitted (``accepted``), or the submission the given ids already named; and
    whether someone must be nudged to run it (``is_head``)."""

    turn: TurnRecord
    accepted: bool
    is_head: bool


@dataclass(frozen=True)
class Claim:
    """The lease of one agent, held for one attempt of ``turn`` (now running).

    ``history`` is the conversation (a JSON array) read in the claiming transaction, when it
    was read there. ``admitted`` is the agent's admission count as the lease was taken: when it
    is the turn's own seq, nothing was queued behind the turn then. ``now`` is the database
    server's time as the lease was taken (the turn's ``started_at`` is on the same clock).
    """

    agent_id: int
    agent_type: str
    agent_name: str
    token: str
    turn: TurnRecord
    recovering: bool
    admitted: int
    now: datetime
    history: str | None = None

    @property
    def agent(self) -> AgentRef:
        return AgentRef(self.agent_id, self.agent_type, self.agent_name)

    @property
    def queued_behind(self) -> bool:
        """Turns were waiting behind this one when it was claimed."""
        return self.admitted > self.turn.seq


class Idle(StrEnum):
    """Why a claim (or a drain) ran nothing."""

    BUSY = "busy"  # another holder has the agent's lease
    IDLE = "idle"  # no turn waits
    CALLER = "caller"  # the head is a blocking turn only its own caller can run
    APPROVAL = "approval"  # the head waits for a human to answer a tool call's approval
    UNKNOWN_AGENT = "unknown-agent"  # no agent row has this id (deleted)
    UNREGISTERED = "unregistered"  # this process does not serve the agent's type
    STOPPING = "stopping"  # this worker hands its turns over (worker_handover_s): passed on


@dataclass(frozen=True)
class NotClaimed:
    """Why nothing was claimed (``busy``, ``idle`` or ``caller``) and the head it saw."""

    reason: Idle
    head: TurnRecord | None = None


@dataclass(frozen=True)
class Drained:
    """What one drain did: how many turns it ran, or (none) why it ran nothing."""

    ran: int
    idle: Idle | None = None

    def __str__(self) -> str:
        return f"ran {self.ran}" if self.ran else str(self.idle)


@dataclass(frozen=True)
class Released:
    """What the agent's queue looked like as a lease was given back. ``head_unread``: the
    lease was given back but the head could not be read after it (the database went away
    between the two statements), so whether a turn waits is not known."""

    next_turn: HeadBrief | None
    head_unread: bool = False


@dataclass(frozen=True)
class Ended:
    """A turn moved to a terminal status: when (the database's clock), and the follow-up
    task message to send now that it ended, if one was registered."""

    completed_at: datetime
    followup: dict[str, Any] | None
