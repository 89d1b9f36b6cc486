"""What hooks receive: the turn context handed to ``before_turn``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from think_jobs.messages import UIMessage


def utcnow() -> datetime:
    """The current time, aware UTC (every timestamp think-jobs stores is one)."""
    return datetime.now(UTC)


@dataclass
class TurnContext:
    """The turn about to run. ``before_turn`` may change ``stall_timeout_s`` and
    ``turn_timeout_s`` for this turn only.

    ``trigger`` is one of ``submission``, ``schedule``, ``save_messages``, ``chat``,
    ``continue_last_turn`` or ``recovery``.
    """

    request_id: str
    trigger: str
    continuation: bool
    body: dict[str, Any] | None
    messages: list[UIMessage]
    submission_id: str | None = None
    metadata: dict[str, Any] | None = None
    attempt: int = 1
    stall_timeout_s: float | None = None
    turn_timeout_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
