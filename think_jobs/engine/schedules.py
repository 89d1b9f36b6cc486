"""Scheduled tasks of agents (SPEC §8): arming, reconciling with the code, firing, run now.

The code says which tasks an agent class has; ``think_schedules`` says when each agent's
tasks fire next. Three moments keep the two in step:

* ``arm_agent``: an agent that comes into existence gets a row per task (missing rows only,
  so two processes creating the same agent at once are harmless);
* ``reconcile``: beat compares each registered class's tasks with the stored rows at start
  and now and then: a new task is armed for every agent of the class, a removed one is
  deleted, one whose phrase or zone changed is re-armed from now. Tasks are read from one
  instance per class, as ``jobs.register`` validates them: they must not depend on the name;
* ``fire``: beat claims a due occurrence (see ``think_jobs.worker.beat``) and a worker fires it. A
  prompt becomes an idempotent submission keyed by the occurrence, so a second beat or a
  redelivered message adds nothing; a handler runs with a ``ScheduleContext`` and is retried
  with exponential backoff up to ``max_attempts``. The next occurrence was armed when the
  occurrence was claimed, so a failure never stops a schedule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from think_jobs import validation
from think_jobs.db import schedules as schedule_ops
from think_jobs.db.dialect import server_now
from think_jobs.db.schedules import ScheduleSpec
from think_jobs.engine import fire_holds, submissions
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.errors import AgentNotRegisteredError, InvalidInputError, ScheduleError
from think_jobs.limits import Limits
from think_jobs.messages import user_text_message
from think_jobs.observe import metrics
from think_jobs.results import SubmitMessagesResult
from think_jobs.scheduled_task import (
    ScheduleContext,
    ScheduledTask,
    occurrence_key,
    validate_scheduled_tasks,
)
from think_jobs.scheduling import Schedule, WallClockSchedule, next_occurrence

log = logging.getLogger(__name__)

FIRE_TASK: Final = "think_jobs.fire_schedule"
MAX_RETRY_BACKOFF_S: Final = 300.0
_PROBE_NAME: Final = "__registration__"


@dataclass(frozen=True)
class CodeTask:
    """A task as the code declares it, with its parsed schedule."""

    task: ScheduledTask
    schedule: Schedule

    @property
    def timezone(self) -> str | None:
        """The zone its wall-clock times are read in (None for intervals)."""
        return self.schedule.timezone if isinstance(self.schedule, WallClockSchedule) else None

    def spec(self, task_id: str, *, now: datetime) -> ScheduleSpec:
        first = next_occurrence(self.schedule, now=now)
        return ScheduleSpec(task_id, self.task.schedule, self.timezone, first)


@dataclass(frozen=True)
class ReconcileReport:
    """How many rows ``reconcile`` armed, re-armed and removed."""

    armed: int = 0
    rearmed: int = 0
    removed: int = 0

    def __add__(self, other: ReconcileReport) -> ReconcileReport:
        return ReconcileReport(
            self.armed + other.armed, self.rearmed + other.rearmed, self.removed + other.removed
        )


class FireOutcome(StrEnum):
    """What firing one occurrence did."""

    HANDLED = "handled"  # a handler task ran
    SUBMITTED = "submitted"  # a prompt task's submission was admitted
    DUPLICATE = "duplicate"  # this occurrence was submitted before (its idempotency key)
    REMOVED = "removed"  # the agent no longer declares the task
    UNKNOWN_AGENT = "unknown-agent"
    UNREGISTERED = "unregistered"  # this worker does not serve the agent's type
    FAILED = "failed"  # the action failed on its last attempt
    RETRYING = "retrying"  # the action failed; beat sends the next attempt after a backoff
    FIRED_ALREADY = "fired-already"  # sent again, but fired meanwhile (or its task removed)
    HELD = "held"  # sent again while another worker fires it (or for an earlier attempt)


@dataclass(frozen=True)
class Fired:
    """The outcome of one fire, and the submission it made or found (prompt tasks)."""

    outcome: FireOutcome
    submission_id: str | None = None

    def __str__(self) -> str:
        suffix = f" {self.submission_id}" if self.submission_id else ""
        return f"{self.outcome}{suffix}"


class RetryFire(Exception):
    """A fire failed and has attempts left; retry it after ``countdown_s``."""

    def __init__(self, countdown_s: float) -> None:
        super().__init__(f"retry in {countdown_s:g} s")
        self.countdown_s = countdown_s


def code_tasks(agent: AgentHooks) -> dict[str, CodeTask]:
    """The agent's declared tasks, validated (raises ``ScheduleError``)."""
    tasks = agent.get_scheduled_tasks()
    parsed = validate_scheduled_tasks(
        tasks, default_timezone=agent.get_default_timezone(), owner=agent.agent_type
    )
    return {task_id: CodeTask(tasks[task_id], schedule) for task_id, schedule in parsed.items()}


