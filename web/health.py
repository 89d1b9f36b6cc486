"""``/healthz``: can this process reach the database and Redis? (200 or 503; no secrets.)"""

from __future__ import annotations

import logging

from flask import Response

from web import auth, params
from web.current import current_extension
from web.openapi import api_blueprint, operation
from web.schemas import HealthReport

bp = api_blueprint("think_jobs_health", __name__)
log = logging.getLogger(__name__)


@bp.get("/healthz")
@operation(
    summary="Database and Redis reachability",
    tag="health",
    responses={200: HealthReport, 503: HealthReport},
)
@auth.marked(auth.PUBLIC)
def healthz() -> Response:
    health = current_extension().jobs.health()
    for name, problem in (("database", health.database_error), ("redis", health.redis_error)):
        if problem is not None:
            log.warning("health: %s unavailable: %s", name, problem)
    status = "ok" if health.ok else "unavailable"
    report = HealthReport(status=status, database=health.database, redis=health.redis)
    return params.model_response(report, 200 if health.ok else 503)
