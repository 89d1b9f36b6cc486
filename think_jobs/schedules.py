"""Scheduled tasks of agents (SPEC §8): arming per agent, firing, "run now", next runs.

Placeholder entry points; the beat integration fills them in.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

    from think_jobs.agent import Think
    from think_jobs.results import SubmitMessagesResult
    from think_jobs.runtime import ThinkJobs


def arm_agent(jobs: ThinkJobs, agent: Think, agent_id: int) -> None:
    """Called once per process when an agent is first written to (or started)."""


def register_tasks(app: Celery, jobs: ThinkJobs) -> None:
    """Register the schedule-related Celery tasks on ``app``."""


def run_now(
    agent: Think, task_id: str, *, scheduled_for: datetime | None
) -> SubmitMessagesResult | None:
    raise NotImplementedError("scheduled tasks are not wired yet")


def next_runs(agent: Think) -> dict[str, datetime]:
    raise NotImplementedError("scheduled tasks are not wired yet")