# -- arming ------------------------------------------------------------------------------------
# Occurrences are computed from, and compared with, the database server's clock (PostgreSQL;
# SQLite: the machine's), so a beat or a worker whose clock is off neither fires early nor late.


def database_clock(services: Services) -> datetime:
    """The database server's clock now (``db.dialect.server_now``)."""
    with services.db.read() as conn:
        return server_now(conn)


def arm_agent(services: Services, agent: AgentHooks, agent_id: int) -> None:
    """Called once per process when an agent is first written to (or started)."""
    declared = code_tasks(agent)
    if not declared:
        return
    with services.db.write() as conn:
        now = server_now(conn)
        specs = [code.spec(task_id, now=now) for task_id, code in declared.items()]
        schedule_ops.insert_missing(conn, agent_id, specs, now=now)


def reconcile(services: Services, *, now: datetime | None = None) -> ReconcileReport:
    """Bring every stored schedule of every registered class in line with the code. A class
    whose ``get_scheduled_tasks()`` fails now (raises: a flag service down, say; or returns
    what is not a valid task) is logged and its stored schedules left as they are — they
    keep firing — while every other class is reconciled (one such class stopped every
    schedule of the beat, each pass failing on it)."""
    now = now or database_clock(services)
    report = ReconcileReport()
    for agent_type in services.agents.agent_types:
        declared = _declared(services, agent_type, now)
        if declared is not None:
            report += _reconcile_type(services, agent_type, declared, now)
    return report


def _declared(
    services: Services, agent_type: str, now: datetime
) -> tuple[Collection[str], list[ScheduleSpec]] | None:
    """The class's task ids and their schedules as its code declares them now (None: its
    ``get_scheduled_tasks()`` failed, logged)."""
    try:
        declared = code_tasks(services.agents.instantiate(agent_type, _PROBE_NAME))
        return declared.keys(), [code.spec(task_id, now=now) for task_id, code in declared.items()]
    except Exception:
        log.exception(
            "schedules of %s not reconciled: its get_scheduled_tasks() failed (its stored "
            "schedules stay as they are; the next reconcile tries again)", agent_type,
        )  # fmt: skip
        return None


def _reconcile_type(
    services: Services,
    agent_type: str,
    declared: tuple[Collection[str], list[ScheduleSpec]],
    now: datetime,
) -> ReconcileReport:
    task_ids, specs = declared
    armed = rearmed = 0
    with services.db.write() as conn:
        removed = schedule_ops.delete_removed(conn, agent_type, task_ids)
        for spec in specs:
            rearmed += schedule_ops.rearm_changed(conn, agent_type, spec, now=now)
            armed += schedule_ops.arm_missing_for_type(conn, agent_type, spec, now=now)
    return ReconcileReport(armed, rearmed, removed)


# -- firing ------------------------------------------------------------------------------------


def fire(
    services: Services,
    agent_id: int,
    task_id: str,
    scheduled_for: datetime,
    *,
    attempt: int = 1,
    kept: bool = False,
) -> Fired:
    """Fire one claimed occurrence on a worker; returns what happened (for logs and tests).

    ``kept``: beat keeps the occurrence in ``think_schedule_fires`` until it is fired (every
    beat since that table): this worker fires it only if it takes it (one worker at a time,
    ``engine.fire_holds``), holds it while it fires, and then forgets it; a failure with
    attempts left has beat send the next attempt after the backoff (``RETRYING``). Otherwise
    (a message of an older beat) ``RetryFire`` is raised for Celery to retry.
    """
    if kept:
        return _fire_kept(services, agent_id, task_id, scheduled_for, attempt=attempt)
    return _fire(services, agent_id, task_id, scheduled_for, attempt=attempt)


def _fire_kept(
    services: Services, agent_id: int, task_id: str, scheduled_for: datetime, *, attempt: int
) -> Fired:
    hold = fire_holds.take(services, agent_id, task_id, scheduled_for, attempt=attempt)
    if hold is None:
        held = fire_holds.is_kept(services, agent_id, task_id, scheduled_for)
        return Fired(FireOutcome.HELD if held else FireOutcome.FIRED_ALREADY)
    try:
        with fire_holds.holding(services, hold):
            fired = _fire(services, agent_id, task_id, scheduled_for, attempt=attempt)
    except RetryFire as retry:
        fire_holds.retry(services, hold, attempt=attempt + 1, in_s=retry.countdown_s)
        return Fired(FireOutcome.RETRYING)
    if _for_another_worker(services, fired, agent_id, task_id):
        fire_holds.release(services, hold)
    else:
        fire_holds.forget(services, hold)
    return fired


