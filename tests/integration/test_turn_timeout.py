"""A turn's time limit (``turn_timeout_s``): a turn that runs past it ends in error with its
partial reply, whatever keeps it going (a model that trickles, a tool that hangs), and the
agent's next turn runs. Time spent pending does not count; an earlier attempt's time does."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from tests.apps.agents import TimeLimited
from tests.support.builders import texts, user, wait_for_status, wait_until
from tests.support.fencing_faults import skewed
from tests.support.hung_tools import HUNG, TOOL_RUNS, TURN_SIGNALS, UNHANG, Hanger, StallingHanger
from tests.support.processes import worker_processes
from think_jobs import Think, ThinkJobs, TurnContext
from think_jobs.messages import ToolPart, message_text
from think_jobs.models import ModelRequest, Reply, ScriptedModel
from think_jobs.testing import worker

ENDLESS = " ".join(f"w{i}" for i in range(2000))  # 100 s at 20 words a second


def _limit_error(limit: str) -> str:
    return f"the turn ran past its time limit of {limit} s (turn_timeout_s)"


def _trickle_or_answer(request: ModelRequest) -> Reply:
    """A model that trickles words for ever when asked ``trickle``, and answers ``ok``."""
    if message_text(request.messages[-1]) == "trickle":
        return Reply(text=ENDLESS, delay_s=0.05)
    return Reply(text="ok")


class Trickler(Think):
    """An agent with a one-second time limit whose model may trickle without end."""

    turn_timeout_s = 1.0

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(_trickle_or_answer)


class LimitedPerTurn(Think):
    """No time limit of its own; ``before_turn`` sets one for turns whose body asks for it."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(_trickle_or_answer)

    def before_turn(self, ctx: TurnContext) -> None:
        if ctx.body is not None and "limit_s" in ctx.body:
            ctx.turn_timeout_s = float(ctx.body["limit_s"])


def test_a_turn_past_its_time_limit_ends_in_error_with_its_partial_reply(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Trickler, "t")
    endless = agent.submit_messages([user("trickle")])
    after = agent.submit_messages([user("hello")])
    with worker(jobs):
        ended = wait_for_status(agent, endless.submission_id, "error")
        wait_for_status(agent, after.submission_id, "completed")
    assert ended.error == _limit_error("1")
    assert ended.attempt == 1
    assert ended.started_at is not None and ended.completed_at is not None
    assert (ended.completed_at - ended.started_at).total_seconds() >= Trickler.turn_timeout_s
    roles_and_texts = texts(agent)
    assert [role for role, _ in roles_and_texts] == ["user", "assistant", "user", "assistant"]
    partial = roles_and_texts[1][1]
    assert partial.startswith("w0 w1 ") and 0 < len(partial) < len(ENDLESS)
    assert roles_and_texts[3] == ("assistant", "ok")
    events = list(agent.stream(endless.submission_id, timeout_s=10))
    deltas = [e.chunk["delta"] for e in events if e.chunk and e.chunk["type"] == "text-delta"]
    assert "".join(deltas) == partial  # the client saw what was stored
    errors = [e.chunk for e in events if e.chunk and e.chunk["type"] == "error"]
    assert errors == [{"type": "error", "errorText": _limit_error("1")}]
    assert (events[-1].done, events[-1].status, events[-1].error) == (
        True,
        "error",
        _limit_error("1"),
    )


def test_before_turn_sets_a_time_limit_for_one_turn(jobs: ThinkJobs) -> None:
    """A blocking caller gets the error as its result; the same agent's turn without a limit
    from ``before_turn`` runs to its end."""
    agent = jobs.get_agent(LimitedPerTurn, "p")
    with worker(jobs):
        limited = agent.save_messages([user("trickle")], body={"limit_s": 0.5})
        unlimited = agent.save_messages([user("hello")])
    assert (limited.status, limited.error) == ("error", _limit_error("0.5"))
    assert (unlimited.status, unlimited.error) == ("completed", None)
    assert texts(agent)[-1] == ("assistant", "ok")


