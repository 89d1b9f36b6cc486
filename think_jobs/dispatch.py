"""The two nudges that move turns along: a Celery ``drain`` message, and a wake-up for callers.

Both are hints. Losing one delays a turn until the sweeper (workers) or the caller's poll
notices; sending one twice is harmless because the database decides who runs what.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)

DRAIN_TASK = "think_jobs.drain"
SWEEP_TASK = "think_jobs.sweep"


class Dispatcher:
    def __init__(self, jobs: ThinkJobs) -> None:
        self._jobs = jobs

    def enqueue_drain(self, agent_id: int) -> bool:
        """Ask a worker to run the agent's next turn; False (logged) if the broker is down."""
        settings = self._jobs.settings
        try:
            self._jobs.celery.send_task(
                DRAIN_TASK,
                args=[agent_id],
                queue=settings.queue,
                ignore_result=True,
                retry=True,
                retry_policy={
                    "max_retries": 1,
                    "interval_start": 0.1,
                    "interval_step": 0.2,
                    "interval_max": 0.2,
                },
            )
        except Exception as error:  # kombu raises several unrelated types when the broker is down
            log.warning(
                "could not enqueue work for agent %s (the sweeper will): %s", agent_id, error
            )
            return False
        return True

    def wake_callers(self, address: str) -> None:
        """Tell callers waiting on the agent that its lease was released."""
        try:
            self._jobs.redis.publish(self._jobs.keys.turn_released(address), "released")
        except redis.RedisError as error:
            log.debug("could not wake callers of %s: %s", address, error)
