"""Celery beat that reads due occurrences from the database (``think-jobs beat``).

A static ``beat_schedule`` cannot work here: every agent has its own occurrences, agents come
and go while beat runs, and a restart must not forget what was due. So the schedule lives in
``think_schedules`` and this scheduler, every ``beat_tick_interval_s``:

1. claims the due rows: a conditional UPDATE moves each row's ``next_run_at`` from the
   occurrence it saw to the next one after now (whole intervals, so a beat that was down
   fires once, not once per missed interval). Only one of several beats can move a row from
   a given value, so each occurrence is claimed once; the same transaction keeps the
   occurrence in ``think_schedule_fires`` until a worker has fired it;
2. after the commit, sends ``think_jobs.fire_schedule`` per claim; a worker fires it. When
   the broker is down, the claims not sent are given back and the next tick tries again;
3. sends again the kept occurrences still unfired ``schedule_fire_timeout_s`` after their
   last send or their worker's last renewal of its hold (the message was lost: a beat killed
   before sending, a worker killed or stopped while firing, Redis restarted empty), and the
   next attempt of a failed one after its backoff.

"Now" is the database server's clock, read once per tick.

It also reconciles the stored schedules with the code (at start and every
``RECONCILE_INTERVAL_S``), sends ``think_jobs.sweep`` every ``sweep_interval_s``, and still
runs any entries of the app's ``beat_schedule``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final

from celery.beat import Scheduler
from sqlalchemy import Connection

from think_jobs.db import schedules as schedule_ops
from think_jobs.db.dialect import server_now
from think_jobs.db.schedules import StoredSchedule
from think_jobs.engine import schedules
from think_jobs.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    ScheduleError,
    ThinkJobsError,
)
from think_jobs.scheduling import Schedule, next_occurrence, parse_schedule
from think_jobs.transport.dispatch import SWEEP_TASK
from think_jobs.worker import presence

if TYPE_CHECKING:
    from celery import Celery

    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)

CLAIM_BATCH: Final = 500
RECONCILE_INTERVAL_S: Final = 60.0
_SEND_RETRY_POLICY: Final = {
    "max_retries": 1,
    "interval_start": 0.1,
    "interval_step": 0.2,
    "interval_max": 0.2,
}


@dataclass(frozen=True)
class Claim:
    """One occurrence this beat took: fire ``task_id`` of the agent for ``due_at``."""

    schedule_id: int
    agent_id: int
    address: str
    task_id: str
    due_at: datetime
    next_run_at: datetime | None  # None: a kept occurrence sent again
    attempt: int = 1


def fire_due(jobs: ThinkJobs, *, now: datetime | None = None, limit: int = CLAIM_BATCH) -> int:
    """Claim up to ``limit`` due occurrences and send their fires; returns how many were sent
    (when the broker is down, the claims not sent are given back), then those kept
    occurrences due to be sent again (``send_overdue``). ``now``: the database's clock."""
    if now is None:
        with jobs.db.read() as conn:
            now = server_now(conn)
    claims = claim_due(jobs, now=now, limit=limit)
    for index, claim in enumerate(claims):
        if not send_fire(jobs, claim):  # do not wait on a dead broker once per claim
            give_back(jobs, claims[index:])
            return index
    return len(claims) + send_overdue(jobs, now=now, limit=limit)


def send_overdue(jobs: ThinkJobs, *, now: datetime | None = None, limit: int = CLAIM_BATCH) -> int:
    """Send again the kept occurrences whose ``resend_at`` has passed, each taken by one beat
    (moved ``schedule_fire_timeout_s`` on); returns how many were sent. Nothing is sent while
    no live worker consumes the queue: a message sent then would only wait (or be lost) with
    the others, one more per occurrence every timeout for as long as the workers are down."""
    with jobs.db.read() as conn:
        now = now or server_now(conn)
        overdue = schedule_ops.overdue_fires(conn, jobs.agent_types, now=now, limit=limit)
    if not overdue or not _consumed(jobs):
        return 0
    resend_at = now + timedelta(seconds=jobs.settings.schedule_fire_timeout_s)
    with jobs.db.write() as conn:
        taken = [f for f in overdue if schedule_ops.postpone_fire(conn, f, resend_at=resend_at)]
    for index, fire in enumerate(taken):
        claim = Claim(
            *(fire.schedule_id, fire.agent_id, fire.address, fire.task_id, fire.due_at),
            next_run_at=None,
            attempt=fire.attempt,
        )
        if not send_fire(jobs, claim):  # due again at the next tick
            with jobs.db.write() as conn:
                for unsent in taken[index:]:
                    moved = replace(unsent, resend_at=resend_at)
                    schedule_ops.postpone_fire(conn, moved, resend_at=unsent.resend_at)
            return index
    return len(taken)


