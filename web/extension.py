"""``ThinkJobsFlask``: the Flask extension that mounts think-jobs' blueprints on an app.

::

    ext = ThinkJobsFlask(jobs=jobs, url_prefix="/ops/agents", authorize=can_access)
    ext.init_app(app)           # app.extensions["think_jobs"] is ext

The extension keeps no per-app state besides ``app.extensions``: one object may serve several
apps. Views reach it with ``current_extension()``.

Behind proxies, ``proxy_fix(wsgi_app, proxies)`` is werkzeug's ProxyFix with one guard: the
prefix it takes from ``X-Forwarded-Prefix`` (a client can send that header through a proxy
that passes it on) must be a path, ``/something``: never ``//host`` or a scheme, which would
turn every redirect and link into one to another site. Anything else is a 400.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Flask, Request, current_app
from werkzeug.middleware.proxy_fix import ProxyFix

from think_jobs import Think, ThinkJobs
from think_jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)
# A URL path of segments made of RFC 3986 path characters: "", "/", "/ops", "/ops/agents/".
_PATH_PREFIX = re.compile(r"(?:/[A-Za-z0-9\-._~!$&'()*+,;=:@%]+)*/?")

Scope = str  # "read" or "write"
Authorize = Callable[[Request, Scope], bool]

DEFAULT_MOUNTS: Mapping[str, str] = {
    "api": "/api",
    "streams": "/api",
    "webhooks": "/hooks",
    "admin": "/admin",
    "health": "",
    "metrics": "",
}
CONFIG_DEFAULTS: Mapping[str, Any] = {
    "THINK_JOBS_SSE_HEARTBEAT_S": 15.0,
    "THINK_JOBS_SSE_MAX_DURATION_S": 3600.0,
    "THINK_JOBS_ADMIN_PAGE_SIZE": 25,
    "THINK_JOBS_METRICS_PUBLIC": False,  # True: /metrics without a token (trusted networks)
    "THINK_JOBS_DASHBOARD_STUCK_FACTOR": 5.0,  # stuck: running past factor x usual p50 ...
    "THINK_JOBS_DASHBOARD_STUCK_MIN_S": 60.0,  # ... and never before this many seconds
    "THINK_JOBS_CONTENT_SECURITY_POLICY": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


@dataclass(frozen=True)
class StreamLimits:
    """How long one SSE response may hold a worker thread, and how often it pings."""

    heartbeat_s: float
    max_duration_s: float


def _blueprint_groups() -> dict[str, list[Blueprint]]:
    from web import (
        admin,
        api_agents,
        api_approvals,
        api_chat,
        api_streams,
        api_submissions,
        health,
        metrics_endpoint,
        openapi,
        webhooks,
    )

    return {
        "api": [api_agents.bp, api_submissions.bp, api_approvals.bp, api_chat.bp, openapi.bp],
        "streams": [api_streams.bp],
        "webhooks": [webhooks.bp],
        "admin": [admin.bp],
        "health": [health.bp],
        "metrics": [metrics_endpoint.bp],
    }


class ThinkJobsFlask:
    """Mounts the API, SSE, webhook, admin, health and metrics blueprints on a Flask app.

    ``mounts`` names the groups to register and each one's path below ``url_prefix`` (leave
    a group out to not serve it). ``authorize(request, scope)`` replaces the built-in tokens
    and login: it is asked for ``"read"`` and, on anything that changes state, ``"write"``;
    ``login_url`` is where the admin pages send visitors that are not logged in.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        jobs: ThinkJobs | None = None,
        url_prefix: str = "",
        mounts: Mapping[str, str] = DEFAULT_MOUNTS,
        authorize: Authorize | None = None,
        login_url: str | None = None,
    ) -> None:
        unknown = set(mounts) - set(DEFAULT_MOUNTS)
        if unknown:
            raise ConfigurationError(f"unknown think-jobs blueprint groups: {sorted(unknown)}")
        self._jobs = jobs
        self.url_prefix = url_prefix.rstrip("/")
        self.mounts = dict(mounts)
        self.authorize = authorize
        self.login_url = login_url
        if app is not None:
            self.init_app(app)

    @property
    def jobs(self) -> ThinkJobs:
        if self._jobs is None:
            from web.loading import jobs_from_environment

            self._jobs = jobs_from_environment()
        return self._jobs

    def init_app(self, app: Flask) -> None:
        for key, value in CONFIG_DEFAULTS.items():
            app.config.setdefault(key, value)
        settings = self.jobs.settings
        no_tokens = not (settings.api_tokens or settings.read_tokens)
        if self.authorize is None and not settings.auth_disabled and no_tokens:
            log.warning("think-jobs web: no API or read tokens configured; all refused")
        if settings.auth_disabled:
            log.warning("think-jobs web: authentication is DISABLED (THINK_JOBS_AUTH_DISABLED)")
        app.extensions["think_jobs"] = self
        groups = _blueprint_groups()
        for group, path in self.mounts.items():
            for blueprint in groups[group]:
                app.register_blueprint(blueprint, url_prefix=self.url_prefix + path or None)

    def agent(self, agent_type: str, agent_name: str) -> Think:
        """The agent a URL names; unknown types raise AgentNotRegisteredError (404)."""
        return self.jobs.get_agent(agent_type, agent_name)

    def stream_limits(self) -> StreamLimits:
        config = current_app.config
        return StreamLimits(
            heartbeat_s=float(config["THINK_JOBS_SSE_HEARTBEAT_S"]),
            max_duration_s=float(config["THINK_JOBS_SSE_MAX_DURATION_S"]),
        )


def current_extension() -> ThinkJobsFlask:
    """The ``ThinkJobsFlask`` of the current app (inside a request or app context)."""
    found = current_app.extensions.get("think_jobs")
    if not isinstance(found, ThinkJobsFlask):
        raise ConfigurationError("think-jobs is not initialised on this app (ThinkJobsFlask)")
    return found


def prefix_problem(script_name: str) -> str | None:
    """Why a mount prefix (``SCRIPT_NAME``, from ``X-Forwarded-Prefix`` behind a proxy) is
    not a plain path, or None when it is one."""
    if _PATH_PREFIX.fullmatch(script_name):
        return None
    return "X-Forwarded-Prefix must be a path such as /ops (not //host, a scheme or a backslash)"


class PathPrefixGuard:
    """WSGI middleware: 400 unless ``SCRIPT_NAME`` is a plain path (see ``prefix_problem``)."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        problem = prefix_problem(str(environ.get("SCRIPT_NAME", "")))
        if problem is None:
            return self.app(environ, start_response)
        error = {"type": "invalid_forwarded_prefix", "message": problem, "details": None}
        body = json.dumps({"error": error}).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        start_response("400 Bad Request", headers)
        return [body]


def proxy_fix(app: WSGIApplication, proxies: int) -> ProxyFix:
    """Trust ``X-Forwarded-For/Proto/Host/Prefix`` from ``proxies`` proxies, the prefix only
    when it is a path."""
    guarded = PathPrefixGuard(app)
    return ProxyFix(guarded, x_for=proxies, x_proto=proxies, x_host=proxies, x_prefix=proxies)
