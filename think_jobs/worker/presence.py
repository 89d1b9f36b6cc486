"""A worker's (or beat's) presence heartbeat: a daemon thread rewriting its record in Redis
(``think_jobs.transport.presence``) until stopped, then deleting it.

The "running" list is read at each beat from the requests Celery's worker process counts as
active (``celery.worker.state.active_requests``, kept in the worker's main process for every
pool: threads, and prefork too, whose tasks run in child processes where a task signal would
never reach this thread). Nothing runs on a task's path; the agent an agent task is for is
looked up once per agent row by the heartbeat thread. A heartbeat that cannot reach Redis logs
and tries again at the next interval; it never stops the worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import redis

from think_jobs.context import utcnow
from think_jobs.errors import ThinkJobsError
from think_jobs.keys import agent_address
from think_jobs.results import RunningTask, WorkerRecord
from think_jobs.transport import presence

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)

_AGENT_TASKS = frozenset({"think_jobs.drain", "think_jobs.fire_schedule"})


@dataclass(frozen=True)
class Identity:
    """What a heartbeat says about its process besides what it is running."""

    name: str
    role: Literal["worker", "beat"]
    queues: tuple[str, ...]
    concurrency: int | None


class Heartbeat:
    def __init__(self, jobs: ThinkJobs, identity: Identity) -> None:
        self._jobs = jobs
        self._identity = identity
        self._id = uuid.uuid4().hex
        self._started_at = utcnow()
        self.requests: Callable[[], list[Any]] = list  # the tasks running now (none: beat)
        self._addresses: dict[int, str] = {}  # agent row -> <type>:<name>
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="think-jobs-presence", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        presence.remove(self._jobs.redis, self._jobs.keys, self._id)

    def _running_now(self) -> list[RunningTask]:
        return sorted(
            (self._running_task(request) for request in self.requests()),
            key=lambda task: task.since,
        )

    def _running_task(self, request: Any) -> RunningTask:
        name = str(request.name)
        since = datetime.fromtimestamp(float(request.time_start or time.time()), UTC)
        return RunningTask(task=name, agent=self._agent_of(name, request.args), since=since)

    def _agent_of(self, task: str, args: Any) -> str | None:
        """``<type>:<name>`` of the agent a drain or a schedule fire is for (None otherwise)."""
        if task not in _AGENT_TASKS or not args or not isinstance(args[0], int):
            return None
        agent_id = args[0]
        if agent_id not in self._addresses:
            address = _address_of(self._jobs, agent_id)
            if address is None:
                return None  # not found now (the database out of reach?): asked again next beat
            self._addresses[agent_id] = address
        return self._addresses[agent_id]

    def record(self) -> WorkerRecord:
        identity = self._identity
        return WorkerRecord(
            name=identity.name,
            role=identity.role,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=list(identity.queues),
            agent_types=self._jobs.agent_types,
            concurrency=identity.concurrency,
            running=self._running_now(),
            started_at=self._started_at,
            seen_at=utcnow(),
        )

    def beat(self) -> None:
        """Write the record once (raises ``redis.RedisError``)."""
        interval_s = self._jobs.settings.worker_heartbeat_interval_s
        ttl_s = presence.ttl_s(interval_s)
        presence.write(self._jobs.redis, self._jobs.keys, self._id, self.record(), ttl_s=ttl_s)

    def _loop(self) -> None:
        interval_s = self._jobs.settings.worker_heartbeat_interval_s
        while True:
            try:
                self.beat()
            except redis.RedisError as error:
                log.warning("presence heartbeat failed (will retry): %s", error)
            if self._stop.wait(interval_s):
                return


def worker_heartbeat(jobs: ThinkJobs, controller: Any) -> Heartbeat:
    """Start the heartbeat of a Celery ``WorkController`` and follow its tasks; warns first
    when the worker serves no agent types or cannot reach its database."""
    check_worker_start(jobs)
    identity = Identity(
        name=str(controller.hostname),
        role="worker",
        queues=_queues_of(controller, jobs.settings.queue),
        concurrency=_int_or_none(getattr(controller, "concurrency", None)),
    )
    heartbeat = Heartbeat(jobs, identity)
    heartbeat.requests = partial(_active_requests, controller.app)
    return heartbeat.start()


def beat_heartbeat(jobs: ThinkJobs) -> Heartbeat:
    """Start the heartbeat of a beat process (``beat@<hostname>``)."""
    identity = Identity(f"beat@{socket.gethostname()}", "beat", (), None)
    return Heartbeat(jobs, identity).start()


def check_worker_start(jobs: ThinkJobs) -> None:
    """Log a WARNING for the two ways a worker can look ready and run nothing."""
    if not jobs.agent_types:
        log.warning(
            "this worker serves no agent types: pending turns stay pending; start it with "
            "--app module:jobs (or THINK_JOBS_APP) naming the module that registers your agents"
        )
    try:
        jobs.health().raise_for_database()
    except ThinkJobsError as error:
        log.warning("this worker cannot reach its database (it will retry): %s", error)


def _queues_of(controller: Any, default: str) -> tuple[str, ...]:
    with contextlib.suppress(AttributeError, TypeError):
        names = tuple(sorted(controller.app.amqp.queues.consume_from))
        if names:
            return names
    return (default,)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _active_requests(app: Any) -> list[Any]:
    """The requests of ``app`` this worker process runs now (any pool)."""
    from celery.worker import state

    return [r for r in list(state.active_requests) if getattr(r, "app", None) is app]


def _address_of(jobs: ThinkJobs, agent_id: int) -> str | None:
    try:
        identity = jobs.identity_of(agent_id)
    except ThinkJobsError:
        return None
    return None if identity is None else agent_address(*identity)