def claim_due(
    jobs: ThinkJobs, *, now: datetime | None = None, limit: int = CLAIM_BATCH
) -> list[Claim]:
    """Take the occurrences due by ``now`` (None: the database server's clock, so a beat
    whose own clock is off fires neither early nor late) that no other beat took, arming each
    row's next one.

    The look is a read (an idle tick takes no write lock); rows due at the same instant with
    the same schedule are claimed by one conditional UPDATE, so 10,000 agents with a daily
    report at 09:00 cost a few statements, not 10,000.
    """
    with jobs.db.read() as conn:
        now = now or server_now(conn)
        rows = schedule_ops.due(conn, jobs.agent_types, now=now, limit=limit)
    if not rows:
        return []
    groups: dict[tuple[str, str | None, datetime], list[StoredSchedule]] = {}
    for row in rows:
        groups.setdefault((row.schedule, row.timezone, row.next_run_at), []).append(row)
    resend_at = now + timedelta(seconds=jobs.settings.schedule_fire_timeout_s)
    with jobs.db.write() as conn:
        return [
            claim
            for group in groups.values()
            for claim in _claim_group(conn, group, now, resend_at=resend_at)
        ]


def send_fire(jobs: ThinkJobs, claim: Claim) -> bool:
    """Ask a worker to fire ``claim``; False (logged) if the broker cannot be reached."""
    try:
        jobs.celery.send_task(
            schedules.FIRE_TASK,
            args=[claim.agent_id, claim.task_id, claim.due_at.isoformat()],
            kwargs={"attempt": claim.attempt},
            queue=jobs.settings.queue,
            ignore_result=True,
            retry=True,
            retry_policy=_SEND_RETRY_POLICY,
        )
    except Exception as error:  # kombu raises several unrelated types when the broker is down
        log.warning("could not send %s of %s (next tick retries): %s", *_named(claim), error)
        return False
    if claim.next_run_at is None:
        log.warning(
            "think-jobs beat: sent again %s of %s for %s (attempt %d; not fired yet)",
            *(*_named(claim), claim.due_at.isoformat(), claim.attempt),
        )
    else:
        log.info("think-jobs beat: fired %s of %s for %s", *_named(claim), claim.due_at.isoformat())
    return True


def _consumed(jobs: ThinkJobs) -> bool:
    """Whether a live worker (its presence record) consumes the queue fires are sent to."""
    try:
        live = jobs.live_workers()
    except BrokerUnavailableError:
        return False  # a send would fail as well; the next tick looks again
    queue = jobs.settings.queue
    return any(record.role == "worker" and queue in record.queues for record in live)


def give_back(jobs: ThinkJobs, claims: list[Claim]) -> None:
    """Make unsent claims due again (unless their row moved since), for the next tick."""
    with jobs.db.write() as conn:
        for claim in claims:
            assert claim.next_run_at is not None  # a claim, not a kept occurrence sent again
            schedule_ops.forget_fires(conn, claim.schedule_id, claim.due_at)
            schedule_ops.unclaim(
                conn, claim.schedule_id, due_at=claim.due_at, next_run_at=claim.next_run_at
            )


