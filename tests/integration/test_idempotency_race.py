"""Twenty concurrent submits with one idempotency key from several processes: one submission,
one user message, one turn."""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any

from tests.apps.agents import Support
from tests.support.builders import texts, user, wait_for_status
from think_jobs import ThinkJobs
from think_jobs.testing import worker

PROCESSES = 4
THREADS = 5


def _submit_from_process(env: dict[str, str], barrier: Any, results: Any) -> None:
    os.environ.update(env)
    jobs = ThinkJobs()
    agent = jobs.get_agent(Support, "webhook")

    def submit() -> None:
        barrier.wait(30)
        result = agent.submit_messages([user("event 123", "m1")], idempotency_key="evt-123")
        results.put((result.submission_id, result.accepted))

    threads = [threading.Thread(target=submit) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_concurrent_submits_with_one_key_create_one_submission(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES * THREADS)
    results = context.Queue()
    processes = [
        context.Process(target=_submit_from_process, args=(settings_env, barrier, results))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in range(PROCESSES * THREADS)]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    assert len({submission_id for submission_id, _ in outcomes}) == 1
    assert sum(1 for _, accepted in outcomes if accepted) == 1
    agent = jobs.get_agent(Support, "webhook")
    assert len(agent.list_submissions()) == 1
    with worker(jobs):
        wait_for_status(agent, outcomes[0][0], "completed")
    assert texts(agent) == [("user", "event 123"), ("assistant", "Thanks, we are on it.")]
