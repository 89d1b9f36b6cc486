"""Agent turns as steps of Celery workflows (chain, group, chord). Placeholder."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

    from think_jobs.runtime import ThinkJobs

TURN_TASK = "think_jobs.turn"


def register_tasks(app: Celery, jobs: ThinkJobs) -> None:
    """Register ``think_jobs.turn`` on ``app``."""
