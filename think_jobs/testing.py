"""Helpers for testing your own agents against real services.

``worker(jobs)`` runs a real Celery worker for ``jobs`` in background threads of this process,
consuming from the real broker; ``wait_until`` polls a condition with a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from think_jobs.engine.drain import Sweeper
from think_jobs.worker import presence

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs


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
    from celery.contrib.testing.worker import start_worker

    jobs.celery.conf.worker_hijack_root_logger = False  # keep the test's log capture
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
