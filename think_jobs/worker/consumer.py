"""Celery's consumer, reconnecting quickly to a broker that came back.

When a worker loses the broker (Redis restarted, a network blip), Celery's consumer retries
with kombu's default back-off — 2 s, then 4 s, 6 s... — so a Redis restart left the workers
idle for ~4 s although the sweeper had re-sent the lost work within its interval. This
consumer retries every ``RETRY_START_S``, growing to at most ``RETRY_MAX_S``, so the workers
take work again within about one sweep interval of the broker's return. It is selected by
``worker_consumer`` in ``think_jobs.worker.app``.

A Redis that refuses writes — ``maxmemory`` reached under ``noeviction``, a replica left
read-only by a failover — answers on a live connection, so connecting "succeeds" and the
error comes a step later (kombu noting a message as unacknowledged, or taking the lock of
its redelivery scan). With ``broker_channel_error_retry`` (``think_jobs.worker.app``) Celery
retries instead of exiting, but at once, five times a second, each with an error and a
traceback; this consumer says once a ``REFUSED_LOG_EVERY_S`` what is wrong and tries again
every ``RETRY_MAX_S``.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import redis
from celery.worker.consumer import Consumer as CeleryConsumer

log = logging.getLogger(__name__)

RETRY_START_S = 0.1
RETRY_STEP_S = 0.2
RETRY_MAX_S = 1.0
REFUSED_LOG_EVERY_S = 30.0
REFUSED = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


class Consumer(CeleryConsumer):  # type: ignore[misc]
    _refused_logged_at = -REFUSED_LOG_EVERY_S  # monotonic time the refusal was last logged

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RETRY_START_S,
            interval_step=RETRY_STEP_S,
            interval_max=RETRY_MAX_S,
        )
        return super().ensure_connected(conn)

    def on_connection_error_before_connected(self, exc: BaseException) -> None:
        if isinstance(exc, REFUSED):
            self._refused(exc)
            return
        super().on_connection_error_before_connected(exc)

    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        if isinstance(exc, REFUSED):
            self._refused(exc)
        super().on_connection_error_after_connected(exc)

    def _refused(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now >= self._refused_logged_at + REFUSED_LOG_EVERY_S:
            self._refused_logged_at = now
            log.error(
                "Redis refuses writes (%s: %s): is its maxmemory reached, or is it a read-only "
                "replica? The worker takes no work and tries again every %g s",
                *(type(exc).__name__, exc, RETRY_MAX_S),
            )
        time.sleep(RETRY_MAX_S)
