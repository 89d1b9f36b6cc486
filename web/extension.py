"""``ThinkJobsFlask``: the Flask extension that mounts think-jobs' blueprints on an app.

::

    ext = ThinkJobsFlask(jobs=jobs, url_prefix="/ops/agents", authorize=can_access)
    ext.init_app(app)           # app.extensions["think_jobs"] is ext

The extension keeps no per-app state besides ``app.extensions``: one object may serve several
apps. Views reach it with ``current_extension()``.

The extension sits above its blueprints: it imports them to mount them, and they know it only
through ``web.current``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Flask, current_app

from think_jobs import Think, ThinkJobs
from think_jobs.errors import ConfigurationError
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
from web.current import Authorize, StreamLimits

log = logging.getLogger(__name__)

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


def _blueprint_groups() -> dict[str, list[Blueprint]]:
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
