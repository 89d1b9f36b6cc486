"""Every exception think-jobs raises on purpose.

::

    ThinkJobsError
    ├── ConfigurationError          settings or registration that cannot work
    │   └── AgentNotRegisteredError   an agent type that was never ``jobs.register``-ed
    ├── InvalidInputError           (also ValueError) input that was refused; nothing was stored
    │   ├── EmptySubmissionError      ``submit_messages`` got no message
    │   ├── MessageValidationError    a message, part or chunk that is not AI SDK shaped
    │   └── ScheduleError             a schedule phrase, zone or task definition that is wrong
    ├── UnknownRequestError         (also LookupError) a request id that names no turn of the agent
    ├── StreamResetError            a stream resumed after a seq its (rebuilt) stream never reached
    ├── SubmissionConflictError     submission id and idempotency key name different submissions
    ├── StoredMessageError          a stored message no longer reads back (repair or remove it)
    ├── NestedTurnError             (also RuntimeError) a blocking turn asked for from inside a turn
    ├── StorageUnavailableError     the database could not be reached; the operation did not happen
    ├── BrokerUnavailableError      Redis / the Celery broker could not be reached
    └── TurnFailedError             a workflow step's turn ended error, aborted or skipped

Third-party failures (SQLAlchemy, redis-py, kombu) are mapped at the boundary with
``raise ... from exc`` so the cause stays attached.
"""

from __future__ import annotations


class ThinkJobsError(Exception):
    """Base class of every error think-jobs raises on purpose."""


class ConfigurationError(ThinkJobsError):
    """Settings, registration or wiring that cannot work as given."""


class AgentNotRegisteredError(ConfigurationError, LookupError):
    """An agent type name that no ``jobs.register`` call introduced."""


class InvalidInputError(ThinkJobsError, ValueError):
    """Input refused at the edge; nothing was stored."""


class EmptySubmissionError(InvalidInputError):
    """``submit_messages`` was given no message."""


class MessageValidationError(InvalidInputError):
    """A message, part or chunk does not have the AI SDK shape; the text names the bad field."""


class ScheduleError(InvalidInputError):
    """A schedule phrase, timezone or scheduled-task definition that cannot be used."""


class UnknownCursorError(InvalidInputError, LookupError):
    """A ``before=`` cursor that names no submission of the agent (HTTP 404 in the web app)."""


class UnknownRequestError(ThinkJobsError, LookupError):
    """A request id that names no turn of the agent (``agent.stream``; HTTP 404)."""


class StreamResetError(ThinkJobsError):
    """A stream's numbering does not hold the reader's position. Resumed after a seq past
    its end: the stream ended (``done``) at a lower seq (``ended_at``), so the position is
    from another numbering (the buffer was lost and rebuilt from the stored reply, numbered
    again from 0) or bogus. Or, while it was read (``ended_at`` None), the buffer was lost
    and written again from seq 0 (by a recovered attempt, or from the database). Read the
    stream from its start (``after_seq=None``) or the reply from ``get_messages()``; HTTP 409
    ``stream_reset``.

    ``args`` are ``(request_id, after_seq, ended_at)`` so the error survives pickling.
    """

    def __init__(self, request_id: str, after_seq: int, ended_at: int | None) -> None:
        super().__init__(request_id, after_seq, ended_at)
        self.request_id = request_id
        self.after_seq = after_seq
        self.ended_at = ended_at

    def __str__(self) -> str:
        what = (
            f"was numbered again from seq 0 while it was read (after seq {self.after_seq}): "
            "its buffer was lost and written again"
            if self.ended_at is None
            else f"was resumed after seq {self.after_seq}, but it ended at seq {self.ended_at}: "
            "the position is from an older numbering of the stream (its buffer was lost and "
            "rebuilt from the stored reply) or bogus"
        )
        return (
            f"stream of request {self.request_id!r} {what}; read the stream again from its "
            "start (after_seq=None, no Last-Event-ID) or the reply from get_messages()"
        )


class UnknownApprovalError(ThinkJobsError, LookupError):
    """No approval of this agent has that id (``respond_to_approval``; HTTP 404)."""


class SubmissionConflictError(ThinkJobsError):
    """``submission_id`` and ``idempotency_key`` refer to different submissions."""


class StoredMessageError(ThinkJobsError):
    """A message of a stored conversation can no longer be read (a row written by an older
    version, a manual edit). The agent is not bricked: ``think-jobs messages remove|repair``
    (``think_jobs.engine.repair``) removes the message or drops its unreadable parts.

    ``message_id`` is the id the row carries (None if even that cannot be read), ``reason``
    what failed, ``position`` the message's index in the conversation. ``args`` are
    ``(message_id, reason, position)`` so the error survives pickling and Celery's JSON.
    """

    def __init__(self, message_id: str | None, reason: str, position: int | None = None) -> None:
        super().__init__(message_id, reason, position)
        self.message_id = message_id
        self.reason = reason
        self.position = position

    def __str__(self) -> str:
        return self.describe()

    def describe(self, agent_type: str = "TYPE", agent_name: str = "NAME") -> str:
        """The message, with the repair command spelled out for this agent."""
        where = "" if self.position is None else f" (position {self.position} of the conversation)"
        command = f"think-jobs messages remove|repair {agent_type} {agent_name}"
        return (
            f"stored message {self.message_id!r}{where} cannot be read: {self.reason}; "
            f"remove or repair it ({command} {self.message_id or 'ID'})"
        )


class NestedTurnError(ThinkJobsError, RuntimeError):
    """A blocking turn (save_messages, chat, continue_last_turn) requested inside its turn."""


class StorageUnavailableError(ThinkJobsError):
    """The database could not be reached; the operation was not carried out."""


class BrokerUnavailableError(ThinkJobsError):
    """Redis or the Celery broker could not be reached."""


class TurnFailedError(ThinkJobsError):
    """A workflow step's turn ended ``error``, ``aborted`` or ``skipped`` (or its submission
    was deleted while the step waited); the step fails with it.

    ``args`` are ``(message, submission_id, status)`` so the error keeps its fields through
    Celery's JSON result backend (``AsyncResult.get()`` raises it again in the caller).
    """

    def __init__(
        self, message: str, submission_id: str | None = None, status: str | None = None
    ) -> None:
        super().__init__(message, submission_id, status)
        self.submission_id = submission_id
        self.status = status

    def __str__(self) -> str:
        return str(self.args[0])


__all__ = [
    "AgentNotRegisteredError",
    "BrokerUnavailableError",
    "ConfigurationError",
    "EmptySubmissionError",
    "InvalidInputError",
    "MessageValidationError",
    "NestedTurnError",
    "ScheduleError",
    "StorageUnavailableError",
    "StoredMessageError",
    "StreamResetError",
    "SubmissionConflictError",
    "ThinkJobsError",
    "TurnFailedError",
    "UnknownApprovalError",
]
