"""SPEC §9 recovery with real faults: stalled models, killed callers, killed workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
import sqlalchemy as sa

from tests.apps.agents import Recorder, Staller, read_events
from tests.support.builders import texts, user, wait_for_status, wait_until
from tests.support.hung_tools import (
    HUNG,
    TOOL_RUNS,
    TURN_SIGNALS,
    UNHANG,
    Hanger,
    StallingHanger,
    held,
)
from tests.support.processes import ROOT, worker_processes
from think_jobs import StreamCallback, Think, ThinkJobs
from think_jobs.db.tables import agents
from think_jobs.messages import ToolPart
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall
from think_jobs.testing import worker
from think_jobs.tools import tool


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


# -- an attempt stuck where it cannot be stopped -----------------------------------------------


@pytest.mark.usefixtures("gates")
def test_a_cancelled_turn_stuck_in_a_tool_stops_holding_its_agent(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """The cancel cannot reach into the tool: the attempt's thread stays stuck. Its watch
    keeps the lease a lease TTL longer (time to wind up), then lets it lapse, so the agent's
    next turn runs; the stuck attempt, when its tool returns, writes nothing."""
    jobs = make_jobs(lease_ttl_s=1.0)
    agent = jobs.get_agent(Hanger, "h")
    stuck = agent.submit_messages([user("hang")])
    after = agent.submit_messages([user("hello")])
    with worker(jobs, concurrency=2):
        assert HUNG.wait(30)
        agent.cancel_submission(stuck.submission_id, "it hangs")
        wait_for_status(agent, after.submission_id, "completed")
        UNHANG.set()
        wait_until(lambda: not _running_turns(jobs))
    cancelled = agent.inspect_submission(stuck.submission_id)
    assert cancelled is not None and (cancelled.status, cancelled.error) == ("aborted", "it hangs")
    assert [text for role, text in texts(agent) if role == "assistant"][-1] == "ok"
    assert "finally" not in json.dumps([m.to_wire() for m in agent.get_messages()])


@pytest.mark.usefixtures("gates")
def test_a_cancel_frees_the_agent_from_a_stalled_attempt_hung_in_a_tool(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """Stalled inside its tool, the attempt keeps its lease for the continuation that would
    run the tool again; the cancel that follows leaves the turn no continuation, so a lease
    TTL later its lease lapses and the agent's next turn runs. The tool ran once; the stuck
    attempt, when its tool returns, writes nothing."""
    jobs = make_jobs(lease_ttl_s=1.0)
    agent = jobs.get_agent(StallingHanger, "sh")
    stuck = agent.submit_messages([user("hang")])
    after = agent.submit_messages([user("hello")])
    with worker(jobs, concurrency=2):
        assert HUNG.wait(30)
        stalled = TURN_SIGNALS[0]
        assert stalled.wait(30) and stalled.reason == "no chunk for 0.3 s"
        agent.cancel_submission(stuck.submission_id, "it hangs")
        wait_for_status(agent, after.submission_id, "completed", timeout_s=30)
        UNHANG.set()
        wait_until(lambda: not _running_turns(jobs))
    cancelled = agent.inspect_submission(stuck.submission_id)
    assert cancelled is not None and (cancelled.status, cancelled.error) == ("aborted", "it hangs")
    assert TOOL_RUNS == ["hang"]
    assert [text for role, text in texts(agent) if role == "assistant"][-1] == "ok"
    assert "finally" not in json.dumps([m.to_wire() for m in agent.get_messages()])


def _running_turns(jobs: ThinkJobs) -> list[Any]:
    return [task for w in jobs.live_workers() for task in w.running]


class Frozen(Think):
    """Streams one word, then its model call hangs (ignoring the turn's signal); the
    continuation finishes the reply."""

    stall_timeout_s = 0.3

    def get_model(self) -> FrozenModel:
        return FrozenModel()


class FrozenModel:
    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        yield {"type": "text-start", "id": "t"}
        if request.continuation:
            yield {"type": "text-delta", "id": "t", "delta": "and the rest."}
        else:
            yield {"type": "text-delta", "id": "t", "delta": "one "}
            HUNG.set()
            assert UNHANG.wait(60), "the test never let the frozen model go"
            yield {"type": "text-delta", "id": "t", "delta": "never stored"}
        yield {"type": "text-end", "id": "t"}


@pytest.mark.usefixtures("gates")
def test_a_stalled_attempt_stuck_in_its_model_call_is_continued_elsewhere(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """The stall watchdog stops the attempt, but its model call does not return: a lease TTL
    later its lease is left to lapse and a continuation finishes the reply meanwhile."""
    jobs = make_jobs(lease_ttl_s=1.0)
    agent = jobs.get_agent(Frozen, "f")
    result = agent.submit_messages([user("go")])
    with worker(jobs, concurrency=2):
        done = wait_for_status(agent, result.submission_id, "completed")
        UNHANG.set()
        wait_until(lambda: not _running_turns(jobs))
    assert done.attempt == 2
    assert texts(agent)[-1] == ("assistant", "one and the rest.")
    events = list(agent.stream(result.submission_id, timeout_s=5))
    deltas = [e.chunk["delta"] for e in events if e.chunk and e.chunk["type"] == "text-delta"]
    assert "".join(deltas) == "one and the rest."


class SlowTool(Think):
    """Calls a tool that takes longer than the stall timeout and the lease TTL together."""

    stall_timeout_s = 0.3

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(
            lambda request: Reply(
                text="done" if request.continuation else "",
                tool_calls=() if request.continuation else [ToolCall("slow")],
                then=Reply(text="done"),
            )
        )

    def get_tools(self) -> dict[str, Any]:
        @tool
        def slow() -> str:
            """Waits until the test lets it go."""
            return held("slow", "slow result")

        return {"slow": slow}


@pytest.mark.usefixtures("gates")
def test_a_stalled_attempt_inside_a_tool_keeps_its_lease_until_the_tool_returns(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """The stall watchdog fires while the tool runs; a continuation elsewhere would run the
    tool a second time, so the attempt keeps renewing its lease past a lease TTL (seen in the
    database) and, once the tool returns, its output goes to the continuation: one run."""
    jobs = make_jobs(lease_ttl_s=1.0)
    agent = jobs.get_agent(SlowTool, "s")
    result = agent.submit_messages([user("go")])
    with worker(jobs, concurrency=2):
        assert HUNG.wait(30)
        first = _lease_expiry(jobs, agent)
        wait_until(lambda: _lease_expiry(jobs, agent) > first + timedelta(seconds=2.5))
        UNHANG.set()
        done = wait_for_status(agent, result.submission_id, "completed")
    assert TOOL_RUNS == ["slow"]
    assert done.attempt == 2  # the stalled attempt's partial, with the tool's output, continued
    [_, reply] = agent.get_messages()
    [tool_part] = [p for p in reply.parts if isinstance(p, ToolPart)]
    assert (tool_part.state, tool_part.output) == ("output-available", "slow result")


def _lease_expiry(jobs: ThinkJobs, agent: Think) -> datetime:
    query = sa.select(agents.c.lease_expires_at).where(agents.c.agent_name == agent.name)
    with jobs.db.read() as conn:
        expiry = conn.execute(query).scalar_one()
    assert expiry is not None
    return cast(datetime, expiry)