def test_a_time_limit_before_turn_sets_that_cannot_work_fails_that_turn_only(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(LimitedPerTurn, "bad")
    with worker(jobs):
        refused = agent.save_messages([user("hello")], body={"limit_s": -1})
        fine = agent.save_messages([user("hello")], body={"limit_s": 30})
    assert (refused.status, refused.error) == (
        "error",
        "ctx.turn_timeout_s must be a positive, finite number of seconds, got -1.0",
    )
    assert (fine.status, fine.error) == ("completed", None)


class Paced(Think):
    """Each turn streams four words 0.4 s apart (1.6 s) under a three-second limit."""

    turn_timeout_s = 3.0

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(Reply(text="one two three four", delay_s=0.4))


def test_time_spent_pending_does_not_count_against_the_limit(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Paced, "p")
    first = agent.submit_messages([user("a")])
    second = agent.submit_messages([user("b")])
    with worker(jobs):
        done = wait_for_status(agent, second.submission_id, "completed", "error")
    assert agent.inspect_submission(first.submission_id).status == "completed"  # type: ignore[union-attr]
    assert (done.status, done.error) == ("completed", None)
    assert done.completed_at is not None
    # It waited behind the first turn (1.6 s) and ran 1.6 s: over the limit since admitted.
    assert (done.completed_at - done.created_at).total_seconds() > Paced.turn_timeout_s


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize("offset", ["+1h", "-1h"])
def test_a_worker_whose_clock_is_off_keeps_the_time_limit(
    jobs: ThinkJobs, settings_env: dict[str, str], offset: str
) -> None:
    """A worker process an hour ahead or behind (libfaketime) lets a 1.6 s turn finish under
    its 3 s limit and ends an endless one in error: the limit is measured from the database's
    clock and the worker's monotonic one, never from its wall clock."""
    agent = jobs.get_agent(TimeLimited, "skewed")
    paced = agent.submit_messages([user("pace")])
    endless = agent.submit_messages([user("trickle")])
    with worker_processes({**os.environ, **skewed(settings_env, offset)}, count=1):
        ended = wait_for_status(agent, endless.submission_id, "error")
    done = agent.inspect_submission(paced.submission_id)
    assert done is not None and (done.status, done.error) == ("completed", None)
    assert texts(agent)[1] == ("assistant", "one two three four")
    assert ended.error == _limit_error("3")
    assert ended.started_at is not None and ended.completed_at is not None
    # On the database's clock: the worker counts from the claim's answer, which comes after
    # the database stamped started_at, so the turn never ends before its limit.
    ran_s = (ended.completed_at - ended.started_at).total_seconds()
    assert TimeLimited.turn_timeout_s <= ran_s < 30


# -- a turn stuck where no signal reaches --------------------------------------------------------


class HangingTool(Hanger):
    """``Hanger`` (its tool ignores the turn's signal) with a second per turn (room enough for
    the first attempt to reach its tool on a loaded machine)."""

    turn_timeout_s = 1.0


@pytest.mark.usefixtures("gates")
def test_a_turn_stuck_in_a_tool_past_its_limit_is_ended_by_the_next_attempt(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """The attempt cannot be stopped inside the tool: a lease TTL after the limit its lease is
    left to lapse, and the attempt that takes the turn over finds the turn's time spent and
    ends it in error without calling the model or the tool again; the unanswered call gets
    the error as its output, in the stream and in the stored reply. The agent's next turn
    runs; the stuck tool's output, when it comes, is not stored."""
    jobs = make_jobs(lease_ttl_s=1.0)
    agent = jobs.get_agent(HangingTool, "h")
    stuck = agent.submit_messages([user("hang")])
    after = agent.submit_messages([user("hello")])
    with worker(jobs, concurrency=2):
        assert HUNG.wait(30)
        ended = wait_for_status(agent, stuck.submission_id, "error")
        wait_for_status(agent, after.submission_id, "completed")
        UNHANG.set()
        wait_until(lambda: not [t for w in jobs.live_workers() for t in w.running])
    assert (ended.error, ended.attempt) == (_limit_error("1"), 2)
    assert TOOL_RUNS == ["hang"]
    [_, partial, _, answer] = agent.get_messages()
    [call] = [p for p in partial.parts if isinstance(p, ToolPart)]
    assert (call.tool_name, call.state) == ("hang", "output-error")
    assert (call.output, call.error_text) == (None, _limit_error("1"))
    events = list(agent.stream(stuck.submission_id, timeout_s=10))
    ends = [e.chunk for e in events if e.chunk and e.chunk["type"].startswith("tool-output")]
    assert ends == [
        {
            "type": "tool-output-error",
            "toolCallId": call.tool_call_id,
            "errorText": _limit_error("1"),
        }
    ]
    assert "finally" not in json.dumps([m.to_wire() for m in agent.get_messages()])
    assert message_text(answer) == "ok"


class StallingHangingTool(StallingHanger):
    """``StallingHanger`` (the stall stops the attempt first, inside the tool) with a
    two-second limit."""

    turn_timeout_s = 2.0


@pytest.mark.usefixtures("gates")
def test_the_time_limit_ends_a_stalled_turn_that_waits_in_a_tool(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """Stalled inside its tool, the attempt keeps its lease for the continuation that would
    run the tool again; the time limit still ends the turn: a lease TTL after the limit the
    lease lapses, the attempt that takes the turn over ends it in error without running the
    tool again, and the agent's next turn runs."""
    jobs = make_jobs(lease_ttl_s=1.0)
    agent = jobs.get_agent(StallingHangingTool, "sh")
    stuck = agent.submit_messages([user("hang")])
    after = agent.submit_messages([user("hello")])
    with worker(jobs, concurrency=2):
        assert HUNG.wait(30)
        # Each attempt calls the model once before the tool: the last call's attempt runs it
        # (on a loaded machine the first may stall before it reaches the tool).
        in_tool = len(TURN_SIGNALS)
        stalled = TURN_SIGNALS[-1]
        assert stalled.wait(30) and stalled.reason == "no chunk for 0.3 s"
        ended = wait_for_status(agent, stuck.submission_id, "error", timeout_s=30)
        wait_for_status(agent, after.submission_id, "completed", timeout_s=30)
        UNHANG.set()
        wait_until(lambda: not [t for w in jobs.live_workers() for t in w.running])
    assert (ended.error, ended.attempt) == (_limit_error("2"), in_tool + 1)
    assert TOOL_RUNS == ["hang"]
    assert "finally" not in json.dumps([m.to_wire() for m in agent.get_messages()])
    assert message_text(agent.get_messages()[-1]) == "ok"
