"""The Celery app: configuration that matches think-jobs' guarantees, and its lifecycle.

JSON only, results ignored, ``acks_late`` with ``reject_on_worker_lost`` so a killed worker's
message is redelivered; redelivery is harmless because the database lease decides. The tasks
are in ``think_jobs.worker.tasks``; a ``celery worker`` of this app also runs the sweeper and
its presence heartbeat.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

from think_jobs.engine.drain import Sweeper
from think_jobs.observe import logs
from think_jobs.transport import celery_redis
from think_jobs.worker import presence, tasks

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
        # A Redis refusing writes (maxmemory under noeviction, a replica left read-only by a
        # failover) answers with errors on a live connection: Celery's "channel errors",
        # unrecoverable by default — the worker exited. Reconnect as for a lost connection.
        broker_channel_error_retry=True,
        broker_transport=celery_redis.transport_for(settings.effective_broker_url),
        worker_consumer="think_jobs.worker.consumer:Consumer",  # reconnects within ~1 s
        broker_transport_options={
            **celery_redis.restore_options(settings.broker_visibility_timeout_s),
            "socket_connect_timeout": 2,
        },
        enable_utc=True,
        timezone="UTC",
        worker_send_task_events=settings.celery_task_events,  # Flower keeps working
        task_send_sent_event=False,  # a second publish per drain, for a "sent" state only
    )
    tasks.register(app, jobs)
    _connect_lifecycle(app, jobs)
    app.think_jobs = jobs
    return app


def close_connections(app: Celery) -> None:
    """Close the result backend's connections ``app`` opened in this process: its client's
    pool and the pub/sub ``AsyncResult.get()`` subscribes with (the calling thread's backend:
    Celery keeps one per thread). Anything that waits for a result again reconnects. Left
    open, they lived until the app was garbage collected (``ThinkJobs`` and app in one cycle),
    and whichever finalizer ran first closed the socket, sometimes the socket's own ("unclosed
    socket"). The broker's connection and producer pools are kombu's, shared by every app of
    the process with the same broker URL: they are not this app's to close."""
    backend = getattr(getattr(app, "_local", None), "backend", None)
    if backend is None:
        return
    consumer = getattr(backend, "result_consumer", None)
    if consumer is not None and hasattr(consumer, "stop"):
        consumer.stop()
    client = backend.__dict__.get("client")  # a cached property: made on first use
    if client is not None:
        client.connection_pool.disconnect()


def _connect_lifecycle(app: Celery, jobs: ThinkJobs) -> None:
    """Prefork children drop inherited connections; a ``celery worker`` sizes the stream pool
    from its concurrency and runs the sweeper and its presence heartbeat, and, told to stop,
    hands its running turns over after ``worker_handover_s`` (``engine.handover``); logging
    follows ``log_level``/``log_json`` (``observe.logs``)."""
    running: list[Sweeper | presence.Heartbeat] = []

    def on_process_init(**_: Any) -> None:
        jobs.after_fork()

    def on_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            _size_stream_pool(jobs, sender)

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app and not running:
            _size_stream_pool(jobs, sender.controller)  # concurrency "auto" is known by now
            running.append(Sweeper(jobs.services).start())
            running.append(presence.worker_heartbeat(jobs, sender.controller))

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            while running:
                running.pop().stop()

    _connect_logging(app, jobs)
    _connect_heap_freeze(app, jobs)
    _connect_handover(app, jobs)
    _connect(
        app,
        (signals.worker_process_init, on_process_init),
        (signals.worker_init, on_init),
        (signals.worker_ready, on_ready),
        (signals.worker_shutdown, on_shutdown),
    )


def _connect_handover(app: Celery, jobs: ThinkJobs) -> None:
    """A worker of this app, once ready, runs its turns to their end; told to stop (a warm
    shutdown: SIGTERM), it hands them over after ``worker_handover_s``. A worker embedded
    in a test (``think_jobs.testing``) is stopped without that signal."""
    ready: list[bool] = []

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            jobs.services.running.resume()
            ready.append(True)

    def on_shutting_down(how: str = "", **_: Any) -> None:
        if ready and how == "Warm":  # not a cold stop: that one ends the process now
            _hand_over_later(jobs)

    _connect(
        app,
        (signals.worker_ready, on_ready),
        (signals.worker_shutting_down, on_shutting_down),
    )


