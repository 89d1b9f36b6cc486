"""SPEC §9 recovery with real faults: stalled models, killed callers, killed workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.apps.agents import Recorder, Staller, read_events
from tests.support.builders import texts, user, wait_for_status, wait_until
from tests.support.processes import ROOT, worker_processes
from think_jobs import StreamCallback, ThinkJobs
from think_jobs.testing import worker


def test_stalled_model_interrupts_the_caller_once_and_a_continuation_finishes(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Staller, "a")
    calls: list[str] = []
    ids: list[str] = []
    callback = StreamCallback(
        on_start=lambda e: ids.append(e.request_id),
        on_event=lambda c: calls.append(json.loads(c)["type"]),
        on_done=lambda: calls.append("DONE"),
        on_error=lambda m: calls.append("ERROR"),
        on_interrupted=lambda: calls.append("INTERRUPTED"),
    )
    with worker(jobs):
        agent.chat("go", callback)
        assert calls.count("INTERRUPTED") == 1 and calls[-1] == "INTERRUPTED"
        assert "DONE" not in calls and "ERROR" not in calls
        events = list(agent.stream(ids[0], timeout_s=20))
    assert events[-1].done and events[-1].status == "completed"
    assert [e.seq for e in events] == list(range(len(events)))
    assert texts(agent) == [("user", "go"), ("assistant", "one two three and the rest.")]


def test_stalled_save_messages_returns_aborted_and_the_reply_is_finished(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Staller, "a")
    with worker(jobs):
        result = agent.save_messages([user("go", "m1")])
        assert result.status == "aborted"
        wait_until(lambda: texts(agent)[-1] == ("assistant", "one two three and the rest."))
    assert [m.id for m in agent.get_messages()].count("m1") == 1


def test_stalled_submission_is_continued_by_a_worker(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Staller, "a")
    result = agent.submit_messages([user("go")])
    with worker(jobs):
        done = wait_for_status(agent, result.submission_id, "completed")
    assert done.attempt == 2
    assert texts(agent)[-1] == ("assistant", "one two three and the rest.")


def test_a_stall_is_noticed_when_it_is_due_not_at_a_polling_tick(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """The watch sleeps until its next deadline: with revocation polled once a minute, a
    model that stalls past its 0.5 s timeout is still interrupted then, and continued."""
    jobs = make_jobs(cancel_poll_interval_s=60)
    agent = jobs.get_agent(Staller, "a")
    result = agent.submit_messages([user("go")])
    with worker(jobs):
        done = wait_for_status(agent, result.submission_id, "completed", timeout_s=20)
    assert done.attempt == 2
    assert texts(agent)[-1] == ("assistant", "one two three and the rest.")


CALLER = """
import json, sys
from tests.apps.agents import jobs, Recorder
agent = jobs.get_agent(Recorder, "a")
text = " ".join(f"w{i}" for i in range(400))
spec = json.dumps({"label": "caller", "text": text, "delay_s": 0.01})
agent.save_messages([{"id": "m-caller", "role": "user", "parts": [{"type": "text", "text": spec}]}])
"""


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_killed_blocking_caller_turn_is_finished_by_a_worker(
    make_jobs: Callable[..., ThinkJobs], settings_env: dict[str, str]
) -> None:
    # The caller's lease is short, so that the worker may take its turn soon after it dies;
    # the worker's own lease keeps the default: a busy machine must not make it lapse too.
    caller_env = {**os.environ, **settings_env, "THINK_JOBS_LEASE_TTL_S": "1.5"}
    jobs = make_jobs()
    agent = jobs.get_agent(Recorder, "a")
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER], cwd=ROOT, env=caller_env, start_new_session=True
    )
    try:
        wait_until(lambda: _deltas_in_stream(jobs, agent.address) >= 20, 30)
    finally:
        os.killpg(caller.pid, signal.SIGKILL)
        caller.wait(10)
    with worker_processes(settings_env, count=1, concurrency=2):
        wait_until(lambda: _finished(jobs, agent), 60)
    user_ids = [m.id for m in agent.get_messages() if m.role == "user"]
    assert user_ids == ["m-caller"]
    reply = texts(agent)[-1][1]
    assert reply.startswith("w0 w1 ") and reply.count("w0 ") == 2  # partial, then the rerun
    assert [e["label"] for e in read_events(jobs) if e["what"] == "start"] == ["caller", "caller"]


def _deltas_in_stream(jobs: ThinkJobs, address: str) -> int:
    keys = list(jobs.redis.scan_iter(f"{jobs.keys.prefix}:stream:{address}:*"))
    if not keys:
        return 0
    return sum(1 for raw in jobs.redis.lrange(keys[0], 0, -1) if b"text-delta" in raw)


def _finished(jobs: ThinkJobs, agent: Any) -> bool:
    from think_jobs.db import turns as turn_ops

    agent_id = jobs.agent_id_of(agent, create=False)
    with jobs.db.read() as conn:
        rows = turn_ops.active_turns(conn, agent_id)  # type: ignore[arg-type]
    return not rows and len(texts(agent)) == 2
