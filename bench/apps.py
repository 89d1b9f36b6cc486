"""The app benchmark workers run: ``think-jobs worker --app bench.apps:jobs``.

Settings come from THINK_JOBS_* variables (set by ``bench.services.worker_processes``).
"""

from __future__ import annotations

from typing import Any

from celery import signals

from bench.agents import AGENT_CLASSES, mark_ready, register_bare_tasks
from think_jobs import ThinkJobs

jobs = ThinkJobs()
for agent_class in AGENT_CLASSES:
    jobs.register(agent_class)
register_bare_tasks(jobs.celery, jobs)


def _on_ready(sender: Any = None, **_: Any) -> None:
    mark_ready(jobs)


signals.worker_ready.connect(_on_ready, weak=False)
