"""Who is alive and what they serve: every worker (and beat) keeps a heartbeat record in Redis.

A record says which queues a worker consumes, which agent types it has registered, its
concurrency and what it is running now (Celery's ``inspect`` is the model, without the
broadcast). It is rewritten every ``worker_heartbeat_interval_s`` and expires after three
intervals, so a worker that died simply disappears. Expiry is Redis's clock: no two machines'
clocks are ever compared.

Keys (beside the others of ``think_jobs.keys``): ``<prefix>:presence`` is a SET of record ids,
``<prefix>:presence:<id>`` the record (JSON, with a TTL). Readers drop ids whose record expired.

What reads them: ``waiting_reason`` (``inspect_submission``'s ``waiting_reason``: a pending turn
that no live worker can run says so), ``think-jobs workers``, the admin pages. A heartbeat that
cannot reach Redis logs and tries again at the next interval; it never stops the worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, ValidationError

from think_jobs.context import utcnow
from think_jobs.errors import BrokerUnavailableError, ThinkJobsError

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)

Role = Literal["worker", "beat"]
_TTL_INTERVALS = 3
_AGENT_TASKS = frozenset({"think_jobs.drain", "think_jobs.fire_schedule"})


class RunningTask(BaseModel):
    """One task a worker is executing: its Celery name, the agent it is for, since when."""

    model_config = ConfigDict(frozen=True)

    task: str
    agent: str | None
    since: datetime


class WorkerRecord(BaseModel):
    """A live worker (or beat) as its last heartbeat described it. Datetimes are aware UTC."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: Role
    hostname: str
    pid: int
    queues: list[str]
    agent_types: list[str]
    concurrency: int | None
    running: list[RunningTask]
    started_at: datetime
    seen_at: datetime


def _index_key(jobs: ThinkJobs) -> str:
    return f"{jobs.keys.prefix}:presence"


def _record_key(jobs: ThinkJobs, record_id: str) -> str:
    return f"{jobs.keys.prefix}:presence:{record_id}"


def ttl_s(jobs: ThinkJobs) -> int:
    """How long a record outlives its last heartbeat (whole seconds, at least 2)."""
    return max(2, round(_TTL_INTERVALS * jobs.settings.worker_heartbeat_interval_s))


# -- reading -----------------------------------------------------------------------------------


def live_workers(jobs: ThinkJobs) -> list[WorkerRecord]:
    """Every live record, workers first, then by name. Raises ``BrokerUnavailableError``."""
    try:
        ids = sorted(_text(member) for member in jobs.redis.smembers(_index_key(jobs)))
        raws = jobs.redis.mget([_record_key(jobs, record_id) for record_id in ids]) if ids else []
    except redis.RedisError as error:
        raise BrokerUnavailableError(f"cannot read worker presence: {error}") from error
    _forget_expired(jobs, [i for i, raw in zip(ids, raws, strict=True) if raw is None])
    records = [record for raw in raws if (record := _parsed(raw)) is not None]
    return sorted(records, key=lambda record: (record.role != "worker", record.name))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parsed(raw: bytes | str | None) -> WorkerRecord | None:
    if raw is None:
        return None
    try:
        return WorkerRecord.model_validate_json(raw)
    except ValidationError:  # written by another version: not ours to read
        return None


def _forget_expired(jobs: ThinkJobs, record_ids: list[str]) -> None:
    if record_ids:
        with contextlib.suppress(redis.RedisError):
            jobs.redis.srem(_index_key(jobs), *record_ids)


def waiting_reason(jobs: ThinkJobs, agent_type: str) -> str | None:
    """Why a pending turn of ``agent_type`` cannot start, or None when a live worker serves it."""
    try:
        workers = [w for w in live_workers(jobs) if w.role == "worker"]
    except BrokerUnavailableError as error:
        return f"cannot tell whether a live worker serves agent type {agent_type}: {error}"
    return reason_among(workers, queue=jobs.settings.queue, agent_type=agent_type)


def reason_among(workers: list[WorkerRecord], *, queue: str, agent_type: str) -> str | None:
    """``waiting_reason`` over records already read (the dashboard reads them once)."""
    on_queue = [w for w in workers if w.role == "worker" and queue in w.queues]
    if any(agent_type in w.agent_types for w in on_queue):
        return None
    missing = f"no live worker serves agent type {agent_type}"
    if not on_queue:
        return f"{missing} (no live worker consumes queue {queue})"
    served = sorted({t for w in on_queue for t in w.agent_types})
    if not served:
        return f"{missing} (the live workers on queue {queue} serve no agent types: --app?)"
    return f"{missing} (live workers on queue {queue} serve {', '.join(served)})"


def find(jobs: ThinkJobs, name: str) -> WorkerRecord | None:
    """The live record named ``name`` (e.g. ``celery@host`` or ``beat@host``), if any."""
    return next((record for record in live_workers(jobs) if record.name == name), None)


# -- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """What a heartbeat says about its process besides what it is running."""

    name: str
    role: Role
    queues: tuple[str, ...]
    concurrency: int | None


class Heartbeat:
    """A daemon thread that rewrites this process's record until stopped (then deletes it).

    ``task_started``/``task_finished`` keep the "running" list; they only touch memory, the
    next beat publishes it (no Redis call on a task's path).
    """

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
        with contextlib.suppress(redis.RedisError):
            self._jobs.redis.srem(_index_key(self._jobs), self._id)
            self._jobs.redis.delete(_record_key(self._jobs, self._id))

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
        with self._jobs.redis.pipeline(transaction=False) as pipe:
            pipe.set(_record_key(self._jobs, self._id), self.record().model_dump_json())
            pipe.expire(_record_key(self._jobs, self._id), ttl_s(self._jobs))
            pipe.sadd(_index_key(self._jobs), self._id)
            pipe.execute()

    def _loop(self) -> None:
        interval_s = self._jobs.settings.worker_heartbeat_interval_s
        while True:
            try:
                self.beat()
            except redis.RedisError as error:
                log.warning("presence heartbeat failed (will retry): %s", error)
            if self._stop.wait(interval_s):
                return


# -- Celery edge -------------------------------------------------------------------------------


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
        with jobs.db.read():
            pass
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
    return None if identity is None else f"{identity[0]}:{identity[1]}"


def describe_running(record: WorkerRecord, *, now: datetime | None = None) -> Iterator[str]:
    """``drain Lead:weekly (3 s)`` for each running task (for tables)."""
    moment = now or utcnow()
    for task in record.running:
        seconds = max(0.0, (moment - task.since).total_seconds())
        name = task.task.removeprefix("think_jobs.")
        target = f" {task.agent}" if task.agent else ""
        yield f"{name}{target} ({seconds:.0f} s)"
