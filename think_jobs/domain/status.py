"""Every status word of think-jobs, in one place.

``Status`` is a turn's stored status (``SubmissionStatus`` in the public API is this enum);
``FinalStatus`` the four a finished turn can have (the type of a blocking call's result);
``StopKind`` why a running attempt was told to stop; ``Kind`` what admitted a turn;
``ApprovalStatus`` where a tool call's approval stands.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"
    ABORTED = "aborted"
    SKIPPED = "skipped"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


ACTIVE: Final = frozenset({Status.PENDING, Status.RUNNING})
TERMINAL: Final = frozenset({Status.COMPLETED, Status.ERROR, Status.ABORTED, Status.SKIPPED})
FinalStatus = Literal["completed", "error", "skipped", "aborted"]


class Kind(StrEnum):
    """A durable submission (run by workers) or a blocking call (run by its caller)."""

    SUBMISSION = "submission"
    BLOCKING = "blocking"


class StopKind(StrEnum):
    """Why a running attempt was told to stop."""

    CANCELLED = "cancelled"  # cancel_submission / cancel_chat / a reset
    SIGNAL = "signal"  # the caller's in-process signal (or its callback raised)
    STALLED = "stalled"  # no chunk for stall_timeout_s: handed to recovery
    HANDED_OVER = "handed_over"  # its worker is stopping (worker_handover_s): handed to recovery
    LEASE_LOST = "lease_lost"  # another attempt owns the turn now
    # the stream shows more than the partial reply the attempt continued (it could not read
    # the stream when it started): handed to recovery, which continues from the stream
    STREAM_AHEAD = "stream_ahead"
    TIMED_OUT = "timed_out"  # the turn ran past turn_timeout_s: it ends in error

    @property
    def interrupts(self) -> bool:
        """The attempt stops but the turn is not over: another attempt continues it."""
        return self in (
            StopKind.STALLED,
            StopKind.HANDED_OVER,
            StopKind.LEASE_LOST,
            StopKind.STREAM_AHEAD,
        )

    @property
    def hands_to_recovery(self) -> bool:
        """The attempt stores its partial reply and puts the turn back for a continuation,
        waiting for a tool it is in (the continuation would run the tool again)."""
        return self in (StopKind.STALLED, StopKind.HANDED_OVER, StopKind.STREAM_AHEAD)


class ApprovalStatus(StrEnum):
    """A tool call's approval: open (``pending``), or closed with one of the other four."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"  # open past ``approval_timeout_s``: the call is denied
    CANCELLED = "cancelled"  # its submission was cancelled: the conversation moves on

    @property
    def approved(self) -> bool:
        return self is ApprovalStatus.APPROVED


INTERRUPTED: Final = "interrupted"  # an attempt's result when it was interrupted (not a status)
