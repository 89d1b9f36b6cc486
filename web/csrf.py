"""CSRF tokens for everything a browser session can change.

A random value lives in the (signed) session; forms carry it signed again with the app's secret
key (the host's, when embedded). A request is accepted when the two match in constant time.
Tokens are per session, not per form, so several open tabs keep working.
"""

from __future__ import annotations

import hmac
import secrets

from flask import current_app, request, session
from itsdangerous import BadSignature, URLSafeSerializer

from think_jobs.errors import ConfigurationError
from web.errors import ApiError

SESSION_KEY = "think_jobs_csrf"
FORM_FIELD = "csrf_token"
HEADER = "X-CSRF-Token"


def _serializer() -> URLSafeSerializer:
    if not current_app.secret_key:
        raise ConfigurationError(
            "think-jobs admin forms need the app's SECRET_KEY (THINK_JOBS_SECRET_KEY standalone)"
        )
    return URLSafeSerializer(current_app.secret_key, salt="think-jobs-csrf")


def _session_value() -> str:
    value = session.get(SESSION_KEY)
    if not isinstance(value, str):
        value = rotate()
    return value


def rotate() -> str:
    """A fresh session value (on login), so a token seen before logging in is worthless."""
    value = secrets.token_urlsafe(32)
    session[SESSION_KEY] = value
    return value


def generate() -> str:
    """The token to put in a form (``{{ csrf_token() }}``) or the X-CSRF-Token header."""
    return _serializer().dumps(_session_value())


def require_valid() -> None:
    """Raise 403 (type ``csrf_failed``) unless the request carries this session's token."""
    presented = request.form.get(FORM_FIELD) or request.headers.get(HEADER) or ""
    expected = session.get(SESSION_KEY)
    try:
        value = _serializer().loads(presented) if presented else None
    except BadSignature:
        value = None
    if not (
        isinstance(value, str)
        and isinstance(expected, str)
        and hmac.compare_digest(value.encode(), expected.encode())
    ):
        raise ApiError(403, "CSRF token missing or invalid; reload the page", type="csrf_failed")
