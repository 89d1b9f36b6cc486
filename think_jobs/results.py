"""What the public methods return: statuses, inspections, results and stream events."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from think_jobs.domain.status import TERMINAL, FinalStatus, Status
from think_jobs.domain.status import ApprovalStatus as ApprovalStatus
from think_jobs.messages import UIMessage

SubmissionStatus = Status  # the public name of the one status enum (think_jobs.domain.status)
TERMINAL_STATUSES = TERMINAL
TurnStatus = FinalStatus


class SubmissionInspection(BaseModel):
    """One durable submission as stored. Datetimes are aware UTC."""

    model_config = ConfigDict(frozen=True)

    submission_id: str
    idempotency_key: str | None
    request_id: str
    status: SubmissionStatus
    error: str | None
    metadata: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    attempt: int = 0
    waiting_reason: str | None = None  # why a pending turn is not running (SPEC §12)


class Approval(BaseModel):
    """A tool call waiting for (or answered by) a human. ``request_id`` is the turn whose
    model made the call; ``continuation_id`` the submission that runs the tool (approved) or
    tells the model it was denied, once every approval of that turn is answered."""

    model_config = ConfigDict(frozen=True)

    approval_id: str
    request_id: str
    continuation_id: str
    tool_name: str
    tool_call_id: str
    input: Any
    status: ApprovalStatus
    created_at: datetime
    decided_at: datetime | None
    reason: str | None


class SubmitMessagesResult(SubmissionInspection):
    """``submit_messages``'s answer: the stored submission plus whether this call created it."""

    accepted: bool


class SaveMessagesResult(BaseModel):
    """Outcome of a blocking turn (``save_messages``, ``continue_last_turn``)."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    status: TurnStatus
    error: str | None = None


class ChatResponseResult(BaseModel):
    """Handed to ``on_chat_response`` once per turn, on every path."""

    model_config = ConfigDict(frozen=True)

    message: UIMessage | None
    request_id: str
    continuation: bool
    status: TurnStatus
    error: str | None = None


class StreamEvent(BaseModel):
    """One event of a request's stream: a chunk (AI SDK keys) or the final ``done``."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    seq: int
    chunk: dict[str, Any] | None = None
    done: bool = False
    status: str | None = None
    error: str | None = None
    attempt: int | None = None  # the attempt that wrote it (the database's own: 2**31)


class RunningTask(BaseModel):
    """One task a worker is executing: its Celery name, the agent it is for, since when."""

    model_config = ConfigDict(frozen=True)

    task: str
    agent: str | None
    since: datetime

    def describe(self, now: datetime) -> str:
        """``drain Lead:weekly (3 s)``."""
        seconds = max(0.0, (now - self.since).total_seconds())
        target = f" {self.agent}" if self.agent else ""
        return f"{self.task.removeprefix('think_jobs.')}{target} ({seconds:.0f} s)"


class WorkerRecord(BaseModel):
    """A live worker (or beat) as its last heartbeat described it. Datetimes are aware UTC."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: Literal["worker", "beat"]
    hostname: str
    pid: int
    queues: list[str]
    agent_types: list[str]
    concurrency: int | None
    running: list[RunningTask]
    started_at: datetime
    seen_at: datetime

    def running_described(self) -> list[str]:
        """``drain Lead:weekly (3 s)`` for each task it runs, timed as of its last heartbeat:
        both times are the worker's own, so a reader whose clock differs reads no skew (only
        up to one heartbeat interval of staleness)."""
        return [task.describe(self.seen_at) for task in self.running]
