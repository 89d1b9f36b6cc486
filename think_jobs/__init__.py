"""think-jobs: durable LLM agent turns on Celery workers.

Submissions are accepted durably and run later, one turn at a time per agent in FIFO order,
across every worker; chunks stream over Redis. See README.md and SPEC.md.
"""

from __future__ import annotations

from think_jobs.agent import Think
from think_jobs.callbacks import ChatStartEvent, StreamCallback
from think_jobs.context import TurnContext
from think_jobs.errors import (
    AgentNotRegisteredError,
    BrokerUnavailableError,
    ConfigurationError,
    EmptySubmissionError,
    InvalidInputError,
    MessageValidationError,
    NestedTurnError,
    ScheduleError,
    StorageUnavailableError,
    StreamResetError,
    SubmissionConflictError,
    ThinkJobsError,
    TurnFailedError,
    UnknownApprovalError,
    UnknownCursorError,
    UnknownRequestError,
)
from think_jobs.messages import UIMessage
from think_jobs.models.base import Model, ModelRequest
from think_jobs.results import (
    Approval,
    ChatResponseResult,
    SaveMessagesResult,
    StreamEvent,
    SubmissionInspection,
    SubmissionStatus,
    SubmitMessagesResult,
)
from think_jobs.runtime import ThinkJobs
from think_jobs.scheduled_task import ScheduleContext, ScheduledTask
from think_jobs.settings import Settings
from think_jobs.signals import AbortController, AbortSignal
from think_jobs.tools import Tool, tool

__all__ = [
    "AbortController",
    "AbortSignal",
    "AgentNotRegisteredError",
    "Approval",
    "BrokerUnavailableError",
    "ChatResponseResult",
    "ChatStartEvent",
    "ConfigurationError",
    "EmptySubmissionError",
    "InvalidInputError",
    "MessageValidationError",
    "Model",
    "ModelRequest",
    "NestedTurnError",
    "SaveMessagesResult",
    "ScheduleContext",
    "ScheduleError",
    "ScheduledTask",
    "Settings",
    "StorageUnavailableError",
    "StreamCallback",
    "StreamEvent",
    "StreamResetError",
    "SubmissionConflictError",
    "SubmissionInspection",
    "SubmissionStatus",
    "SubmitMessagesResult",
    "Think",
    "ThinkJobs",
    "ThinkJobsError",
    "Tool",
    "TurnContext",
    "TurnFailedError",
    "UIMessage",
    "UnknownApprovalError",
    "UnknownCursorError",
    "UnknownRequestError",
    "tool",
]
