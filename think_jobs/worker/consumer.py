"""Celery's consumer, reconnecting quickly to a broker that came back.

When a worker loses the broker (Redis restarted, a network blip), Celery's consumer retries
with kombu's default back-off — 2 s, then 4 s, 6 s... — so a Redis restart left the workers
idle for ~4 s although the sweeper had re-sent the lost work within its interval. This
consumer retries every ``RETRY_START_S``, growing to at most ``RETRY_MAX_S``, so the workers
take work again within about one sweep interval of the broker's return. It is selected by
``worker_consumer`` in ``think_jobs.worker.app``.
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

RETRY_START_S = 0.1
RETRY_STEP_S = 0.2
RETRY_MAX_S = 1.0


class Consumer(CeleryConsumer):  # type: ignore[misc]
    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RETRY_START_S,
            interval_step=RETRY_STEP_S,
            interval_max=RETRY_MAX_S,
        )
        return super().ensure_connected(conn)
