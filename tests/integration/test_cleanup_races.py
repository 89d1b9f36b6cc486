"""Clean-up (delete, prune, reset) racing turns that run, were cancelled or still have a
workflow step to wake, against real workers, Redis and SQLite/PostgreSQL.

Found by a review on 2026-12-07; each test fails on the code before that day: a cancel undone
by the delete that followed it, a reader of a deleted turn left waiting for good, a workflow
whose next message was deleted with its turn, a reset that let a turn it read as queued run,
a tool's ``clear_messages`` undone by its own turn's final write, and a cleared partial put
back by a later take-over of the agent's lease.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.apps.agents import Recorder, read_events
from tests.support.builders import directive, texts, user, wait_for_status
from tests.support.hung_tools import HUNG, UNHANG, Hanger
from tests.support.pg_sessions import wait_for_lock_waiter
from tests.support.processes import worker_processes
from think_jobs import Think, ThinkJobs
from think_jobs.db import turns as turn_ops
from think_jobs.db.tables import agents
from think_jobs.domain.policy import DELETED, SKIPPED_BY_RESET
from think_jobs.engine import followups
from think_jobs.messages import message_text
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall
from think_jobs.testing import wait_until, worker
from think_jobs.tools import tool


class HangThenAnswer(Hanger):
    """Asked ``hang``: calls the hung tool, then (its next step) says ``done``."""

    def get_model(self) -> ScriptedModel:
        def script(request: ModelRequest) -> Reply:
            first = next(m for m in request.messages if m.role == "user")
            if message_text(first) == "hang":
                return Reply(tool_calls=[ToolCall("hang")], then=Reply(text="done"))
            return Reply(text="ok")

        return ScriptedModel(script)


def _lease_free(jobs: ThinkJobs, agent: Think) -> bool:
    agent_id = jobs.agent_id_of(agent, create=False)
    with jobs.db.read() as conn:
        query = sa.select(agents.c.lease_token).where(agents.c.id == agent_id)
        return conn.execute(query).scalar_one() is None


@pytest.mark.usefixtures("gates")
def test_a_cancelled_submission_deleted_at_once_is_still_stopped(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """Stop and remove: the turn is cancelled while its tool runs, then deleted (it is
    terminal). The cancel still stops it — the model is not called again — and the deleted
    stream is not written back. The revocation poller is slowed, so the cancel reaches the
    attempt only through its next append, which the delete used to precede by deleting the
    flag (with the default 0.2 s poll the same happened to a delete within 0.2 s)."""
    jobs = make_jobs(lease_ttl_s=60, cancel_poll_interval_s=30)
    agent = jobs.get_agent(HangThenAnswer, "stop-and-remove")
    submitted = agent.submit_messages([user("hang")])
    with worker(jobs):
        try:
            assert HUNG.wait(30)
            agent.cancel_submission(submitted.submission_id, "stop")
            assert agent.delete_submission(submitted.submission_id)
        finally:
            UNHANG.set()
        wait_until(lambda: _lease_free(jobs, agent), 30)
    replies = [text for role, text in texts(agent) if role == "assistant"]
    assert "done" not in "".join(replies), f"the model ran on after the cancel: {replies}"
    assert list(jobs.redis.scan_iter(f"{jobs.keys.prefix}:stream:*")) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_reader_of_a_deleted_turn_gets_its_end(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    """A client follows a turn whose worker dies; the turn is cancelled, then deleted. The
    reader ends, told the submission was deleted (it waited for good: nobody writes the end
    of a deleted turn's stream, and the database said "not finished" of a missing row)."""
    agent = fault_jobs.get_agent(Recorder, "read-then-deleted")
    text = " ".join(f"w{i}" for i in range(200))
    first = agent.submit_messages([directive("m-1", label="a", text=text, delay_s=0.05)])
    with worker_processes(fault_env, count=1) as [dying]:
        wait_until(lambda: _chunks(fault_jobs, "a") >= 10, 60, interval_s=0.02)
        reader = iter(agent.stream(first.submission_id, timeout_s=15))
        seen = [next(reader) for _ in range(5)]
        dying.kill()
    agent.cancel_submission(first.submission_id, reason="stop")
    assert agent.delete_submission(first.submission_id)
    rest = list(reader)
    assert seen and rest[-1].done
    assert (rest[-1].status, rest[-1].error) == ("aborted", DELETED)


def _chunks(jobs: ThinkJobs, label: str) -> int:
    return sum(1 for e in read_events(jobs) if e["what"] == "chunk" and e["label"] == label)


@pytest.mark.parametrize("prune", [False, True], ids=["delete", "prune"])
def test_a_finished_submission_keeps_its_row_until_its_workflow_step_is_sent(
    make_jobs: Callable[..., ThinkJobs], prune: bool
) -> None:
    """A workflow step waits on a submission (its task message is the turn's follow-up). The
    turn ends while the broker refuses the send, so the message stays on the row for the
    sweeper. Deleting or pruning the row then would lose it — the workflow would never go
    on — so the row stays until the message is sent, and goes after."""
    jobs = make_jobs()
    agent = jobs.get_agent(Recorder, f"workflow-{prune}")
    submitted = agent.submit_messages([directive("m-1", label="a")])  # no worker: pending
    turn = _turn(jobs, agent, submitted.submission_id)
    step = jobs.celery.signature("think_jobs.turn", args=("Recorder", "wf"), kwargs={})
    assert followups.register(jobs.services, turn.id, dict(step))
    refusing = make_jobs(broker_url="redis://127.0.0.1:1/0")
    refusing.get_agent(Recorder, f"workflow-{prune}").cancel_submission(submitted.submission_id)
    assert _turn(jobs, agent, submitted.submission_id).followup_due_at is not None
    assert _delete(agent, submitted.submission_id, prune=prune) is False
    wait_until(lambda: followups.send_due(jobs.services) == 1, 25)  # the sweeper's retry
    assert _delete(agent, submitted.submission_id, prune=prune) is True


def _turn(jobs: ThinkJobs, agent: Think, submission_id: str) -> Any:
    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    with jobs.db.read() as conn:
        found = turn_ops.get_turn(conn, agent_id, submission_id)
    assert found is not None
    return found


def _delete(agent: Think, submission_id: str, *, prune: bool) -> bool:
    if prune:
        return agent.delete_submissions() == 1
    return agent.delete_submission(submission_id)


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_reset_stops_a_turn_it_read_queued_that_a_worker_started_meanwhile(
    jobs: ThinkJobs,
) -> None:
    """``reset_turn_state`` reads the agent's turns, then skips those it read queued. A claim
    committing in between (queued to running) made the skip match nothing, and the turn ran
    to its end. Held in that order deterministically: a test transaction locks the turn row,
    the worker's claim queues on it first, the reset's write second. The turn the reset read
    is now stopped: skipped if the claim lost, aborted (with its revocation flag) if it won."""
    agent = jobs.get_agent(Recorder, "reset-race")
    text = " ".join(f"w{i}" for i in range(100))
    queued = agent.submit_messages([directive("m-1", label="a", text=text, delay_s=0.02)])
    agent_id = jobs.agent_id_of(agent, create=False)
    resetting = threading.Thread(target=agent.reset_turn_state)
    with jobs.db.engine.connect() as blocker:
        lock = sa.text("SELECT id FROM think_turns WHERE agent_id = :a FOR UPDATE")
        blocker.execute(lock, {"a": agent_id})
        with worker(jobs):
            try:
                wait_for_lock_waiter(jobs, on="WITH fresh AS")  # the worker's claim
                resetting.start()
                wait_for_lock_waiter(jobs, on="followup_due_at", besides="WITH fresh AS")
            finally:
                blocker.commit()
            resetting.join(30)
            ended = wait_for_status(agent, queued.submission_id, "completed", "skipped", "aborted")
    assert (ended.status, ended.error) in (("skipped", SKIPPED_BY_RESET), ("aborted", None))
    assert ended.status == "aborted"  # the claim queued first, so it won


class ClearingTool(Think):
    """Asked ``clear``, calls a tool that clears the conversation, then says ``cleared``."""

    def get_model(self) -> ScriptedModel:
        def script(request: ModelRequest) -> Reply:
            if message_text(request.messages[-1]) == "clear":
                return Reply(tool_calls=[ToolCall("wipe")], then=Reply(text="cleared"))
            return Reply(text="ok")

        return ScriptedModel(script)

    def get_tools(self) -> dict[str, Any]:
        @tool
        def wipe() -> str:
            """Clears the conversation."""
            self.clear_messages()
            return "wiped"

        return {"wipe": wipe}


def test_a_tool_that_clears_the_conversation_leaves_it_empty(jobs: ThinkJobs) -> None:
    """Outside a turn, ``clear_messages`` lets the turn it aborts store its partial first,
    then deletes the history. Called from a tool, the turn it aborts is its own, whose final
    write comes after: it stores no reply (it stored one, an orphan assistant message in the
    cleared conversation)."""
    agent = jobs.get_agent(ClearingTool, "clears")
    agent.save_messages([user("hello")])
    result = agent.save_messages([user("clear")])
    assert result.status == "aborted"
    assert agent.get_messages() == []
    assert agent.save_messages([user("again")]).status == "completed"
    assert texts(agent) == [("user", "again"), ("assistant", "ok")]


@pytest.mark.usefixtures("gates")
def test_a_partial_stored_after_a_reader_ended_its_stream_and_then_cleared_stays_cleared(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """A turn cancelled in a slow tool: a reader ends its stream from the database, then the
    attempt stores the partial the stream shows. The user clears the conversation; later the
    agent's lease lapses in a holder's hands before another turn runs (set on the row, as a
    process that took it and died would leave it). The take-over settles nothing: the stream
    ended by a reader no longer passes for one whose attempt could not store its partial (it
    put the partial back, with its tool call open)."""
    jobs = make_jobs(lease_ttl_s=2, sweep_interval_s=0.5)
    agent = jobs.get_agent(Hanger, "sealed-then-cleared")
    submitted = agent.submit_messages([user("hang")])
    with worker(jobs):
        try:
            assert HUNG.wait(30)
            reader = agent.stream(submitted.submission_id, timeout_s=30)
            agent.cancel_submission(submitted.submission_id, "stop")
            streamed = list(reader)  # ended by the reader, from the database
        finally:
            UNHANG.set()
        wait_until(lambda: _lease_free(jobs, agent), 30)
        assert streamed[-1].done and streamed[-1].attempt != 1
        assert [role for role, _ in texts(agent)] == ["user", "assistant"]
        agent.clear_messages()
        agent_id = jobs.agent_id_of(agent, create=False)
        lapsed = datetime.now(UTC) - timedelta(minutes=1)
        with jobs.db.write() as conn:
            held = {"lease_token": "died-holding-it", "lease_expires_at": lapsed}
            conn.execute(sa.update(agents).where(agents.c.id == agent_id).values(**held))
        wait_until(lambda: _lease_free(jobs, agent), 30)  # a sweeper's drain took it over
    assert agent.get_messages() == []
