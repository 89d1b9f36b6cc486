"""think-jobs on the web: the JSON API, SSE streams, webhooks, admin pages and ``/healthz``.

Standalone::

    gunicorn -w 2 -k gthread --threads 8 'web:create_app()'     # jobs from $THINK_JOBS_APP

Embedded in an existing Flask app::

    from web import ThinkJobsFlask
    ThinkJobsFlask(app, jobs=jobs, url_prefix="/ops/agents")

This package imports the core; the core never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, redirect, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from think_jobs import ThinkJobs
from think_jobs.errors import ConfigurationError
from web import auth, security
from web.current import Authorize, current_extension
from web.errors import handle_as_json
from web.extension import ThinkJobsFlask
from web.proxies import proxy_fix

__all__ = ["Authorize", "ThinkJobsFlask", "create_app", "current_extension"]

STANDALONE_DEFAULTS: Mapping[str, Any] = {
    "SESSION_COOKIE_NAME": "think_jobs_session",
    "SESSION_COOKIE_HTTPONLY": True,
    "SESSION_COOKIE_SAMESITE": "Lax",
    "SESSION_COOKIE_SECURE": True,
    "THINK_JOBS_PROXY_FIX": 0,
}
_JSON_PREFIXES = ("/api/", "/hooks/", "/healthz")


def create_app(jobs: ThinkJobs | None = None, config: Mapping[str, Any] | None = None) -> Flask:
    """The standalone app: defaults, then ``FLASK_*`` environment variables, then ``config``.

    The session cookie is ``Secure`` unless ``THINK_JOBS_SESSION_COOKIE_SECURE=false``
    (plain-HTTP mode, for a trusted network without TLS).

    ``jobs`` defaults to the object named by ``THINK_JOBS_APP`` (``mypkg.agents:jobs``).
    ``THINK_JOBS_PROXY_FIX = n`` trusts ``X-Forwarded-*`` from ``n`` proxies in front.
    """
    app = Flask(__name__, static_folder=None)
    extension = ThinkJobsFlask(jobs=jobs)
    extension.jobs.configure_logging()  # THINK_JOBS_LOG_LEVEL / _LOG_JSON, as everywhere
    app.config.from_mapping(STANDALONE_DEFAULTS)
    app.config["SESSION_COOKIE_SECURE"] = extension.jobs.settings.session_cookie_secure
    app.config.from_prefixed_env("FLASK")
    app.config.from_mapping(config or {})
    _set_secret_key(app, extension.jobs)
    extension.init_app(app)
    app.add_url_rule("/", "index", auth.marked(auth.PUBLIC)(_index))
    app.register_error_handler(HTTPException, _http_error)
    app.after_request(security.add_headers)
    proxies = int(app.config["THINK_JOBS_PROXY_FIX"])
    if proxies:
        app.wsgi_app = proxy_fix(app.wsgi_app, proxies)  # type: ignore[method-assign]
    return app


def _set_secret_key(app: Flask, jobs: ThinkJobs) -> None:
    if app.config.get("SECRET_KEY"):
        return
    if jobs.settings.secret_key is None:
        raise ConfigurationError(
            "set THINK_JOBS_SECRET_KEY (signs admin sessions and CSRF tokens); "
            'e.g. python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    app.config["SECRET_KEY"] = jobs.settings.secret_key.get_secret_value()


def _index() -> ResponseReturnValue:
    return redirect(url_for("think_jobs_admin.agents"))


def _http_error(error: HTTPException) -> Response | HTTPException:
    """Routing errors (404, 405) outside any blueprint: JSON under /api and /hooks."""
    if request.path.startswith(_JSON_PREFIXES):
        return handle_as_json(error)
    return error
