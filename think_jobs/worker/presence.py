"""A worker's (or beat's) presence heartbeat: a daemon thread rewriting its record in Redis
(``think_jobs.transport.presence``) until stopped, then deleting it.

``task_started``/``task_finished`` keep the "running" list from Celery's task signals; they
only touch memory, the next beat publishes it (no Redis call on a task's path). A heartbeat
that cannot reach Redis logs and tries again at the next interval; it never stops the worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
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
        self._running: dict[str, RunningTask] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.detach: Callable[[], None] = _nothing
        self._thread = threading.Thread(target=self._loop, name="think-jobs-presence", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.detach()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        presence.remove(self._jobs.redis, self._jobs.keys, self._id)

    def task_started(self, task_id: str, task: str, agent: str | None) -> None:
        running = RunningTask(task=task, agent=agent, since=utcnow())
        with self._lock:
            self._running[task_id] = running

    def task_finished(self, task_id: str) -> None:
        with self._lock:
            self._running.pop(task_id, None)

    def _running_now(self) -> list[RunningTask]:
        with self._lock:
            return sorted(self._running.values(), key=lambda task: task.since)

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
    heartbeat.detach = _follow_tasks(controller.app, jobs, heartbeat)
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


def _nothing() -> None:
    pass


def _follow_tasks(app: Any, jobs: ThinkJobs, heartbeat: Heartbeat) -> Callable[[], None]:
    """Connect Celery's task signals to ``heartbeat``; returns what disconnects them."""
    from celery import signals

    def on_prerun(sender: Any = None, task_id: str = "", args: Any = (), **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            heartbeat.task_started(task_id, str(sender.name), _agent_of(jobs, sender.name, args))

    def on_postrun(sender: Any = None, task_id: str = "", **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            heartbeat.task_finished(task_id)

    signals.task_prerun.connect(on_prerun, weak=False)
    signals.task_postrun.connect(on_postrun, weak=False)

    def detach() -> None:
        signals.task_prerun.disconnect(on_prerun)
        signals.task_postrun.disconnect(on_postrun)

    return detach


def _agent_of(jobs: ThinkJobs, task: str, args: Any) -> str | None:
    """``<type>:<name>`` of the agent a drain or a schedule fire is for (None otherwise)."""
    if task not in _AGENT_TASKS or not args or not isinstance(args[0], int):
        return None
    try:
        identity = jobs.identity_of(args[0])
    except ThinkJobsError:
        return None
    return None if identity is None else agent_address(*identity)
