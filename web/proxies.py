"""Behind proxies: ``proxy_fix(wsgi_app, proxies)`` is werkzeug's ProxyFix with one guard. The
prefix it takes from ``X-Forwarded-Prefix`` (a client can send that header through a proxy
that passes it on) must be a path, ``/something``: never ``//host`` or a scheme, which would
turn every redirect and link into one to another site. Anything else is a 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from werkzeug.middleware.proxy_fix import ProxyFix

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

# A URL path of segments made of RFC 3986 path characters: "", "/", "/ops", "/ops/agents/".
_PATH_PREFIX = re.compile(r"(?:/[A-Za-z0-9\-._~!$&'()*+,;=:@%]+)*/?")


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
