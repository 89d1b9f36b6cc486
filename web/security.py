"""Request limits and response headers for think-jobs' blueprints (never the host's routes).

Bodies larger than ``max_request_bytes`` (default 1 MiB) are refused with 413 before they are
read. Responses get ``X-Content-Type-Options``, ``X-Frame-Options: DENY``, a strict
``Referrer-Policy``, a Content-Security-Policy (``THINK_JOBS_CONTENT_SECURITY_POLICY``; set
it to ``None`` when a host's base template needs more), ``Cache-Control: no-store`` and HSTS on
HTTPS.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request

from web.errors import ApiError
from web.extension import current_extension

_FIXED_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def limit_body() -> None:
    limit = current_extension().jobs.settings.max_request_bytes
    request.max_content_length = limit
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body is larger than {limit} bytes")


def add_headers(response: Response) -> Response:
    for name, value in _FIXED_HEADERS.items():
        response.headers.setdefault(name, value)
    policy = current_app.config.get("THINK_JOBS_CONTENT_SECURITY_POLICY")
    if policy:
        response.headers.setdefault("Content-Security-Policy", policy)
    response.headers.setdefault("Cache-Control", "no-store")
    if request.is_secure:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    return response


def protect(blueprint: Blueprint) -> None:
    """Body limit before, secure headers after, every request of ``blueprint``."""
    blueprint.before_request(limit_body)
    blueprint.after_request(add_headers)
