"""Checks at the edge: what ``submit_messages`` and friends accept, with errors that say what
to fix. Everything here runs before anything is stored.

Ids that name things in URLs (agent names, submission ids) follow one rule,
``IDENTIFIER_PATTERN``: printable ASCII without ``/`` (a space only inside), and not ``.`` or
``..``, so every such id round-trips through a URL path. Keys (idempotency keys, webhook
delivery ids) travel in headers: the same rule without spaces, ``KEY_PATTERN``.
Messages and JSON values are bounded by ``think_jobs.limits`` (depth, bytes, counts).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from think_jobs.errors import (
    ConfigurationError,
    EmptySubmissionError,
    InvalidInputError,
    MessageValidationError,
)
from think_jobs.limits import (
    ID_MAX_CHARS,
    IDENTIFIER_PATTERN,
    KEY_PATTERN,
    REASON_MAX_CHARS,
    REASON_PATTERN,
    Limits,
    has_control_characters,
    is_unicode,
    over_limit,
    value_problem,
)
from think_jobs.messages import UIMessage, coerce_messages
from think_jobs.settings import Settings

__all__ = [
    "AGENT_NAME_MAX_CHARS",
    "EMPTY_SUBMISSION",
    "IDENTIFIER_PATTERN",
    "ID_MAX_CHARS",
    "KEY_PATTERN",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "REASON_MAX_CHARS",
    "REASON_PATTERN",
    "agent_name",
    "clamp",
    "has_control_characters",
    "identifier",
    "json_object",
    "key",
    "optional_id",
    "optional_key",
    "reason",
    "seconds_or_none",
    "steps_or_none",
    "submission_messages",
]

EMPTY_SUBMISSION = "submit_messages requires at least one message"
AGENT_NAME_MAX_CHARS = 200
MAX_IDEMPOTENCY_KEY_LENGTH = 512
_RULES = {
    IDENTIFIER_PATTERN: "use printable ASCII without '/' (spaces only inside), not '.' or '..'",
    KEY_PATTERN: "use printable ASCII from ! to ~ (no spaces) without '/', not '.' or '..'",
}
_COMPILED = {pattern: re.compile(pattern) for pattern in _RULES}


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
    return [message.to_wire() for message in coerce_messages(items, limits=Limits.of(settings))]


def identifier(
    value: object, name: str, *, max_chars: int = ID_MAX_CHARS, pattern: str = IDENTIFIER_PATTERN
) -> str:
    """``value`` if it is an id that round-trips in a URL (``IDENTIFIER_PATTERN``, or
    ``KEY_PATTERN`` for keys) of at most ``max_chars`` characters; otherwise
    InvalidInputError naming the field, the rule and the value."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string")
    if len(value) > max_chars:
        raise InvalidInputError(f"{name}: {len(value)} characters; the limit is {max_chars}")
    if not _COMPILED[pattern].fullmatch(value):
        shown = json.dumps(value[:40] + ("..." if len(value) > 40 else ""))
        raise InvalidInputError(f"{name} {shown} cannot be used in a URL: {_RULES[pattern]}")
    return value


def key(value: object, name: str, *, max_chars: int = MAX_IDEMPOTENCY_KEY_LENGTH) -> str:
    """An idempotency key or delivery id: the id rule without spaces (``KEY_PATTERN``)."""
    return identifier(value, name, max_chars=max_chars, pattern=KEY_PATTERN)


def agent_name(value: object) -> str:
    """An agent name: the id rule, at most 200 characters (the column's width)."""
    return identifier(value, "agent name", max_chars=AGENT_NAME_MAX_CHARS)


def optional_id(value: str | None, name: str, *, max_length: int = ID_MAX_CHARS) -> str | None:
    """None, or ``identifier(value, name)``."""
    return None if value is None else identifier(value, name, max_chars=max_length)


def optional_key(value: str | None, name: str) -> str | None:
    """None, or ``key(value, name)``."""
    return None if value is None else key(value, name)


def json_object(
    value: Mapping[str, Any] | None, name: str, *, limits: Limits
) -> dict[str, Any] | None:
    """A JSON object within ``limits`` (depth, ``metadata_bytes``) as a plain dict, or None.

    Raises MessageValidationError (an InvalidInputError) naming the field, limit and value.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{name} must be a JSON object (dict), got {type(value).__name__}")
    problem = value_problem(value, name, depth_limit=limits.json_depth)
    if problem is not None:
        raise MessageValidationError(problem)
    encoded = json.dumps(dict(value), ensure_ascii=False, separators=(",", ":")).encode()
    if len(encoded) > limits.metadata_bytes:
        raise MessageValidationError(
            f"{name} is {len(encoded)} bytes as JSON; the limit is {limits.metadata_bytes} "
            "(THINK_JOBS_MAX_METADATA_BYTES)"
        )
    result: dict[str, Any] = json.loads(encoded)
    return result


def body_object(value: Mapping[str, Any] | None, *, limits: Limits) -> dict[str, Any] | None:
    """A blocking call's ``body``: a JSON object within the depth limit and the size of one
    message (``max_message_bytes``), as a plain dict, or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"body must be a JSON object (dict), got {type(value).__name__}")
    problem = value_problem(value, "body", depth_limit=limits.json_depth)
    if problem is not None:
        raise MessageValidationError(problem)
    encoded = json.dumps(dict(value), ensure_ascii=False, separators=(",", ":")).encode()
    if len(encoded) > limits.message_bytes:
        raise MessageValidationError(
            over_limit(
                "body", f"{len(encoded)} bytes as JSON", limits.message_bytes, "max_message_bytes"
            )
        )
    result: dict[str, Any] = json.loads(encoded)
    return result


def reason(value: object, name: str = "reason") -> str | None:
    """A cancel's or an approval answer's reason: text of at most ``REASON_MAX_CHARS`` that
    the database can store (no NUL, no lone surrogate), or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{name}: expected a string, got {type(value).__name__}")
    if len(value) > REASON_MAX_CHARS:
        raise InvalidInputError(
            f"{name}: {len(value)} characters; at most {REASON_MAX_CHARS} are kept, shorten it"
        )
    if "\x00" in value or not is_unicode(value):
        raise InvalidInputError(f"{name}: contains NUL or a lone surrogate, which cannot be stored")
    return value


def clamp(value: int, low: int, high: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer")
    return max(low, min(high, value))


def seconds_or_none(value: object, name: str) -> float | None:
    """A time an agent class or its ``before_turn`` sets (``stall_timeout_s``,
    ``turn_timeout_s``): None (off) or a positive, finite number of seconds. Raises
    ``ConfigurationError`` naming ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{name} must be None (no limit) or a number of seconds, got {value!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ConfigurationError(
            f"{name} must be a positive, finite number of seconds, got {value!r}"
        )
    return float(value)


def steps_or_none(value: object, name: str) -> int | None:
    """An agent class's ``max_steps``: None (the setting's) or an integer of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{name} must be None (THINK_JOBS_MAX_STEPS) or an integer of at least 1, got {value!r}"
        )
    return value
