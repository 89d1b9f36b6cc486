"""Who may read and who may change: bearer tokens, the admin session, or the host's ``authorize``.

Two scopes: ``read`` (look) and ``write`` (submit, cancel, delete). Full tokens
(``THINK_JOBS_API_TOKENS``) grant both, read tokens (``THINK_JOBS_READ_TOKENS``) only ``read``.
Tokens are compared in constant time against every configured token, never logged, and never
stored: the admin session keeps an HMAC fingerprint, so removing a token ends its sessions,
and a session id that must be live on the server (``web.sessions``), so logging out ends it
for every copy of the cookie.
Missing or wrong credentials give 401; a valid credential without the scope gives 403.
Anything a browser session (cookie) changes must also carry a CSRF token.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

from flask import current_app, g, request, session
from pydantic import SecretStr

from think_jobs.settings import Settings
from web import csrf, sessions
from web.current import Scope, current_extension
from web.errors import ApiError

READ: Scope = "read"
WRITE: Scope = "write"
PUBLIC: Scope = "public"
SIGNED: Scope = "signature"  # webhooks: the HMAC signature is the credential
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SESSION_KEY = "think_jobs_auth"
SCOPE_ATTRIBUTE = "think_jobs_scope"
MAX_TOKEN_LENGTH = 4096
Source = Literal["token", "session", "host", "disabled"]

View = TypeVar("View", bound=Callable[..., Any])


def requires(scope: Scope) -> Callable[[View], View]:
    """Decorate a view: check ``scope`` first (and CSRF for cookie-authenticated changes)."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def checked(*args: Any, **kwargs: Any) -> Any:
            check(scope)
            return view(*args, **kwargs)

        setattr(checked, SCOPE_ATTRIBUTE, scope)
        return checked  # type: ignore[return-value]

    return decorate


def marked(scope: Scope) -> Callable[[View], View]:
    """Record the scope of a view that checks its own credentials (public, signed)."""

    def decorate(view: View) -> View:
        setattr(view, SCOPE_ATTRIBUTE, scope)
        return view

    return decorate


def check(scope: Scope) -> None:
    """Raise unless the request holds ``scope``; a write whose credentials a browser sends by
    itself needs the CSRF token too. Only a bearer token is not such a credential: a host's
    ``authorize=`` that accepts HTTP Basic (an ops page behind a proxy's Basic auth), Digest
    or Negotiate is answered by the browser on a cross-site form post as a cookie is."""
    source = authenticate(scope)
    credentials = request.authorization
    bearer = credentials is not None and credentials.type == "bearer"
    cookie_based = source == "session" or (source == "host" and not bearer)
    if request.method not in SAFE_METHODS and cookie_based:
        csrf.require_valid()


def allowed(scope: Scope) -> bool:
    """Whether the current request has ``scope`` (for showing or hiding buttons)."""
    try:
        authenticate(scope)
    except ApiError:
        return False
    return True


def authenticate(scope: Scope) -> Source:
    """Raise 401/403 unless the request holds ``scope``; return where the grant came from."""
    extension = current_extension()
    settings = extension.jobs.settings
    if settings.auth_disabled:
        return "disabled"
    if extension.authorize is not None:
        if not extension.authorize(request, scope):
            if scope == WRITE and extension.authorize(request, READ):
                raise forbidden(scope)
            raise unauthenticated(token_presented=False)
        return "host"
    source, scopes = _builtin_scopes(settings)
    if not scopes:
        raise unauthenticated(token_presented=source == "token")
    if scope not in scopes:
        raise forbidden(scope)
    return source


def _builtin_scopes(settings: Settings) -> tuple[Source, frozenset[Scope]]:
    header = request.headers.get("Authorization")
    if header is None:
        return "session", _session_scopes(settings)
    kind, _, token = header.partition(" ")
    if kind.lower() != "bearer" or not token.strip():
        return "token", frozenset()
    return "token", token_scopes(settings, token.strip())


def token_scopes(settings: Settings, token: str) -> frozenset[Scope]:
    """The scopes a presented token grants; every configured token is compared."""
    if len(token) > MAX_TOKEN_LENGTH:
        return frozenset()
    presented = token.encode()
    if _matches_any(presented, settings.api_tokens):
        return frozenset({READ, WRITE})
    if _matches_any(presented, settings.read_tokens):
        return frozenset({READ})
    return frozenset()


def _matches_any(presented: bytes, tokens: Iterable[SecretStr]) -> bool:
    """Compare digests (equal lengths, so not even a token's length leaks), every one of them."""
    digest = hashlib.sha256(presented).digest()
    results = [
        hmac.compare_digest(digest, hashlib.sha256(t.get_secret_value().encode()).digest())
        for t in tokens
    ]
    return any(results)


def _fingerprint(token: str) -> str:
    key = str(current_app.secret_key or "").encode()
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


def _session_scopes(settings: Settings) -> frozenset[Scope]:
    stored = session.get(SESSION_KEY)
    if not isinstance(stored, dict) or not _is_live(stored):
        return frozenset()
    fingerprint = stored["fp"].encode()
    full = [_fingerprint(t.get_secret_value()).encode() for t in settings.api_tokens]
    read = [_fingerprint(t.get_secret_value()).encode() for t in settings.read_tokens]
    if any([hmac.compare_digest(fingerprint, f) for f in full]):
        return frozenset({READ, WRITE})
    if any([hmac.compare_digest(fingerprint, f) for f in read]):
        return frozenset({READ})
    return frozenset()


def _is_live(stored: dict[str, Any]) -> bool:
    """The cookie's session id is live on the server, for the same fingerprint (asked once
    per request)."""
    fingerprint, session_id = stored.get("fp"), stored.get("sid")
    if not (isinstance(fingerprint, str) and isinstance(session_id, str)):
        return False
    if "think_jobs_live_session" not in g:
        g.think_jobs_live_session = sessions.live_fingerprint(current_extension().jobs, session_id)
    live = g.think_jobs_live_session
    return isinstance(live, str) and hmac.compare_digest(live.encode(), fingerprint.encode())


def log_in(token: str) -> frozenset[Scope]:
    """Start an admin session for ``token``; returns its scopes (empty: refused)."""
    scopes = token_scopes(current_extension().jobs.settings, token)
    if scopes:
        fingerprint = _fingerprint(token)
        session_id = sessions.start(current_extension().jobs, fingerprint)
        session[SESSION_KEY] = {"fp": fingerprint, "sid": session_id}
        g.pop("think_jobs_live_session", None)
        csrf.rotate()
    return scopes


def log_out() -> None:
    """End the session on the server too: a copy of the cookie no longer works."""
    stored = session.pop(SESSION_KEY, None)
    if isinstance(stored, dict) and isinstance(stored.get("sid"), str):
        sessions.end(current_extension().jobs, stored["sid"])
    g.pop("think_jobs_live_session", None)
    csrf.rotate()


def unauthenticated(*, token_presented: bool) -> ApiError:
    if token_presented:
        error = ApiError(401, "invalid token", type="invalid_token")
        error.headers["WWW-Authenticate"] = 'Bearer realm="think-jobs", error="invalid_token"'
    else:
        error = ApiError(401, "authentication required: send Authorization: Bearer <token>")
        error.headers["WWW-Authenticate"] = 'Bearer realm="think-jobs"'
    return error


def forbidden(scope: Scope) -> ApiError:
    return ApiError(403, f"this credential does not grant the {scope!r} scope")


def scope_of(view: Callable[..., Any]) -> Scope | None:
    found = getattr(view, SCOPE_ATTRIBUTE, None)
    return found if isinstance(found, str) else None