def _for_another_worker(services: Services, fired: Fired, agent_id: int, task_id: str) -> bool:
    """Whether this worker should give the occurrence back rather than end it: it does not
    serve the agent's type, or its code lacks a task beat still schedules — a worker still
    on the code before a deploy that added or renamed the task (beat, started first, keeps
    the schedule; a task really removed loses its schedule, and its kept occurrences, at
    beat's next reconcile). Forgotten there, the occurrence never fired."""
    if fired.outcome is FireOutcome.UNREGISTERED:
        return True
    if fired.outcome is not FireOutcome.REMOVED:
        return False
    with services.db.read() as conn:
        return schedule_ops.get(conn, agent_id, task_id) is not None


def _fire(
    services: Services, agent_id: int, task_id: str, scheduled_for: datetime, *, attempt: int
) -> Fired:
    """Raises ``RetryFire`` when the action failed and attempts are left."""
    target = _target(services, agent_id, task_id)
    if isinstance(target, Fired):
        return target
    agent, code = target
    ctx = context_for(agent, task_id, code, _to_ms(scheduled_for), attempt=attempt)
    try:
        result = _act(services, agent, code, ctx)
    except Exception as error:
        return _failed(services, agent, ctx, code.task.max_attempts, error)
    outcome = Fired(FireOutcome.HANDLED) if result is None else _described(result)
    kind = "handler" if result is None else "prompt"
    metrics.SCHEDULED_FIRES.labels(agent.agent_type, kind).inc()
    log.info("scheduled task %s of %s (%s): %s", task_id, agent.address, ctx.scheduled_for, outcome)
    return outcome


def run_now(
    services: Services, agent: AgentHooks, task_id: str, *, scheduled_for: datetime | None
) -> SubmitMessagesResult | None:
    """Fire ``task_id`` in this process. A prompt returns its submission; a handler runs here.
    Either is retried as beat's fire would be, and the last exception is raised to the caller.
    ``scheduled_for=None`` means now (a fresh occurrence); a given instant shares its
    idempotency key with beat's fire of it."""
    code = code_tasks(agent).get(task_id)
    if code is None:
        declared = ", ".join(sorted(code_tasks(agent))) or "none"
        raise ScheduleError(
            f'{agent.agent_type} has no scheduled task "{task_id}" (declared: {declared})'
        )
    when = _to_ms(scheduled_for if scheduled_for is not None else database_clock(services))
    return _act_with_retries(services, agent, task_id, code, when)


def _act_with_retries(
    services: Services, agent: AgentHooks, task_id: str, code: CodeTask, when: datetime
) -> SubmitMessagesResult | None:
    """Beat's retry policy, in this process: up to ``max_attempts`` with the same backoff,
    then the last error is raised (one occurrence, one policy, however it was fired)."""
    max_attempts = code.task.max_attempts
    for attempt in range(1, max_attempts):
        ctx = context_for(agent, task_id, code, when, attempt=attempt)
        try:
            return _act(services, agent, code, ctx)
        except Exception as error:
            wait_s = retry_backoff_s(services, attempt)
            log.warning(
                "scheduled task %s of %s failed (attempt %d/%d), retrying in %g s: %r",
                *(task_id, agent.address, attempt, max_attempts, wait_s, error),
            )
            time.sleep(wait_s)
    final = context_for(agent, task_id, code, when, attempt=max_attempts)
    return _act(services, agent, code, final)


def next_runs(services: Services, agent: AgentHooks) -> dict[str, datetime]:
    """Each declared task's next run: the armed one, or the one arming would give now."""
    declared = code_tasks(agent)
    if not declared:
        return {}
    agent_id = services.agents.agent_id_of(agent, create=False)
    stored: dict[str, datetime] = {}
    with services.db.read() as conn:
        now = server_now(conn)
        if agent_id is not None:
            stored = {s.task_id: s.next_run_at for s in schedule_ops.for_agent(conn, agent_id)}
    return {
        task_id: stored.get(task_id) or next_occurrence(code.schedule, now=now)
        for task_id, code in declared.items()
    }


