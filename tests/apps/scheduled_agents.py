"""Agent classes with scheduled tasks, for the schedule tests. Beat and worker subprocesses
import ``jobs`` from here (``--app tests.apps.scheduled_agents:jobs``); settings come from
THINK_JOBS_* env. The tests' clock is the data: ``make_due`` moves a task's next run into the
past, and beat fires it on its next tick.

Tests "change the code" with environment variables read whenever tasks are asked for:
``TJ_TEST_DIGEST_SCHEDULE`` is the phrase of ``Reporter.digest``, ``TJ_TEST_EXTRA_TASK=1``
adds ``Reporter.weekly`` and ``TJ_TEST_DROP_NUDGE=1`` removes ``Reporter.nudge``.
Handlers record each attempt in a Redis list, so a test sees what ran in any process.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from typing import Any

from think_jobs import ScheduleContext, ScheduledTask, SubmissionInspection, Think, ThinkJobs
from think_jobs.context import utcnow
from think_jobs.db import schedules as schedule_ops
from think_jobs.db.schedules import StoredSchedule
from think_jobs.models import EchoModel
from think_jobs.scheduling import next_occurrence, parse_schedule

DIGEST_PROMPT = "Write the daily digest"


def events_key(jobs: ThinkJobs) -> str:
    return f"{jobs.keys.prefix}:schedule-events"


def record(jobs: ThinkJobs, **event: Any) -> None:
    jobs.redis.rpush(events_key(jobs), json.dumps(event))


def read_events(jobs: ThinkJobs) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in jobs.redis.lrange(events_key(jobs), 0, -1)]


def agent_id(agent: Think) -> int:
    found = agent.jobs.agent_id_of(agent, create=False)
    assert found is not None
    return found


def stored(agent: Think) -> dict[str, StoredSchedule]:
    """The agent's schedule rows by task id."""
    with agent.jobs.db.read() as conn:
        return {row.task_id: row for row in schedule_ops.for_agent(conn, agent_id(agent))}


def make_due(
    agent: Think, task_id: str, *, hours_back: int = 0, at: datetime | None = None
) -> datetime:
    """Move the task's next run to ``at`` or to a past occurrence on its own grid (about eight
    days ago, ``hours_back`` more for a different one); returns it."""
    row = stored(agent)[task_id]
    schedule = parse_schedule(row.schedule, timezone=row.timezone)
    due = at or next_occurrence(schedule, now=utcnow() - timedelta(days=8, hours=hours_back))
    with agent.jobs.db.write() as conn:
        assert schedule_ops.move_next_run(conn, agent_id(agent), task_id, due)
    return due


def submission_for(agent: Think, key: str) -> SubmissionInspection | None:
    """The agent's submission with idempotency key ``key`` (a fire's), if any (of its
    newest 100)."""
    return next((s for s in agent.list_submissions(limit=100) if s.idempotency_key == key), None)


def nudge_prompt(ctx: ScheduleContext) -> str:
    return f"Nudge for {ctx.scheduled_for.isoformat()} in {ctx.timezone} ({ctx.occurrence_key})"


def flaky_handler(agent: Think, ctx: ScheduleContext) -> None:
    """Records the attempt, then fails while ``attempt <= metadata["fail_until"]``."""
    record(
        agent.jobs,
        agent=agent.name,
        task_id=ctx.task_id,
        attempt=ctx.attempt,
        key=ctx.occurrence_key,
        scheduled_for=ctx.scheduled_for.isoformat(),
    )
    if ctx.attempt <= int(ctx.metadata["fail_until"]):
        raise RuntimeError(f"upstream down (attempt {ctx.attempt})")


class Reporter(Think):
    """Prompt tasks: a fixed prompt, a prompt function, and tasks the environment changes."""

    def get_model(self) -> EchoModel:
        return EchoModel("Report: ")

    def get_default_timezone(self) -> str:
        return "Europe/Paris"

    def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
        digest = os.environ.get("TJ_TEST_DIGEST_SCHEDULE", "every 1 minute")
        tasks = {
            "digest": ScheduledTask(digest, prompt=DIGEST_PROMPT, metadata={"kind": "digest"}),
            "nudge": ScheduledTask("every day at 09:00", prompt=nudge_prompt),
        }
        if os.environ.get("TJ_TEST_EXTRA_TASK"):
            tasks["weekly"] = ScheduledTask(
                "every week on monday at 08:00 in America/New_York", prompt="Weekly summary"
            )
        if os.environ.get("TJ_TEST_DROP_NUDGE"):
            del tasks["nudge"]
        return tasks


class Janitor(Think):
    """Handler tasks: one that always fails, one that fails twice and then succeeds, and one
    that always succeeds."""

    def get_model(self) -> EchoModel:
        return EchoModel()

    def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
        return {
            "flaky": ScheduledTask(
                "every 1 minute", handler=flaky_handler, metadata={"fail_until": 99}
            ),
            "recovers": ScheduledTask(
                "every 5 minutes", handler=flaky_handler, metadata={"fail_until": 2}
            ),
            "tidy": ScheduledTask(
                "every 1 hour", handler=flaky_handler, metadata={"fail_until": 0}
            ),
        }


def release_key(jobs: ThinkJobs, pid: int) -> str:
    """What releases the lingering handler running in process ``pid``."""
    return f"{jobs.keys.prefix}:linger-release:{pid}"


def lingering_handler(agent: Think, ctx: ScheduleContext) -> None:
    """Records its start, waits until the test pushes to its process's ``release_key`` (at
    most 60 s), then records its end: a handler that runs as long as the test needs.

    It waits in BLPOPs of 2 s: the client's socket timeout (10 s) ends a longer one with a
    TimeoutError, which a worker paused past it (SIGSTOP) would meet on resuming."""
    record(agent.jobs, task_id=ctx.task_id, phase="started", pid=os.getpid())
    deadline = time.monotonic() + 60
    key = release_key(agent.jobs, os.getpid())
    while agent.jobs.redis.blpop([key], timeout=2) is None and time.monotonic() < deadline:
        pass
    record(agent.jobs, task_id=ctx.task_id, phase="ended", pid=os.getpid())


class Lingerer(Think):
    """A handler task that runs until released (registered only by the tests that use it)."""

    def get_model(self) -> EchoModel:
        return EchoModel()

    def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
        return {"linger": ScheduledTask("every 1 hour", handler=lingering_handler)}


class Plain(Think):
    """No scheduled tasks at all."""

    def get_model(self) -> EchoModel:
        return EchoModel()


jobs = ThinkJobs()
jobs.register(Reporter)
jobs.register(Janitor)
jobs.register(Plain)
jobs.register(Lingerer)
