"""How the admin pages fail: not logged in → the login page (ours, or the host's); anything
else → an HTML error page with the same status the API would give."""

from __future__ import annotations

from urllib.parse import urlencode

from flask import redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from web.current import current_extension
from web.errors import from_exception


def login_target(next_path: str | None = None) -> str:
    """Where to log in: the host's ``login_url`` (a path or an endpoint) or our login page."""
    login_url = current_extension().login_url
    if current_extension().authorize is None or login_url is None:
        base = url_for("think_jobs_admin.login")
    elif login_url.startswith(("/", "http://", "https://")):
        base = login_url
    else:
        base = url_for(login_url)
    return base if next_path is None else f"{base}?{urlencode({'next': next_path})}"


def handle_error(error: Exception) -> ResponseReturnValue:
    found = from_exception(error)
    extension = current_extension()
    can_log_in = extension.authorize is None or extension.login_url is not None
    if found.status == 401 and request.method == "GET" and can_log_in:
        here = request.script_root + request.full_path.rstrip("?")
        return redirect(login_target(here))
    return render_template("think_jobs/error.html", error=found), found.status