def _claim_group(
    conn: Connection, rows: list[StoredSchedule], now: datetime, *, resend_at: datetime
) -> list[Claim]:
    """Claim rows that share a schedule and a due instant (so their next run is the same),
    keeping each occurrence taken until it is fired."""
    first = rows[0]
    try:
        schedule = _parsed(first.schedule, first.timezone)
    except ScheduleError as error:
        log.error("stored schedule %r cannot be used: %s", first.schedule, error)
        return []
    following = next_occurrence(schedule, now=now, previous=first.next_run_at)
    taken = schedule_ops.claim(
        conn, [row.id for row in rows], due_at=first.next_run_at, next_run_at=following, now=now
    )
    schedule_ops.record_fires(conn, taken, due_at=first.next_run_at, resend_at=resend_at)
    return [_claim_of(row, following) for row in rows if row.id in taken]


def _claim_of(row: StoredSchedule, following: datetime) -> Claim:
    return Claim(row.id, row.agent_id, row.address, row.task_id, row.next_run_at, following)


@lru_cache(maxsize=4096)
def _parsed(schedule: str, timezone: str | None) -> Schedule:
    return parse_schedule(schedule, timezone=timezone)


def _named(claim: Claim) -> tuple[str, str]:
    return claim.task_id, claim.address


def jobs_of(app: Celery) -> ThinkJobs:
    """The ThinkJobs object whose Celery app this is (``jobs.celery``)."""
    found: ThinkJobs | None = getattr(app, "think_jobs", None)
    if found is None:
        raise ConfigurationError(
            "the think-jobs beat scheduler needs the Celery app of a ThinkJobs object "
            "(run `think-jobs beat --app module:jobs`)"
        )
    return found


class DatabaseScheduler(Scheduler):  # type: ignore[misc]
    """A ``celery.beat.Scheduler`` whose agent schedules live in ``think_schedules``."""

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        self.jobs = jobs_of(app)
        self._tick_s = self.jobs.settings.beat_tick_interval_s
        self._next_pass = 0.0
        self._next_reconcile = 0.0
        self._heartbeat: presence.Heartbeat | None = None
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        """The app's own ``beat_schedule`` plus the recovery sweep; no result-cleanup entry
        (think-jobs keeps no Celery results)."""
        settings = self.jobs.settings
        entries = dict(self.app.conf.beat_schedule or {})
        entries.setdefault(
            SWEEP_TASK,
            {
                "task": SWEEP_TASK,
                "schedule": timedelta(seconds=settings.sweep_interval_s),
                "options": {"queue": settings.queue},
            },
        )
        self.merge_inplace(entries)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One database pass when due, then Celery's own entries; returns the sleep."""
        if self._heartbeat is None:  # here, not in __init__: only a running beat announces itself
            self._heartbeat = presence.beat_heartbeat(self.jobs)
        if time.monotonic() >= self._next_pass:
            more = self._database_pass()
            self._next_pass = time.monotonic() + (0.0 if more else self._tick_s)
        delay = float(super().tick(*args, **kwargs))
        return max(0.0, min(delay, self._next_pass - time.monotonic()))

    def close(self) -> None:
        """Celery calls this when beat stops: the presence record goes with it."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        super().close()

    @property
    def info(self) -> str:
        url = self.jobs.db.engine.url.render_as_string(hide_password=True)
        return f"    . database -> {url}\n    . tick -> {self._tick_s:g} s"

    def _database_pass(self) -> bool:
        """Reconcile when due, claim and send; True when a full batch suggests more is due."""
        try:
            self._maybe_reconcile()
            return fire_due(self.jobs) >= CLAIM_BATCH
        except ThinkJobsError as error:
            log.warning("think-jobs beat: database pass failed (next tick retries): %s", error)
        except Exception:
            log.exception("think-jobs beat: database pass failed (next tick retries)")
        return False

    def _maybe_reconcile(self) -> None:
        """At start (always logged) and then every ``RECONCILE_INTERVAL_S`` (logged when it
        changed something)."""
        if time.monotonic() < self._next_reconcile:
            return
        first = self._next_reconcile == 0.0
        report = schedules.reconcile(self.jobs.services)
        self._next_reconcile = time.monotonic() + RECONCILE_INTERVAL_S
        log.log(
            logging.INFO if first or report != schedules.ReconcileReport() else logging.DEBUG,
            "think-jobs beat: schedules reconciled (%d armed, %d re-armed, %d removed)",
            *(report.armed, report.rearmed, report.removed),
        )
