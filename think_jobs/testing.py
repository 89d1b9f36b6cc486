"""Helpers for testing your own agents against real services.

``worker(jobs)`` runs a real Celery worker for ``jobs`` in background threads of this process,
consuming from the real broker; ``wait_until`` polls a condition with a deadline.

One in-process worker at a time: Celery keeps a worker's shutdown flag in process-wide state
(``celery.worker.state``) and kombu hands every worker of a process the same event loop, so two
workers in one process stop together and race on each other's sockets (seen: a worker thread
blocked for good in a pub/sub read). For a second worker, start a ``think-jobs worker``
subprocess.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from think_jobs.engine.drain import Sweeper
from think_jobs.worker import presence

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

_running = threading.Lock()  # held while this process runs a worker()


@contextmanager
def worker(
    jobs: ThinkJobs,
    *,
    concurrency: int = 2,
    pool: str = "threads",
    loglevel: str = "WARNING",
    shutdown_timeout_s: float = 30.0,
    sweeper: bool = True,
) -> Iterator[Any]:
    """A real Celery worker (``threads`` pool, ``concurrency`` slots) plus the sweeper and its
    presence record (``think-jobs workers`` lists it).

    Yields the Celery ``WorkController``. Leaving the block stops both and waits for running
    tasks (up to ``shutdown_timeout_s``).
    """
    if not _running.acquire(blocking=False):
        raise RuntimeError(
            "a worker() is already running in this process: Celery's shutdown flag and kombu's "
            "event loop are process-wide, so leave the first worker's block before starting "
            "another, or run the second as a `think-jobs worker` subprocess"
        )
    try:
        with _started(jobs, concurrency, pool, loglevel, shutdown_timeout_s, sweeper) as controller:
            yield controller
    finally:
        _running.release()


@contextmanager
def _started(
    jobs: ThinkJobs,
    concurrency: int,
    pool: str,
    loglevel: str,
    shutdown_timeout_s: float,
    sweeper: bool,
) -> Iterator[Any]:
    from celery.contrib.testing.worker import start_worker
    from kombu.asynchronous import set_event_loop

    jobs.celery.conf.worker_hijack_root_logger = False  # keep the test's log capture
    set_event_loop(None)  # a fresh loop: the last worker's may hold its closed sockets
    with start_worker(
        jobs.celery,
        concurrency=concurrency,
        pool=pool,
        loglevel=loglevel,
        perform_ping_check=False,
        shutdown_timeout=shutdown_timeout_s,
        queues=[jobs.settings.queue],
    ) as controller:
        background = Sweeper(jobs.services).start() if sweeper else None
        heartbeat = presence.worker_heartbeat(jobs, controller)  # as a real worker announces
        try:
            yield controller
        finally:
            heartbeat.stop()
            if background is not None:
                background.stop()
    _wait_for_running_tasks(controller)


def _wait_for_running_tasks(controller: Any) -> None:
    """Celery's test worker stops with a terminate, which leaves the threads pool's running
    tasks running: wait for them, so that nothing of this worker still uses ``jobs`` (its
    database connections) once the block is left."""
    executor = getattr(getattr(controller, "pool", None), "executor", None)
    if executor is not None:
        executor.shutdown(wait=True)


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float = 10.0,
    *,
    interval_s: float = 0.02,
    message: str | Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); TimeoutError otherwise.

    The error names the predicate and, if given, ``message`` (a string or a function called at
    timeout to describe the state, e.g. the submissions' statuses).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = message() if callable(message) else message
            name = getattr(predicate, "__name__", repr(predicate))
            suffix = f": {detail}" if detail else ""
            raise TimeoutError(f"{name} still false after {timeout_s:g} s{suffix}")
        time.sleep(interval_s)
