"""The nudges that move turns along: a Celery ``drain`` message for a worker, a wake-up for a
waiting caller, and the follow-up messages of ended turns (a workflow step waiting on one).

Drains and wake-ups are hints. Losing one delays a turn until the sweeper (workers) or the
caller's poll notices; sending one twice is harmless because the database decides who runs
what. The Celery app is handed in lazily (the worker edge builds it). When the broker is the
Redis of ``clients`` (``direct``), a drain is one LPUSH of a message built here
(``celery_messages.task_message``); any other broker gets it through Celery's ``send_task``,
and so does every drain once the Celery app (``built``: None until something builds it) has
a kombu ``global_keyprefix``, which moves the queue to another key.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import redis

from think_jobs.keys import Keys
from think_jobs.transport.celery_messages import task_message
from think_jobs.transport.clients import RedisClients, broker_errors
from think_jobs.transport.wakeups import wake_callers

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

DRAIN_TASK: Final = "think_jobs.drain"
SWEEP_TASK: Final = "think_jobs.sweep"
_RETRY_POLICY: Final = {"max_retries": 1, "interval_start": 0.1, "interval_step": 0.2}


class Dispatcher:
    def __init__(
        self,
        celery: Callable[[], Celery],
        clients: RedisClients,
        keys: Keys,
        *,
        queue: str,
        direct: bool = False,
        built: Callable[[], Celery | None] = lambda: None,
    ) -> None:
        self._celery = celery
        self._built = built
        self._clients = clients
        self._keys = keys
        self._queue = queue
        self._direct = direct
        self._reply_to = str(uuid.uuid4())  # Celery's reply address; drains ignore results

    def enqueue_drain(
        self, agent_id: int, address: str | None = None, *, swept: bool = False
    ) -> bool:
        """Ask a worker to run the agent's next turn (``swept``: for the sweeper, whose mark
        the drain drops); False (logged, naming ``address`` when given: ``<type>:<name>``) if
        the broker is down."""
        try:
            self._send_drain(agent_id, {"swept": True} if swept else {})
        except Exception as error:  # kombu raises several unrelated types when the broker is down
            agent = address or f"agent row {agent_id}"
            log.warning("could not enqueue work for %s (the sweeper will): %s", agent, error)
            return False
        return True

    def _send_drain(self, agent_id: int, kwargs: dict[str, Any]) -> None:
        if not self._direct or self._prefixed_by_kombu():
            self._celery().send_task(
                DRAIN_TASK,
                args=[agent_id],
                kwargs=kwargs,
                queue=self._queue,
                ignore_result=True,
                retry=True,
                retry_policy={**_RETRY_POLICY, "interval_max": 0.2},
            )
            return
        message = task_message(
            DRAIN_TASK, [agent_id], kwargs, queue=self._queue, reply_to=self._reply_to
        )
        with broker_errors("sending a drain"):
            try:
                self._clients.redis.lpush(self._queue, message)
            except redis.ConnectionError:  # a pooled connection Redis closed (a restart)
                self._clients.redis.lpush(self._queue, message)  # once more, on a new one

    def _prefixed_by_kombu(self) -> bool:
        """Whether the Celery app, if built, puts its queues under a ``global_keyprefix``
        (set on its conf at any time): a drain LPUSHed to the bare queue name would never be
        consumed, by any worker, and neither would the sweeper's."""
        app = self._built()
        if app is None:
            return False
        options = app.conf.broker_transport_options or {}
        return bool(options.get("global_keyprefix"))

    def send_message(self, message: dict[str, Any]) -> None:
        """Send a stored Celery task message (a signature as a dict); raises if it fails."""
        self._celery().signature(message).apply_async()

    def wake_callers(self, agent: str) -> None:
        """Tell callers waiting on ``agent`` (its address) that its lease was released."""
        wake_callers(self._clients.redis, self._keys, agent)