def context_for(
    agent: AgentHooks, task_id: str, code: CodeTask, scheduled_for: datetime, *, attempt: int
) -> ScheduleContext:
    key = occurrence_key(agent.agent_type, agent.name, task_id, scheduled_for)
    return ScheduleContext(
        task_id=task_id,
        scheduled_for=scheduled_for,
        occurrence_key=key,
        idempotency_key=key,
        schedule=code.task.schedule,
        timezone=code.timezone,
        metadata=dict(code.task.metadata or {}),
        attempt=attempt,
    )


def fire_metadata(ctx: ScheduleContext) -> dict[str, Any]:
    """The submission metadata of a prompt fire: the task's, then the reserved keys of §8."""
    reserved = {
        "source": "scheduled-task",
        "task_id": ctx.task_id,
        "scheduled_for": ctx.scheduled_for.isoformat(),
        "schedule": ctx.schedule,
    }
    return {**ctx.metadata, **reserved}


def check_fire_metadata(tasks: Mapping[str, ScheduledTask], *, owner: str, limits: Limits) -> None:
    """Refuse (``ScheduleError``) a prompt task whose fires' metadata could not be admitted
    (too large or deep for ``limits``, NaN): checked when the class is registered, so it
    fails at start-up instead of at every fire."""
    for task_id, task in tasks.items():
        if task.handler is not None or not task.metadata:
            continue
        sample = ScheduleContext(
            task_id=task_id,
            scheduled_for=datetime(9999, 12, 31, tzinfo=UTC),
            occurrence_key="",
            idempotency_key="",
            schedule=task.schedule,
            timezone=task.timezone,
            metadata=dict(task.metadata),
        )
        try:
            validation.json_object(fire_metadata(sample), "its metadata", limits=limits)
        except InvalidInputError as error:
            raise ScheduleError(f"{owner}.{task_id}: {error}") from None


def retry_backoff_s(services: Services, attempt: int) -> float:
    """Wait before attempt ``attempt + 1``: ``schedule_retry_backoff_s``, doubled per attempt,
    capped."""
    base = services.settings.schedule_retry_backoff_s
    return float(min(base * 2 ** (attempt - 1), MAX_RETRY_BACKOFF_S))


def _act(
    services: Services, agent: AgentHooks, code: CodeTask, ctx: ScheduleContext
) -> SubmitMessagesResult | None:
    task = code.task
    if task.handler is not None:
        task.handler(agent, ctx)  # the agent itself: a Think
        return None
    text = task.prompt(ctx) if callable(task.prompt) else task.prompt
    if not isinstance(text, str):
        raise ScheduleError(f"the prompt function of {ctx.task_id} returned {text!r}, not a str")
    submission = submissions.validated(
        services,
        [user_text_message(text)],
        submission_id=None,
        idempotency_key=ctx.idempotency_key,
        metadata=fire_metadata(ctx),
        trigger="schedule",
    )
    return submissions.submit(services, agent, submission)


def _described(result: SubmitMessagesResult) -> Fired:
    outcome = FireOutcome.SUBMITTED if result.accepted else FireOutcome.DUPLICATE
    return Fired(outcome, result.submission_id)


def _target(services: Services, agent_id: int, task_id: str) -> tuple[AgentHooks, CodeTask] | Fired:
    identity = services.agents.identity_of(agent_id)
    if identity is None:
        return Fired(FireOutcome.UNKNOWN_AGENT)
    try:
        agent = services.agents.instantiate(*identity)
    except AgentNotRegisteredError:
        log.error("agent type %s is not registered in this worker; not firing", identity[0])
        return Fired(FireOutcome.UNREGISTERED)
    code = code_tasks(agent).get(task_id)
    if code is None:
        log.info("%s no longer declares scheduled task %s; not firing", agent.address, task_id)
        return Fired(FireOutcome.REMOVED)
    return agent, code


def _failed(
    services: Services, agent: AgentHooks, ctx: ScheduleContext, max_attempts: int, error: Exception
) -> Fired:
    where = f"scheduled task {ctx.task_id} of {agent.address} ({ctx.occurrence_key})"
    if ctx.attempt < max_attempts:
        countdown_s = retry_backoff_s(services, ctx.attempt)
        log.warning(
            "%s failed (attempt %d/%d), retrying in %g s: %r",
            *(where, ctx.attempt, max_attempts, countdown_s, error),
        )
        raise RetryFire(countdown_s) from error
    log.error("%s failed after %d attempts", where, ctx.attempt, exc_info=error)
    return Fired(FireOutcome.FAILED)


def _to_ms(moment: datetime) -> datetime:
    """Occurrence keys count milliseconds: drop what they cannot tell apart."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ScheduleError(f"scheduled_for must be timezone-aware, got {moment.isoformat()}")
    utc = moment.astimezone(UTC)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)
