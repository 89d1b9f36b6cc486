"""Every exception think-jobs raises on purpose.

::

    ThinkJobsError
    ├── ConfigurationError          settings or registration that cannot work
    │   └── AgentNotRegisteredError   an agent type that was never ``jobs.register``-ed
    ├── InvalidInputError           (also ValueError) input that was refused; nothing was stored
    │   ├── EmptySubmissionError      ``submit_messages`` got no message
    │   ├── MessageValidationError    a message, part or chunk that is not AI SDK shaped
    │   └── ScheduleError             a schedule phrase, zone or task definition that is wrong
    ├── SubmissionConflictError     submission id and idempotency key name different submissions
    ├── NestedTurnError             (also RuntimeError) a blocking turn asked for from inside a turn
    ├── StorageUnavailableError     the database could not be reached; the operation did not happen
    └── BrokerUnavailableError      Redis / the Celery broker could not be reached

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


class SubmissionConflictError(ThinkJobsError):
    """``submission_id`` and ``idempotency_key`` refer to different submissions."""


class NestedTurnError(ThinkJobsError, RuntimeError):
    """A blocking turn (save_messages, chat, continue_last_turn) requested inside its turn."""


class StorageUnavailableError(ThinkJobsError):
    """The database could not be reached; the operation was not carried out."""


class BrokerUnavailableError(ThinkJobsError):
    """Redis or the Celery broker could not be reached."""


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
    "SubmissionConflictError",
    "ThinkJobsError",
]
