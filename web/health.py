"""``/healthz``: can this process reach the database and Redis? (200 or 503; no secrets.)"""

from __future__ import annotations

import logging
from typing import Literal

import redis
from flask import Response
from sqlalchemy import text

from think_jobs import ThinkJobs
from think_jobs.errors import StorageUnavailableError
from web import auth, params
from web.extension import current_extension
from web.openapi import api_blueprint, operation
from web.schemas import HealthReport

bp = api_blueprint("think_jobs_health", __name__)
log = logging.getLogger(__name__)

Check = Literal["ok", "unavailable"]


def database_state(jobs: ThinkJobs) -> Check:
    try:
        with jobs.db.read() as conn:
            conn.execute(text("SELECT 1"))
    except StorageUnavailableError as error:
        log.warning("health: database unavailable: %s", error)
        return "unavailable"
    return "ok"


def redis_state(jobs: ThinkJobs) -> Check:
    try:
        jobs.redis.ping()
    except redis.RedisError as error:
        log.warning("health: redis unavailable: %s", error)
        return "unavailable"
    return "ok"


@bp.get("/healthz")
@operation(
    summary="Database and Redis reachability",
    tag="health",
    responses={200: HealthReport, 503: HealthReport},
)
@auth.marked(auth.PUBLIC)
def healthz() -> Response:
    jobs = current_extension().jobs
    database, cache = database_state(jobs), redis_state(jobs)
    ok = database == "ok" and cache == "ok"
    report = HealthReport(status="ok" if ok else "unavailable", database=database, redis=cache)
    return params.model_response(report, 200 if ok else 503)
