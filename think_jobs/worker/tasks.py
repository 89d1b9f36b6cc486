"""Every Celery task of think-jobs, in one module. Tasks are thin, like views: they carry ids,
call into the engine and translate its outcome into Celery's terms (retry, ignore, reject).

Stable names let producers and workers of different versions talk: ``think_jobs.drain``
(run an agent's next turns), ``think_jobs.sweep``, ``think_jobs.fire_schedule`` (one
occurrence of a scheduled task) and ``think_jobs.turn`` (an agent turn as a workflow step).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from celery.exceptions import Ignore, Reject, Retry
from kombu.utils import json as kombu_json

from think_jobs.engine import drain, schedules, workflows
from think_jobs.engine.schedules import FIRE_TASK, RetryFire
from think_jobs.engine.workflows import SUBMITTED_KEY, TURN_TASK, StepCall
from think_jobs.errors import ConfigurationError, StorageUnavailableError
from think_jobs.transport.dispatch import DRAIN_TASK, SWEEP_TASK

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

BEAT_SCHEDULER = "think_jobs.worker.beat:DatabaseScheduler"


_BACKEND_LOCK = threading.Lock()
_SHARED_BACKEND = "_think_jobs_resultless_backend"


class ResultlessTask(Task):  # type: ignore[misc]
    """A task whose results are never stored (``ignore_result``): one result backend for all
    the worker's threads. Celery's tracer asks every task for its backend (``mark_as_done``
    and ``process_cleanup``, which store nothing then) and the app keeps one backend per
    thread, so each new thread of a threads pool built its own on its first task — a Redis
    backend, its connection pool and redis-py's package-metadata lookup, ~1 ms of CPU under
    the GIL, 500 times over when a worker of concurrency 500 starts with its queue full."""

    @property
    def backend(self) -> Any:
        shared: dict[str, Any] = self.app.__dict__
        found = shared.get(_SHARED_BACKEND)
        if found is None:
            with _BACKEND_LOCK:
                found = shared.get(_SHARED_BACKEND)
                if found is None:  # the first thread's, for every resultless task of the app
                    found = shared[_SHARED_BACKEND] = self.app.backend
        return found

    @backend.setter
    def backend(self, value: Any) -> None:
        self.app.__dict__[_SHARED_BACKEND] = value


def register(app: Celery, jobs: ThinkJobs) -> None:
    """Register every task on ``app``, and make ``celery beat`` use the database."""
    _drains(app, jobs)
    _schedules(app, jobs)
    _workflows(app, jobs)


def _drains(app: Celery, jobs: ThinkJobs) -> None:
    @app.task(  # type: ignore[untyped-decorator]
        name=DRAIN_TASK,
        base=ResultlessTask,
        ignore_result=True,
        shared=False,
        autoretry_for=(StorageUnavailableError,),
        retry_backoff=True,
        retry_backoff_max=30,
        max_retries=20,
    )
    def drain_task(agent_id: int, swept: bool = False) -> str:
        """Run the agent's next turn; while the database is down, back off and retry."""
        ran = drain.drain(jobs.services, agent_id, swept=swept)
        return str(ran)  # "ran 2", "idle": for Celery's log

    @app.task(  # type: ignore[untyped-decorator]
        name=SWEEP_TASK, base=ResultlessTask, ignore_result=True, shared=False
    )
    def sweep() -> int:
        return drain.sweep(jobs.services)


def _schedules(app: Celery, jobs: ThinkJobs) -> None:
    app.conf.beat_scheduler = BEAT_SCHEDULER

    @app.task(  # type: ignore[untyped-decorator]
        name=FIRE_TASK,
        base=ResultlessTask,
        bind=True,
        ignore_result=True,
        shared=False,
        max_retries=None,
    )
    def fire_schedule(
        self: Any, agent_id: int, task_id: str, scheduled_for: str, attempt: int | None = None
    ) -> str:
        when = datetime.fromisoformat(scheduled_for)
        if attempt is not None:  # beat keeps the occurrence and sends each attempt itself
            return str(
                schedules.fire(jobs.services, agent_id, task_id, when, attempt=attempt, kept=True)
            )
        attempt = int(self.request.retries) + 1  # a beat from before think_schedule_fires
        try:
            fired = schedules.fire(jobs.services, agent_id, task_id, when, attempt=attempt)
            return str(fired)  # "submitted <id>", "removed": for Celery's log
        except RetryFire as retry:
            raise self.retry(
                countdown=retry.countdown_s, exc=retry.__cause__, max_retries=None
            ) from None


def _workflows(app: Celery, jobs: ThinkJobs) -> None:
    """``think_jobs.turn``. Chords and ``AsyncResult.get()`` need a result backend: when the
    app has none, results go to ``redis_url`` (they expire after ``result_expires``, one day
    by default). Other tasks keep ignoring their results."""
    if not app.conf.result_backend:
        app.conf.result_backend = jobs.settings.result_backend_url or jobs.settings.redis_url

    @app.task(  # type: ignore[untyped-decorator]
        name=TURN_TASK, bind=True, shared=False, ignore_result=False
    )
    def turn(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """An agent turn as a workflow step (see ``think_jobs.engine.workflows``)."""
        return run_step(jobs, self, args, kwargs)


def run_step(
    jobs: ThinkJobs, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Submit (once per attempt), then end until the turn's end sends this step again."""
    request = task.request
    if request.called_directly or request.is_eager:
        raise ConfigurationError(
            f"{TURN_TASK} waits for its turn's end: run it on a worker (.delay(), .s() in a "
            "chain, group or chord), not called directly or with task_always_eager"
        )
    step = workflows.parse_step(args, kwargs)
    call = StepCall(request.id, request.root_id, int(request.retries))
    agent = jobs.get_agent(step.agent_type, step.agent_name)
    try:
        result = workflows.run(jobs.services, agent, step, call, _follow_up(task, kwargs))
    except StorageUnavailableError:  # the database is down: ask again later
        raise _poll_again(task, step.poll_interval_s, kwargs) from None
    if result is None:
        raise Ignore()  # the turn's end sends this step again
    return result


def _follow_up(task: Any, kwargs: dict[str, Any]) -> workflows.FollowUp:
    """This step's own task message, to store as its turn's follow-up (Celery's JSON)."""

    def message(key: str) -> dict[str, Any]:
        again = {**kwargs, SUBMITTED_KEY: key}
        signature = task.signature_from_request(task.request, None, again)
        text = kombu_json.dumps(signature)  # type: ignore[no-untyped-call]
        loaded: dict[str, Any] = kombu_json.loads(text)  # type: ignore[no-untyped-call]
        return loaded

    return message


def _poll_again(task: Any, countdown_s: float, kwargs: dict[str, Any]) -> Retry:
    """Publish this step again after ``countdown_s``, as ``Task.retry`` does but keeping
    ``request.retries`` (a poll is not a retry). The caller raises the returned ``Retry``; the
    worker then acks the current message. If publishing fails, the message goes back to the
    queue instead of being lost."""
    signature = task.signature_from_request(task.request, None, kwargs, countdown=countdown_s)
    try:
        signature.apply_async()
    except Exception as error:  # kombu raises several unrelated types when the broker is down
        raise Reject(error, requeue=True) from error
    return Retry(when=countdown_s, sig=signature)
