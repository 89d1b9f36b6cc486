"""A worker started from the command line freezes its start-up heap (``worker_gc_freeze``):
the garbage collector's full collections then skip it. Observed from outside: a turn run in
the worker replies with its process's ``gc.get_freeze_count()``."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from tests.apps.agents import HeapProbe
from tests.support.builders import user, wait_for_status
from tests.support.processes import worker_processes
from think_jobs import ThinkJobs
from think_jobs.messages import message_text
from think_jobs.testing import worker

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])  # the database plays no part


def _frozen_in_turn(jobs: ThinkJobs, name: str) -> int:
    """The freeze count of the process that ran a turn of a fresh HeapProbe agent."""
    agent = jobs.get_agent(HeapProbe, name)
    result = agent.submit_messages([user("how many?")])
    wait_for_status(agent, result.submission_id, "completed")
    (reply,) = [message_text(m) for m in agent.get_messages() if m.role == "assistant"]
    return int(reply)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_command_line_worker_runs_turns_with_its_start_up_heap_frozen(
    jobs: ThinkJobs, settings_env: dict[str, str], pool: str
) -> None:
    """Each prefork child freezes its own copy of the heap as it starts."""
    with worker_processes(settings_env, count=1, concurrency=1, pool=pool) as (process,):
        frozen = _frozen_in_turn(jobs, f"probe-{pool}")
    assert frozen > 10_000  # Celery, kombu, SQLAlchemy and pydantic's objects at the least
    assert len(process.lines("froze ")) == (2 if pool == "prefork" else 1)  # parent, child


def test_a_worker_freezes_nothing_with_the_setting_off(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    env = {**settings_env, "THINK_JOBS_WORKER_GC_FREEZE": "false"}
    with worker_processes(env, count=1, concurrency=1) as (process,):
        assert _frozen_in_turn(jobs, "probe-off") == 0
    assert process.lines("froze ") == []


def test_an_embedded_worker_leaves_its_hosts_collector_alone(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs()
    jobs.register(HeapProbe)
    before = gc.get_freeze_count()
    with worker(jobs, concurrency=1):
        assert _frozen_in_turn(jobs, "probe-embedded") == before
    assert gc.get_freeze_count() == before
