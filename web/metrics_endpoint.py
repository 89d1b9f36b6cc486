"""``/metrics``: Prometheus text exposition of this process's think-jobs metrics plus the queue
gauges read from the database (``ThinkJobs.metrics_text``).

Protected like the read API: a read or full bearer token (or an admin session). Setting
``THINK_JOBS_METRICS_PUBLIC = True`` lets anyone who can reach the route scrape it: turn it on
only where the network already decides who that is (a private interface, a proxy rule). The
metrics carry agent types and counts, never agent names, ids or message content.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from web import auth, security
from web.current import current_extension
from web.errors import register_json_errors

bp = Blueprint("think_jobs_metrics", __name__)
security.protect(bp)
register_json_errors(bp)


@bp.get("/metrics")
@auth.marked(auth.READ)  # checked below unless THINK_JOBS_METRICS_PUBLIC
def metrics() -> Response:
    if not current_app.config["THINK_JOBS_METRICS_PUBLIC"]:
        auth.check(auth.READ)
    body = current_extension().jobs.metrics_text()
    return Response(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
