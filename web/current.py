"""What a view knows of the extension serving it: ``current_extension()``, typed as the
``Extension`` protocol (the jobs, the authorisation hook, the login URL, the agent a URL names,
the SSE limits), and the names of scopes and limits. Every blueprint imports this module, never
``web.extension``, which mounts the blueprints (so the extension sits above its views).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from flask import Request, current_app

from think_jobs import Think, ThinkJobs
from think_jobs.errors import ConfigurationError

Scope = str  # "read" or "write"
Authorize = Callable[[Request, Scope], bool]


@dataclass(frozen=True)
class StreamLimits:
    """How long one SSE response may hold a worker thread, and how often it pings."""

    heartbeat_s: float
    max_duration_s: float


class Extension(Protocol):
    """The extension as its views see it (``web.extension.ThinkJobsFlask`` is one)."""

    authorize: Authorize | None
    login_url: str | None

    @property
    def jobs(self) -> ThinkJobs: ...

    def agent(self, agent_type: str, agent_name: str) -> Think: ...

    def stream_limits(self) -> StreamLimits: ...


def current_extension() -> Extension:
    """The extension of the current app (inside a request or app context)."""
    found = current_app.extensions.get("think_jobs")  # only ThinkJobsFlask.init_app sets it
    if found is None:
        raise ConfigurationError("think-jobs is not initialised on this app (ThinkJobsFlask)")
    return cast(Extension, found)
