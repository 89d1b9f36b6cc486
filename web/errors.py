"""Every failure of the JSON endpoints becomes ``{"error": {"type", "message", "details"}}``.

Core errors map to status codes here, at the boundary, and nowhere else:

==============================  ====  ========================
UnknownCursorError              404   unknown_cursor
UnknownApprovalError            404   unknown_approval
StoredMessageError              409   unreadable_message (details: message_id, position)
InvalidInputError (and kids)    400   invalid_input, ...
AgentNotRegisteredError         404   agent_not_registered
SubmissionConflictError         409   submission_conflict
StreamResetError                409   stream_reset (resumed past the stream's end)
StorageUnavailableError         503   storage_unavailable
BrokerUnavailableError          503   broker_unavailable
NotImplementedError             501   not_implemented
anything else                   500   internal_error (logged, never echoed)
==============================  ====  ========================
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response, jsonify
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from think_jobs.errors import (
    AgentNotRegisteredError,
    BrokerUnavailableError,
    EmptySubmissionError,
    InvalidInputError,
    MessageValidationError,
    StorageUnavailableError,
    StoredMessageError,
    StreamResetError,
    SubmissionConflictError,
    ThinkJobsError,
    UnknownApprovalError,
    UnknownCursorError,
)

log = logging.getLogger(__name__)

HTTP_TYPES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    501: "not_implemented",
    503: "unavailable",
}
_CORE: tuple[tuple[type[Exception], int, str], ...] = (
    (AgentNotRegisteredError, 404, "agent_not_registered"),
    (UnknownCursorError, 404, "unknown_cursor"),
    (UnknownApprovalError, 404, "unknown_approval"),
    (EmptySubmissionError, 400, "empty_submission"),
    (MessageValidationError, 400, "message_validation"),
    (InvalidInputError, 400, "invalid_input"),
    (SubmissionConflictError, 409, "submission_conflict"),
    (StreamResetError, 409, "stream_reset"),
    (StorageUnavailableError, 503, "storage_unavailable"),
    (BrokerUnavailableError, 503, "broker_unavailable"),
)


class ApiError(Exception):
    """An error a view raises on purpose; rendered as JSON (or an HTML page by the admin)."""

    def __init__(
        self, status: int, message: str, *, type: str | None = None, details: Any = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type or HTTP_TYPES.get(status, "error")
        self.message = message
        self.details = details
        self.headers: dict[str, str] = {}


def from_validation(error: ValidationError, *, where: str = "body") -> ApiError:
    """A pydantic error as a 400 whose details list every bad field."""
    details = [
        {"loc": ".".join(str(part) for part in (where, *item["loc"])), "message": item["msg"]}
        for item in error.errors(include_url=False, include_input=False)
    ]
    summary = "; ".join(f"{item['loc']}: {item['message']}" for item in details)
    return ApiError(400, summary, type="validation_error", details=details)


def from_exception(error: Exception) -> ApiError:
    """The ApiError an exception stands for (unexpected ones are logged here)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, HTTPException):
        code = error.code or 500
        found = ApiError(code, error.description or error.name, type=HTTP_TYPES.get(code))
        found.headers = {k: v for k, v in error.get_headers() if k.lower() == "allow"}
        return found
    if isinstance(error, StoredMessageError):
        return unreadable_message(error)
    for kind, status, name in _CORE:
        if isinstance(error, kind):
            return ApiError(status, str(error), type=name)
    if isinstance(error, NotImplementedError):
        return ApiError(501, str(error) or "not implemented")
    if isinstance(error, ThinkJobsError):
        log.error("think-jobs error in a web request: %s", error, exc_info=error)
    else:
        log.error("unexpected error in a web request", exc_info=error)
    return ApiError(500, "internal server error", type="internal_error")


def unreadable_message(
    error: StoredMessageError, agent_type: str = "TYPE", agent_name: str = "NAME"
) -> ApiError:
    """A stored message that does not read back: the operator's to fix, not the client's, and
    not a crash either, so 409 with the message id and the repair command."""
    details = {"message_id": error.message_id, "position": error.position, "reason": error.reason}
    message = error.describe(agent_type, agent_name)
    return ApiError(409, message, type="unreadable_message", details=details)


def error_response(error: ApiError) -> Response:
    body = {"error": {"type": error.type, "message": error.message, "details": error.details}}
    response = jsonify(body)
    response.status_code = error.status
    response.headers.update(error.headers)
    return response


def handle_as_json(error: Exception) -> Response:
    return error_response(from_exception(error))


def register_json_errors(blueprint: Blueprint) -> None:
    """JSON errors for every failure raised inside ``blueprint``'s views and hooks."""
    blueprint.register_error_handler(Exception, handle_as_json)
