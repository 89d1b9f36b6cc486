"""Request limits and response headers for think-jobs' blueprints (never the host's routes).

Bodies larger than ``max_request_bytes`` (default 1 MiB) are refused with 413, whatever the
transfer encoding: a ``Content-Length`` over the limit before anything is read; a chunked
body (no length) is read here, before the view, up to one byte past the limit, and refused
as soon as it passes it. Werkzeug's own limit would silently stop reading at the limit and
hand on a truncated body (which then parses, or passes a signature made over its first
megabyte); one byte more tells a body over the limit from one that just fits. Views read
the verified bytes from the request's cache.

Responses get ``X-Content-Type-Options``, ``X-Frame-Options: DENY``, a strict
``Referrer-Policy``, a Content-Security-Policy (``THINK_JOBS_CONTENT_SECURITY_POLICY``; set
it to ``None`` when a host's base template needs more), ``Cache-Control: no-store`` and HSTS on
HTTPS.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request

from web.current import current_extension
from web.errors import ApiError
from web.proxies import prefix_problem

_FIXED_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def limit_body() -> None:
    """413 for a body over the limit, by its length or, chunked, while it is read."""
    limit = current_extension().jobs.settings.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    request.max_content_length = limit + 1
    chunked = request.content_length is None and _chunked()
    if chunked and len(request.get_data(cache=True)) > limit:
        raise too_large(limit)


def _chunked() -> bool:
    return "chunked" in request.headers.get("Transfer-Encoding", "").lower()


def too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"request body is larger than {limit} bytes (THINK_JOBS_MAX_REQUEST_BYTES)"
    )


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


def check_prefix() -> None:
    """Our pages never redirect to another site: the mount prefix must be a path (it comes
    from ``X-Forwarded-Prefix`` behind a proxy; a host app may trust that header itself)."""
    problem = prefix_problem(request.script_root)
    if problem is not None:
        raise ApiError(400, problem, type="invalid_forwarded_prefix")


def protect(blueprint: Blueprint) -> None:
    """Prefix check and body limit before, secure headers after, every request of
    ``blueprint``."""
    blueprint.before_request(check_prefix)
    blueprint.before_request(limit_body)
    blueprint.after_request(add_headers)
