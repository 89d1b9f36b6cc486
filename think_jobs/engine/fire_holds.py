"""One worker at a time fires a kept occurrence: it takes it, holds it while it fires, and
writes its outcome only while it still holds it.

Beat sends a kept occurrence again once its ``resend_at`` has passed (``worker.beat``). A
worker that takes one moves ``resend_at`` ``schedule_fire_timeout_s`` ahead and, while its
handler runs, a thread here moves it on every third of that, so a handler that runs for an
hour is not sent again meanwhile; a second message of the same occurrence (a late one, or
one beat sent before the hold began) finds it held and does nothing. A worker that dies or
stops (SIGKILL, SIGSTOP, cut from the database) stops holding it: beat sends it again when
the hold lapses, clearing the holder, and another worker takes it. The first holder, if it
comes back, can no longer forget the occurrence or schedule its retry (both name its token),
though a handler already running cannot be stopped: hence the occurrence key in the
``ScheduleContext``, for handlers whose effects must happen once.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from think_jobs.db import schedules as schedule_ops
from think_jobs.engine.ports import Services

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hold:
    """A kept occurrence taken by this worker: ``token`` names it as its holder."""

    agent_id: int
    task_id: str
    due_at: datetime
    token: str

    @property
    def where(self) -> tuple[int, str, datetime]:
        return self.agent_id, self.task_id, self.due_at


def take(
    services: Services, agent_id: int, task_id: str, due_at: datetime, *, attempt: int
) -> Hold | None:
    """Take the occurrence to fire it as ``attempt``; None when another worker holds it, it is
    kept for another attempt, or it is no longer kept."""
    token = str(uuid.uuid4())
    hold_s = services.settings.schedule_fire_timeout_s
    with services.db.write() as conn:
        taken = schedule_ops.take_fire(
            conn, agent_id, task_id, due_at, attempt=attempt, token=token, hold_s=hold_s
        )
    return Hold(agent_id, task_id, due_at, token) if taken else None


def is_kept(services: Services, agent_id: int, task_id: str, due_at: datetime) -> bool:
    with services.db.read() as conn:
        return schedule_ops.is_kept(conn, agent_id, task_id, due_at)


@contextmanager
def holding(services: Services, hold: Hold) -> Iterator[None]:
    """Hold the occurrence for as long as the block runs."""
    stop = threading.Event()
    thread = threading.Thread(
        target=_renew, args=(services, hold, stop), name="think-jobs-fire-hold", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)  # a renewal stuck on the database ends on its own


def _renew(services: Services, hold: Hold, stop: threading.Event) -> None:
    hold_s = services.settings.schedule_fire_timeout_s
    while not stop.wait(hold_s / 3):
        try:
            with services.db.write() as conn:
                held = schedule_ops.hold_fire(conn, *hold.where, token=hold.token, hold_s=hold_s)
        except Exception as error:  # the database is away: the next renewal tries again
            log.warning("could not hold scheduled task %s: %s", hold.task_id, error)
            continue
        if not held and not stop.is_set():
            _warn_lost(hold, "another worker may fire it")
            return


def retry(services: Services, hold: Hold, *, attempt: int, in_s: float) -> None:
    """Have beat send ``attempt`` after ``in_s`` (nothing, logged, if the hold was lost)."""
    with services.db.write() as conn:
        kept = schedule_ops.retry_fire(
            conn, *hold.where, token=hold.token, attempt=attempt, in_s=in_s
        )
    if not kept:
        _warn_lost(hold, "its retry is left to the worker that fires it now")


def forget(services: Services, hold: Hold) -> None:
    """The occurrence has its outcome (nothing, logged, if the hold was lost meanwhile)."""
    with services.db.write() as conn:
        forgotten = schedule_ops.forget_fire(conn, *hold.where, token=hold.token)
    if not forgotten:
        _warn_lost(hold, "the worker that fires it now forgets it")


def _warn_lost(hold: Hold, what_next: str) -> None:
    log.warning(
        "scheduled task %s of agent row %s (%s) lost its hold (not renewed within "
        "schedule_fire_timeout_s): beat sent it again; %s",
        *(hold.task_id, hold.agent_id, hold.due_at, what_next),
    )


def release(services: Services, hold: Hold) -> None:
    """Give the occurrence back untouched (a worker that does not serve its agent type)."""
    with services.db.write() as conn:
        schedule_ops.release_fire(conn, *hold.where, token=hold.token)
