"""Wake-ups for blocking callers waiting their turn: a pub/sub message on the agent's
``released`` channel each time its lease is given back. A hint only: a waiter also polls."""

from __future__ import annotations

import contextlib
import logging
import time

import redis
from redis.client import PubSub

from think_jobs.keys import Keys
from think_jobs.transport.streams import open_pubsub

log = logging.getLogger(__name__)


def wake_callers(client: redis.Redis, keys: Keys, agent: str) -> None:
    """Tell callers waiting on ``agent`` that its lease was released (logged if Redis is down)."""
    try:
        client.publish(keys.turn_released(agent), "released")
    except redis.RedisError as error:
        log.debug("could not wake callers of %s: %s", agent, error)


class Wakeups:
    """Sleeps until the agent's lease is released (pub/sub), or ``timeout_s`` passes.
    Subscribe before admitting the turn you wait for, so no wake-up is lost."""

    def __init__(self, client: redis.Redis, keys: Keys, agent: str) -> None:
        self._pubsub: PubSub | None = None
        try:
            pubsub = open_pubsub(client)
            pubsub.subscribe(keys.turn_released(agent))
            self._pubsub = pubsub
        except redis.RedisError as error:
            log.debug("waiting by polling only: %s", error)

    def wait(self, timeout_s: float) -> None:
        if self._pubsub is None:
            time.sleep(timeout_s)
            return
        try:
            self._pubsub.get_message(timeout=timeout_s)
        except redis.RedisError:
            self.close()  # its connection is closed now, not when it is collected
            self._pubsub = None
            time.sleep(timeout_s)

    def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError):
                self._pubsub.close()
