"""A worker told to stop (SIGTERM: Celery's warm shutdown, what every deploy sends) while it
runs a long turn, against real worker processes, PostgreSQL and Redis.

By default it waits for its turns to end, as Celery does. With ``worker_handover_s`` it hands
them over once that long has passed: the model is stopped, the partial reply stored and the
agent released, and a worker that runs on continues the turn at once — the stopping worker
exits by itself, long before the turn would have ended, instead of waiting to be killed
(whose turn would then wait for its lease to lapse). The turns queued behind it go on, in
order. Judged from outside: the model calls each worker made (a journal), the public API,
and each stream rebuilding its stored reply."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from tests.apps.agents import read_events
from tests.support.builders import user, wait_for_status
from tests.support.faults import Report, check, submit_load, unfinished
from tests.support.fencing_faults import open_calls
from tests.support.processes import WorkerProcess, worker_processes
from think_jobs import Think, ThinkJobs
from think_jobs.domain.records import Drained, Idle
from think_jobs.engine import drain
from think_jobs.models import ScriptedModel
from think_jobs.testing import wait_until, worker

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]


def _running_on(jobs: ThinkJobs, workers: list[WorkerProcess]) -> WorkerProcess:
    """The worker whose model call of the first turn has streamed a few chunks."""
    pids = {worker.process.pid: worker for worker in workers}

    def found() -> WorkerProcess | None:
        call = next((c for c in open_calls(jobs) if c["label"] == "agent-0#0"), None)
        return pids.get(call["pid"]) if call is not None and call["chunks"] >= 3 else None

    running: WorkerProcess = wait_until(found, 60, interval_s=0.02)
    return running


def _calls(jobs: ThinkJobs, label: str) -> list[int]:
    """The pids that started a model call for the turn ``label``, in order."""
    return [e["pid"] for e in read_events(jobs) if e["what"] == "start" and e["label"] == label]


def test_a_stopping_worker_hands_its_turn_over_to_one_that_runs_on(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    jobs, env = fault_jobs, fault_env
    # three turns of one agent, each streaming 100 words 0.05 s apart (5 s); the drain running
    # the first would keep the agent's lease for the next
    admitted = submit_load(jobs, agents=1, per_agent=3, words=100, delay_s=0.05)
    with worker_processes({**env, "THINK_JOBS_WORKER_HANDOVER_S": "0.5"}, count=2) as workers:
        stopping = _running_on(jobs, workers)
        os.killpg(stopping.process.pid, signal.SIGTERM)
        stopping.process.wait(60)  # it exits by itself, not when the turn would have ended
        wait_until(lambda: unfinished(jobs, admitted) == 0, 120, interval_s=0.1)
        report = check(jobs, admitted, Report("handed over", faults=1))
    other = next(w for w in workers if w is not stopping).process.pid
    # continued elsewhere (on a loaded machine a 2 s lease may lapse before the SIGTERM, and
    # the stopping worker pick the turn up again before it hands it over)
    *before, last = _calls(jobs, "agent-0#0")
    assert (set(before), last) == ({stopping.process.pid}, other)
    assert stopping.process.returncode == 0, "".join(stopping.output[-30:])
    assert stopping.lines("handed over 1 running turn(s)")
    assert report.problems == [], "\n".join(report.problems)
    assert report.anomalies == (0, 0, 0, 0, 0, 0)
    assert report.completed == report.submissions == 3


def test_by_default_a_stopping_worker_runs_its_turn_to_the_end(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    jobs, env = fault_jobs, fault_env
    admitted = submit_load(jobs, agents=1, per_agent=1, words=60, delay_s=0.05)
    with worker_processes(env, count=1) as [stopping]:
        _running_on(jobs, [stopping])
        os.killpg(stopping.process.pid, signal.SIGTERM)
        stopping.process.wait(60)
        assert unfinished(jobs, admitted) == 0  # it waited for the turn, as Celery does
        report = check(jobs, admitted, Report("ran to the end", faults=1))
    assert stopping.process.returncode == 0, "".join(stopping.output[-30:])
    assert _calls(jobs, "agent-0#0") == [stopping.process.pid]
    assert report.problems == [], "\n".join(report.problems)
    assert report.completed == report.submissions == 1


class Quiet(Think):
    def get_model(self) -> ScriptedModel:
        return ScriptedModel("ok")


def test_a_drain_that_reaches_a_stopping_worker_is_sent_on_unrun(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """A drain the stopping worker received before it stopped consuming starts once it hands
    its turns over: it claims nothing (a claim would only be handed over, costing the turn one
    of its recoveries) and goes back to the queue for a worker that runs on."""
    stopping = make_jobs()
    stopping.register(Quiet)
    agent = stopping.get_agent(Quiet, "a")
    submitted = agent.submit_messages([user("u1", "hello")])
    queue = stopping.settings.queue
    agent_id = stopping.services.agents.agent_id_of(agent, create=False)
    assert agent_id is not None
    before = stopping.redis.llen(queue)
    stopping.services.running.hand_over("its worker is stopping")
    assert drain.drain(stopping.services, agent_id) == Drained(0, Idle.STOPPING)
    assert stopping.redis.llen(queue) == before + 1  # sent on
    pending = agent.inspect_submission(submitted.submission_id)
    assert pending is not None and pending.status == "pending"  # unrun
    runs_on = make_jobs()
    runs_on.register(Quiet)
    with worker(runs_on):
        wait_for_status(runs_on.get_agent(Quiet, "a"), submitted.submission_id, "completed")
