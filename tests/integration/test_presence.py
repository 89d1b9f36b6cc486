"""Workers announce what they serve (issue 16): presence records in Redis, the waiting reason
of a pending submission, and the unregistered-type log line once per type."""

from __future__ import annotations

import gc
import json
import logging
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from tests.apps.agents import Recorder, Support
from tests.support.builders import user, wait_for_status, wait_until
from tests.support.processes import worker_processes
from think_jobs import ThinkJobs
from think_jobs.domain.records import Drained, Idle
from think_jobs.engine import drain as worker_module
from think_jobs.testing import worker

FAST = {"worker_heartbeat_interval_s": 0.2}


def test_a_running_worker_has_a_record_that_goes_with_it(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(**FAST)
    jobs.register(Support)
    with worker(jobs, concurrency=3):
        live = wait_until(lambda: jobs.live_workers())
        (record,) = live
        assert record.role == "worker"
        assert record.queues == [jobs.settings.queue]
        assert record.agent_types == ["Support"]
        assert record.concurrency == 3
    assert jobs.live_workers() == []


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_the_record_names_the_turn_running_in_any_pool(
    make_jobs: Callable[..., ThinkJobs], settings_env: dict[str, str], pool: str
) -> None:
    """A prefork worker runs its tasks in child processes: the record still lists them."""
    jobs = make_jobs()
    agent = jobs.get_agent(Recorder, "busy")
    slow = {"label": "slow", "text": "one two three four five six", "delay_s": 0.4}
    result = agent.submit_messages([user(json.dumps(slow))])
    env = {**settings_env, "THINK_JOBS_WORKER_HEARTBEAT_INTERVAL_S": "0.2"}

    def running() -> list[tuple[str, str | None]]:
        return [(task.task, task.agent) for w in jobs.live_workers() for task in w.running]

    with worker_processes(env, count=1, concurrency=2, pool=pool):
        # (a second drain of the agent may show too, for the moment it takes to find the
        # lease held: the sweeper's and the submission's nudges can both arrive)
        wait_until(lambda: ("think_jobs.drain", "Recorder:busy") in running())
        wait_for_status(agent, result.submission_id, "completed")
        wait_until(lambda: jobs.live_workers() and running() == [])


def test_pending_without_any_worker_says_so(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "lonely")
    result = agent.submit_messages([user("hello?")])
    assert result.waiting_reason is None  # submit answers at once: presence is read on inspect
    found = agent.inspect_submission(result.submission_id)
    assert found is not None and found.status == "pending"
    queue = jobs.settings.queue
    assert found.waiting_reason == (
        f"no live worker serves agent type Support (no live worker consumes queue {queue})"
    )


def test_pending_while_the_live_workers_serve_other_types(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    producer = make_jobs()
    agent = producer.get_agent(Support, "mismatch")
    result = agent.submit_messages([user("anyone?")])
    other = make_jobs(**FAST)
    other.register(Recorder)  # a worker that never heard of Support
    with worker(other, concurrency=1):
        expected = (
            "no live worker serves agent type Support "
            f"(live workers on queue {producer.settings.queue} serve Recorder)"
        )
        wait_until(lambda: _reason(agent, result.submission_id) == expected)
    right = make_jobs(**FAST)
    right.register(Support)
    with worker(right, concurrency=1):
        wait_for_status(agent, result.submission_id, "completed")
    found = agent.inspect_submission(result.submission_id)
    assert found is not None and found.waiting_reason is None


def test_the_reason_of_a_type_from_the_facade_as_the_dashboard_asks(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """``ThinkJobs.waiting_reason``: the live workers read once, or given (the dashboard asks
    for several types with one read)."""
    producer = make_jobs()
    queue = producer.settings.queue
    assert producer.waiting_reason("Support") == (
        f"no live worker serves agent type Support (no live worker consumes queue {queue})"
    )
    serving = make_jobs(**FAST)
    serving.register(Recorder)
    with worker(serving, concurrency=1):
        wait_until(lambda: producer.waiting_reason("Recorder") is None)
        workers = producer.live_workers()
        assert producer.waiting_reason("Recorder", workers=workers) is None
        assert producer.waiting_reason("Support", workers=workers) == (
            f"no live worker serves agent type Support (live workers on queue {queue} serve"
            " Recorder)"
        )
    assert producer.waiting_reason("Recorder", workers=[]) is not None


def _reason(agent: object, submission_id: str) -> str | None:
    found = agent.inspect_submission(submission_id)  # type: ignore[attr-defined]
    return None if found is None else found.waiting_reason


def test_a_worker_without_agent_types_is_named_in_the_reason(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    producer = make_jobs()
    agent = producer.get_agent(Support, "no-app")
    result = agent.submit_messages([user("hi")])
    with worker(make_jobs(**FAST), concurrency=1):  # as `think-jobs worker` without --app
        queue = producer.settings.queue
        expected = (
            "no live worker serves agent type Support "
            f"(the live workers on queue {queue} serve no agent types: --app?)"
        )
        wait_until(lambda: _reason(agent, result.submission_id) == expected)


def test_redis_down_is_a_reason_not_an_exception(
    make_jobs: Callable[..., ThinkJobs], database_url: str
) -> None:
    producer = make_jobs()
    agent = producer.get_agent(Support, "blind")
    result = agent.submit_messages([user("hi")])
    from tests.support.processes import free_port

    cut_off = make_jobs(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    found = cut_off.get_agent(Support, "blind").inspect_submission(result.submission_id)
    assert found is not None and found.status == "pending"
    assert found.waiting_reason is not None
    assert found.waiting_reason.startswith(
        "cannot tell whether a live worker serves agent type Support: cannot read worker presence"
    )


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_unregistered_type_is_logged_once_per_type(
    make_jobs: Callable[..., ThinkJobs], caplog: pytest.LogCaptureFixture
) -> None:
    producer = make_jobs()
    agent = producer.get_agent(Support, "elsewhere")
    agent.submit_messages([user("hi")])
    agent_id = producer.agent_id_of(agent, create=False)
    assert agent_id is not None
    stranger = make_jobs()
    stranger.register(Recorder)
    with caplog.at_level(logging.DEBUG, logger="think_jobs.engine.drain"):
        outcomes = [worker_module.drain(stranger.services, agent_id) for _ in range(3)]
    assert outcomes == [Drained(0, Idle.UNREGISTERED)] * 3
    lines = [r for r in caplog.records if "is not registered in this worker" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert "(it serves: Recorder)" in lines[0].getMessage()


def test_a_dropped_runtime_is_freed_with_its_worker_hooks(settings_env: dict[str, str]) -> None:
    """The Celery signal handlers of a runtime's app (sweeper, presence, after-fork) live as
    long as the app: held strongly by the signals, every runtime a process built stayed alive,
    and a prefork child ran every one's after-fork."""

    def build() -> tuple[weakref.ref[ThinkJobs], weakref.ref[Any]]:
        base: dict[str, Any] = {
            key.removeprefix("THINK_JOBS_").lower(): v for key, v in settings_env.items()
        }
        jobs = ThinkJobs(**base)
        app = jobs.celery  # connects the handlers
        jobs.close()
        return weakref.ref(jobs), weakref.ref(app)

    jobs, app = build()
    gc.collect()
    assert jobs() is None and app() is None