def _hand_over_later(jobs: ThinkJobs) -> None:
    """Once ``worker_handover_s`` has passed (unset: never), hand over the turns this process
    still runs. Called from the signal handler of a warm shutdown: it only starts a timer."""
    after_s = jobs.settings.worker_handover_s
    if after_s is None:
        return

    def hand_over() -> None:
        count = jobs.services.running.hand_over("its worker is stopping")
        log.warning(
            "worker stopping: handed over %d running turn(s) after %g s (worker_handover_s)",
            count,
            after_s,
        )

    timer = threading.Timer(after_s, hand_over)
    timer.daemon = True
    timer.name = "think-jobs-handover"
    timer.start()


def _connect(app: Celery, *handlers: tuple[Any, Callable[..., None]]) -> None:
    """Connect each handler to its signal for as long as ``app`` lives: the app keeps them and
    the signals hold them weakly, so a ``ThinkJobs`` dropped with its app goes with them (held
    strongly, every one a process ever built stayed alive — a test suite builds thousands —
    and a prefork child ran every one's ``after_fork``)."""
    kept: list[Callable[..., None]] = app.__dict__.setdefault("_think_jobs_handlers", [])
    for signal, handler in handlers:
        kept.append(handler)
        signal.connect(handler, weak=True)


def _size_stream_pool(jobs: ThinkJobs, controller: Any) -> None:
    """One stream connection per slot of the worker (``RedisClients.size_for_concurrency``)."""
    concurrency = getattr(controller, "concurrency", None)
    if isinstance(concurrency, int) and concurrency > 0:
        jobs.clients.size_for_concurrency(concurrency)


def _connect_heap_freeze(app: Celery, jobs: ThinkJobs) -> None:
    """A worker process started from the command line (Celery sends ``celeryd_after_setup``
    for ``think-jobs worker`` and ``celery worker``, not for an embedded worker, whose host
    keeps its garbage collector as it is) freezes what it holds once ready, and so does each
    prefork child as it starts (``worker_gc_freeze``).

    Every turn allocates thousands of objects, so CPython's collector runs often, and each of
    its full collections walked the whole start-up heap (Celery, kombu, SQLAlchemy, pydantic:
    ~150,000 objects) while every thread waited: ~90 ms each, a dozen times per 5,000 turns
    here. ``gc.freeze()`` moves that heap, after one last collection, out of the collector's
    scans for good (it is freed by reference counting as before, not by cycle collection);
    the full collections then take a few ms. In a prefork child it also keeps the collector
    from writing to the pages the child shares with its parent."""
    command_line: list[bool] = []

    def on_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is app and jobs.settings.worker_gc_freeze:
            command_line.append(True)

    def on_ready(sender: Any = None, **_: Any) -> None:
        if command_line and getattr(sender, "app", None) is app:
            _freeze_heap()

    def on_process_init(**_: Any) -> None:
        if command_line:  # a prefork child: the flag came with the fork
            _freeze_heap()

    _connect(
        app,
        (signals.celeryd_after_setup, on_setup),
        (signals.worker_ready, on_ready),
        (signals.worker_process_init, on_process_init),
    )


def _freeze_heap() -> None:
    gc.collect()
    gc.freeze()
    log.info("froze %d objects out of the garbage collector's scans", gc.get_freeze_count())


def _connect_logging(app: Celery, jobs: ThinkJobs) -> None:
    """This app's worker and beat, once Celery set up logging: ``-l`` (Celery's root level,
    from ``log_level`` by default) and ``log_json``. An embedded worker (``think_jobs.testing``)
    leaves the host's logging alone."""

    def on_started(sender: Any = None, instance: Any = None, **_: Any) -> None:
        owner = instance if instance is not None else sender
        if getattr(owner, "app", None) is app:
            logs.configure(jobs.settings, level=logging.getLogger().level)

    def on_task_logging_setup(logger: Any = None, **_: Any) -> None:
        if jobs.settings.log_json and logger is not None:
            logs.use_json(logger)

    _connect(
        app,
        (signals.celeryd_after_setup, on_started),
        (signals.beat_init, on_started),
        (signals.after_setup_task_logger, on_task_logging_setup),
    )
