"""Checks at the edge: what ``submit_messages`` and friends accept, with errors that say what
to fix. Everything here runs before anything is stored."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from think_jobs.errors import EmptySubmissionError, InvalidInputError
from think_jobs.messages import UIMessage, coerce_messages
from think_jobs.settings import Settings

EMPTY_SUBMISSION = "submit_messages requires at least one message"
_MAX_ID_LENGTH = 255
MAX_IDEMPOTENCY_KEY_LENGTH = 512


def submission_messages(
    messages: Sequence[UIMessage | Mapping[str, Any]], settings: Settings
) -> list[dict[str, Any]]:
    """Validated messages in wire form; raises EmptySubmissionError / MessageValidationError."""
    if isinstance(messages, str | bytes | Mapping) or callable(messages):
        raise InvalidInputError(
            "submit_messages takes a list of messages (a function form is only for save_messages)"
        )
    items = list(messages)
    if not items:
        raise EmptySubmissionError(EMPTY_SUBMISSION)
    if len(items) > settings.max_messages_per_submission:
        raise InvalidInputError(
            f"submit_messages accepts at most {settings.max_messages_per_submission} messages "
            f"(got {len(items)}); raise THINK_JOBS_MAX_MESSAGES_PER_SUBMISSION to allow more"
        )
    return [message.to_wire() for message in coerce_messages(items)]


def optional_id(value: str | None, name: str, *, max_length: int = _MAX_ID_LENGTH) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{name} must be a non-empty string")
    if len(value) > max_length:
        raise InvalidInputError(f"{name} is longer than {max_length} characters")
    if has_control_characters(value):
        raise InvalidInputError(f"{name} must not contain control characters")
    return value


def has_control_characters(value: str) -> bool:
    """NUL and the other C0 controls are refused in ids and names (PostgreSQL rejects NUL)."""
    return any(ord(character) < 32 or ord(character) == 127 for character in value)


def json_object(
    value: Mapping[str, Any] | None, name: str, *, max_bytes: int
) -> dict[str, Any] | None:
    """A JSON-serialisable dict within ``max_bytes``, or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{name} must be a JSON object (dict), got {type(value).__name__}")
    try:
        encoded = json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidInputError(f"{name} must be JSON-serialisable: {error}") from error
    if len(encoded.encode()) > max_bytes:
        raise InvalidInputError(
            f"{name} is {len(encoded.encode())} bytes as JSON; the limit is {max_bytes} "
            f"(THINK_JOBS_MAX_METADATA_BYTES)"
        )
    result: dict[str, Any] = json.loads(encoded)
    return result


def clamp(value: int, low: int, high: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer")
    return max(low, min(high, value))
