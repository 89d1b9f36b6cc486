"""The Celery app: configuration that matches think-jobs' guarantees, and the task edges.

Tasks are thin: they carry an agent id and call into ``think_jobs.worker``. Stable names
(``think_jobs.drain``, ``think_jobs.sweep``) let producers and workers of different versions
talk. JSON only, results ignored, ``acks_late`` with ``reject_on_worker_lost`` so a killed
worker's message is redelivered; redelivery is harmless because the database lease decides.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

from think_jobs import logs, schedules, worker, workflows
from think_jobs.dispatch import DRAIN_TASK, SWEEP_TASK
from think_jobs.errors import StorageUnavailableError

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)


def create_celery_app(jobs: ThinkJobs) -> Celery:
    settings = jobs.settings
    app = Celery("think_jobs", broker=settings.effective_broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.queue,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "socket_connect_timeout": 2,
        },
        enable_utc=True,
        timezone="UTC",
        worker_send_task_events=settings.celery_task_events,  # Flower keeps working
        task_send_sent_event=False,  # a second publish per drain, for a "sent" state only
    )
    _register_tasks(app, jobs)
    schedules.register_tasks(app, jobs)
    workflows.register_tasks(app, jobs)
    _connect_lifecycle(app, jobs)
    app.think_jobs = jobs
    return app


def _register_tasks(app: Celery, jobs: ThinkJobs) -> None:
    @app.task(  # type: ignore[untyped-decorator]
        name=DRAIN_TASK,
        ignore_result=True,
        shared=False,
        autoretry_for=(StorageUnavailableError,),
        retry_backoff=True,
        retry_backoff_max=30,
        max_retries=20,
    )
    def drain(agent_id: int) -> str:
        """Run the agent's next turn; while the database is down, back off and retry."""
        return worker.drain(jobs, agent_id)

    @app.task(name=SWEEP_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def sweep() -> int:
        return worker.sweep(jobs)


def _connect_lifecycle(app: Celery, jobs: ThinkJobs) -> None:
    """Prefork children drop inherited connections; a ``celery worker`` runs the sweeper."""
    running: list[worker.Sweeper] = []

    def on_process_init(**_: Any) -> None:
        jobs.after_fork()

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app and not running:
            running.append(worker.Sweeper(jobs).start())

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            while running:
                running.pop().stop()

    def on_logging_setup(logger: Any = None, **_: Any) -> None:
        if jobs.settings.log_json and logger is not None:
            logs.use_json(logger)

    signals.after_setup_logger.connect(on_logging_setup, weak=False)
    signals.after_setup_task_logger.connect(on_logging_setup, weak=False)
    signals.worker_process_init.connect(on_process_init, weak=False)
    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
