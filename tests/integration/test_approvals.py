"""SPEC §13, tool approvals: a call of a tool declared ``needs_approval`` ends the turn with
the part in ``approval-requested`` and a pending approval; the agent's line waits behind it
until ``respond_to_approval`` (any process) lets the continuation run. Real workers, real
Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from sqlalchemy import select, update

from tests.support.builders import texts, user, wait_for_status, wait_until
from tests.support.hung_tools import HUNG, TOOL_RUNS, UNHANG, held
from think_jobs import (
    Approval,
    InvalidInputError,
    StreamCallback,
    Think,
    ThinkJobs,
    UnknownApprovalError,
    tool,
)
from think_jobs.db.tables import agents, approvals, turns
from think_jobs.engine.approvals import NOT_RUN_REASON
from think_jobs.messages import ToolPart, UIMessage, message_text
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall
from think_jobs.testing import worker
from think_jobs.tools import Tool

RAN: list[dict[str, Any]] = []  # the tool's calls (the in-process worker shares this list)


def _large(raw: Mapping[str, Any]) -> bool:
    return int(raw.get("amount", 0)) > 100


class Payer(Think):
    """Pays when asked; the first reply calls ``pay``, the continuation says what happened."""

    script: Any = [
        Reply(tool_calls=[ToolCall("pay", {"amount": 500}, id="call-1")], then=Reply("paid?")),
        "second answer",
    ]
    rule: Any = True

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(type(self).script)

    def get_tools(self) -> dict[str, Tool]:
        @tool(needs_approval=type(self).rule)
        def pay(amount: int) -> str:
            """Pay an amount."""
            RAN.append({"amount": amount})
            return f"paid {amount}"

        return {"pay": pay}


class SmallPayer(Payer):
    rule = staticmethod(_large)
    script = [
        Reply(tool_calls=[ToolCall("pay", {"amount": 5}, id="small")], then=Reply("ok small")),
        Reply(tool_calls=[ToolCall("pay", {"amount": 500}, id="big")], then=Reply("ok big")),
    ]


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()


def tool_part(message: UIMessage, call_id: str) -> ToolPart:
    found = [p for p in message.parts if isinstance(p, ToolPart) and p.tool_call_id == call_id]
    assert len(found) == 1, message.parts
    return found[0]


def asked(agent: Think) -> Approval:
    def pending() -> list[Approval]:
        return agent.list_approvals(status="pending")

    found: list[Approval] = wait_until(pending)
    assert len(found) == 1
    return found[0]


def test_a_call_that_needs_approval_ends_the_turn_and_waits(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Payer, "a")
    first = agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        wait_for_status(agent, first.submission_id, "completed")
        approval = asked(agent)
        assert (approval.request_id, approval.tool_name) == (first.submission_id, "pay")
        assert (approval.tool_call_id, approval.input) == ("call-1", {"amount": 500})
        assert approval.status == "pending" and approval.decided_at is None
        assert approval.reason is None and approval.created_at.tzinfo is not None
        reply = agent.get_messages()[-1]
        part = tool_part(reply, "call-1")
        assert part.state == "approval-requested"
        assert part.approval is not None and part.approval.id == approval.approval_id
        events = list(agent.stream(first.submission_id, timeout_s=30))
        kinds = [e.chunk["type"] for e in events if e.chunk is not None]
        assert "tool-approval-request" in kinds and kinds[-1] == "finish"
        assert RAN == []  # not run before a human said yes
        second = agent.submit_messages([user("and then?")])
        waiting = agent.inspect_submission(approval.continuation_id)
        assert waiting is not None and waiting.status == "pending"
        assert waiting.waiting_reason is not None and approval.approval_id in (
            waiting.waiting_reason
        )
        assert agent.inspect_submission(second.submission_id).status == "pending"  # type: ignore[union-attr]
        assert agent.get_messages()[-1].id == reply.id  # the line waits: "and then?" not applied


def test_approved_the_tool_runs_once_and_the_model_goes_on_in_order(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Payer, "a")
    agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        approval = asked(agent)
        second = agent.submit_messages([user("and then?")])
        answered = agent.respond_to_approval(approval.approval_id, True, "looks right")
        assert answered.status == "approved" and answered.decided_at is not None
        wait_for_status(agent, approval.continuation_id, "completed")
        wait_for_status(agent, second.submission_id, "completed")
        again = agent.respond_to_approval(approval.approval_id, False)  # a second answer
    assert again.status == "approved" and again.reason == "looks right"
    assert RAN == [{"amount": 500}]
    assert texts(agent) == [
        ("user", "pay the invoice"),
        ("assistant", "paid?"),
        ("user", "and then?"),
        ("assistant", "second answer"),
    ]
    part = tool_part(agent.get_messages()[1], "call-1")
    assert (part.state, part.output) == ("output-available", "paid 500")
    assert part.approval is not None and part.approval.approved is True
    assert agent.list_approvals(status="pending") == []


def test_denied_the_model_is_told_and_the_tool_never_runs(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Payer, "a")
    agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        approval = asked(agent)
        denied = agent.respond_to_approval(approval.approval_id, False, "too much")
        wait_for_status(agent, approval.continuation_id, "completed")
        events = list(agent.stream(approval.continuation_id, timeout_s=30))
    assert denied.status == "denied" and denied.reason == "too much"
    assert RAN == []
    kinds = [e.chunk["type"] for e in events if e.chunk is not None]
    assert "tool-output-denied" in kinds
    part = tool_part(agent.get_messages()[-1], "call-1")
    assert part.state == "output-denied"
    assert part.approval is not None and (part.approval.approved, part.approval.reason) == (
        False,
        "too much",
    )
    assert texts(agent)[-1] == ("assistant", "paid?")


def test_a_callable_decides_per_input(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(SmallPayer, "a")
    small = agent.submit_messages([user("pay 5")])
    with worker(jobs):
        wait_for_status(agent, small.submission_id, "completed")
        assert agent.list_approvals() == [] and RAN == [{"amount": 5}]
        agent.submit_messages([user("pay 500")])
        approval = asked(agent)
        assert approval.tool_call_id == "big" and RAN == [{"amount": 5}]
        agent.respond_to_approval(approval.approval_id, True)
        wait_for_status(agent, approval.continuation_id, "completed")
    assert RAN == [{"amount": 5}, {"amount": 500}]
    assert texts(agent)[-1] == ("assistant", "ok big")


def test_an_approval_left_open_expires_and_is_denied(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(approval_timeout_s=0.5)
    agent = jobs.get_agent(Payer, "a")
    agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        approval = asked(agent)
        wait_for_status(agent, approval.continuation_id, "completed")
    (closed,) = agent.list_approvals()
    assert closed.status == "expired" and closed.reason is not None
    assert "expired" in closed.reason
    part = tool_part(agent.get_messages()[-1], "call-1")
    assert part.state == "output-denied" and RAN == []


def test_cancelling_the_submission_cancels_its_approval_and_the_line_moves_on(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Payer, "a")
    first = agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        approval = asked(agent)
        second = agent.submit_messages([user("and then?")])
        agent.cancel_submission(first.submission_id)
        wait_for_status(agent, second.submission_id, "completed")
        late = agent.respond_to_approval(approval.approval_id, True)
    assert late.status == "cancelled" and RAN == []
    continuation = agent.inspect_submission(approval.continuation_id)
    assert continuation is not None and continuation.status == "aborted"
    part = tool_part(agent.get_messages()[1], "call-1")
    assert part.state == "output-denied"
    assert texts(agent)[2:] == [("user", "and then?"), ("assistant", "second answer")]


def test_cancelling_the_continuation_cancels_the_approval(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Payer, "a")
    agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        approval = asked(agent)
        agent.cancel_submission(approval.continuation_id, "changed my mind")
        (closed,) = wait_until(lambda: agent.list_approvals(status="cancelled"))
    assert closed.approval_id == approval.approval_id and RAN == []


def test_the_approval_survives_a_worker_restart_and_a_lost_drain_message(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Payer, "a")
    agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        approval = asked(agent)
    other_process = jobs.get_agent(Payer, "a")  # an answer from anywhere: it is in the database
    other_process.respond_to_approval(approval.approval_id, True)
    jobs.redis.delete(jobs.settings.queue)  # the drain the answer sent is lost with Redis's data
    with worker(jobs):  # a new worker's sweeper finds the continuation that may run now
        wait_for_status(agent, approval.continuation_id, "completed")
    assert RAN == [{"amount": 500}]


def test_unknown_approvals_and_bad_answers_are_errors_that_say_what_to_fix(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Payer, "a")
    with pytest.raises(UnknownApprovalError, match="no approval 'nope'"):
        agent.respond_to_approval("nope", True)
    agent.submit_messages([user("pay")])
    with pytest.raises(InvalidInputError, match="unknown approval status 'open'"):
        agent.list_approvals(status="open")
    with pytest.raises(InvalidInputError, match="approved: expected true or false"):
        agent.respond_to_approval("nope", "yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reason", "says"),
    [("x" * 2001, "2001 characters; at most 2000"), ("a\x00b", "NUL"), ("\ud800", "surrogate")],
)
def test_a_reason_that_cannot_be_stored_is_refused_and_changes_nothing(
    jobs: ThinkJobs, reason: str, says: str
) -> None:
    agent = jobs.get_agent(Payer, "a")
    first = agent.submit_messages([user("pay")])
    with worker(jobs):
        approval = asked(agent)
        with pytest.raises(InvalidInputError, match=f"reason: .*{says}"):
            agent.respond_to_approval(approval.approval_id, False, reason)
        assert agent.list_approvals(status="pending") == [approval]
        queued = agent.submit_messages([user("next")])
        with pytest.raises(InvalidInputError, match=f"reason: .*{says}"):
            agent.cancel_submission(queued.submission_id, reason)
        assert agent.inspect_submission(queued.submission_id).status == "pending"  # type: ignore[union-attr]
        assert agent.inspect_submission(first.submission_id).status == "completed"  # type: ignore[union-attr]


class Slow(Payer):
    script = [
        Reply(
            text="let me think about this one",
            delay_s=0.4,
            tool_calls=[ToolCall("pay", {"amount": 1}, id="c")],
            then=Reply("done"),
        )
    ]


def test_a_stale_attempt_writes_no_approval(make_jobs: Any) -> None:
    """The approval is part of the turn's fenced final write: an attempt that lost the lease
    writes none; the attempt that recovers the turn asks once."""
    jobs = make_jobs(lease_ttl_s=3)
    agent = jobs.get_agent(Slow, "a")
    first = agent.submit_messages([user("pay")])
    fenced_before = _fenced_writes()
    with worker(jobs):
        wait_for_status(agent, first.submission_id, "running")
        with jobs.db.write() as conn:  # another owner took the lease meanwhile
            conn.execute(update(agents).values(lease_token="someone-else"))
        wait_until(lambda: _fenced_writes() > fenced_before)
        with jobs.db.read() as conn:
            assert conn.execute(select(approvals)).all() == []
            status = conn.execute(select(turns.c.status)).scalar_one()
        assert status == "running"  # nothing of the stale attempt was written
        wait_for_status(agent, first.submission_id, "completed")  # recovered after expiry
        approval = asked(agent)
    assert approval.tool_call_id == "c" and len(agent.list_approvals()) == 1


def _fenced_writes() -> float:
    from think_jobs.observe import metrics

    return sum(
        sample.value
        for family in metrics.FENCED_WRITES.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )


class TwoCalls(Payer):
    script = [
        Reply(
            tool_calls=[
                ToolCall("pay", {"amount": 1}, id="one"),
                ToolCall("pay", {"amount": 2}, id="two"),
            ],
            then=Reply("both answered"),
        )
    ]


def test_two_calls_in_one_step_wait_for_both_answers(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(TwoCalls, "a")
    agent.submit_messages([user("pay twice")])
    with worker(jobs):
        first, second = wait_until(lambda: _two_pending(agent))
        assert {first.tool_call_id, second.tool_call_id} == {"one", "two"}
        assert first.continuation_id == second.continuation_id
        agent.respond_to_approval(first.approval_id, True)
        waiting = agent.inspect_submission(first.continuation_id)
        assert waiting is not None and waiting.status == "pending"
        assert second.approval_id in (waiting.waiting_reason or "")
        agent.respond_to_approval(second.approval_id, False, "once is enough")
        wait_for_status(agent, first.continuation_id, "completed")
    reply = agent.get_messages()[-1]
    by_id = {first.tool_call_id: True, second.tool_call_id: False}
    states = {cid: tool_part(reply, cid).state for cid in by_id}
    assert states == {
        cid: ("output-available" if ok else "output-denied") for cid, ok in by_id.items()
    }
    assert [{"amount": 1 if first.tool_call_id == "one" else 2}] == RAN


class Chained(Payer):
    script = [
        Reply(
            tool_calls=[ToolCall("pay", {"amount": 1}, id="first")],
            then=Reply(
                tool_calls=[ToolCall("pay", {"amount": 2}, id="second")], then=Reply("all paid")
            ),
        ),
        "later",
    ]


def test_a_continuation_may_ask_again_and_the_line_still_waits(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Chained, "a")
    agent.submit_messages([user("pay in two steps")])
    with worker(jobs):
        one = asked(agent)
        later = agent.submit_messages([user("after that")])
        agent.respond_to_approval(one.approval_id, True)
        wait_for_status(agent, one.continuation_id, "completed")
        two = asked(agent)
        assert two.tool_call_id == "second" and two.request_id == one.continuation_id
        chain = agent.list_approvals(request_id=one.continuation_id)  # continued, then asked
        assert [a.approval_id for a in chain] == [one.approval_id, two.approval_id]
        assert agent.inspect_submission(later.submission_id).status == "pending"  # type: ignore[union-attr]
        agent.respond_to_approval(two.approval_id, True)
        wait_for_status(agent, later.submission_id, "completed")
    assert RAN == [{"amount": 1}, {"amount": 2}]
    assert texts(agent) == [
        ("user", "pay in two steps"),
        ("assistant", "all paid"),
        ("user", "after that"),
        ("assistant", "later"),
    ]
    steps = [p.type for p in agent.get_messages()[1].parts if p.type == "step-start"]
    assert len(steps) == 3  # one reply, three model steps


def test_a_blocking_chat_that_asks_returns_and_a_worker_continues(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Payer, "a")
    seen: list[str] = []
    agent.chat("pay now", StreamCallback(on_event=lambda c: seen.append(json.loads(c)["type"])))
    assert "tool-approval-request" in seen and RAN == []
    approval = asked(agent)
    agent.respond_to_approval(approval.approval_id, True)
    with worker(jobs):
        wait_for_status(agent, approval.continuation_id, "completed")
    assert RAN == [{"amount": 500}] and texts(agent)[-1] == ("assistant", "paid?")


def test_reset_cancels_the_approvals_of_what_it_skips(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Payer, "a")
    agent.submit_messages([user("pay")])
    with worker(jobs):
        approval = asked(agent)
        agent.reset_turn_state()
        (closed,) = agent.list_approvals()
    assert closed.status == "cancelled"
    skipped = agent.inspect_submission(approval.continuation_id)
    assert skipped is not None and skipped.status == "skipped"
    assert tool_part(agent.get_messages()[-1], "call-1").state == "output-denied"


def _two_pending(agent: Think) -> list[Approval]:
    found = agent.list_approvals("pending")
    return found if len(found) == 2 else []


STALLS: list[int] = []  # the steps that stalled once


class StallsOnce(Payer):
    """After the approved tool ran, the model stalls once: recovery must rebuild the reply
    from the stored one it extends plus its stream, and not run the tool again."""

    stall_timeout_s = 1.0

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(self._reply)

    def _reply(self, request: Any) -> Reply:
        rest = Reply(text="and the rest")  # the step after the one that stalled
        if request.step == 1 and not STALLS:
            STALLS.append(1)
        after = Reply(text="half of the answer", stall_after=2, then=rest)
        return Reply(tool_calls=[ToolCall("pay", {"amount": 9}, id="p")], then=after)


def test_a_continuation_recovers_from_its_stream_without_running_the_tool_twice(
    jobs: ThinkJobs,
) -> None:
    STALLS.clear()
    agent = jobs.get_agent(StallsOnce, "a")
    agent.submit_messages([user("pay")])
    with worker(jobs):
        approval = asked(agent)
        agent.respond_to_approval(approval.approval_id, True)
        done = wait_for_status(agent, approval.continuation_id, "completed")
    assert done.attempt == 2 and STALLS == [1]
    assert RAN == [{"amount": 9}]
    reply = agent.get_messages()[-1]
    assert tool_part(reply, "p").state == "output-available"
    assert texts(agent)[-1] == ("assistant", "half of and the rest")  # no step twice


# -- answers racing, and continuations ended before they applied their answers (review,
# 2026-12-07; each test fails on the code before that day) -------------------------------------


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_two_tabs_answering_both_approvals_at_once_let_the_continuation_run(
    jobs: ThinkJobs,
) -> None:
    """Two answers, one per approval of one continuation, committed at once (two browser
    tabs). Each transaction counted the other's approval still open (READ COMMITTED), so
    neither released the continuation: it and every later turn of the agent waited for good
    (20 to 33 of 40 agents per run). The continuation's row is now locked before the count."""
    chosen = [jobs.get_agent(TwoCalls, f"tabs-{n}") for n in range(20)]
    for agent in chosen:
        agent.submit_messages([user("pay twice")])
    with worker(jobs):
        asked = [_asked_two(agent) for agent in chosen]
    for agent, (one, two) in zip(chosen, asked, strict=True):
        other_tab = jobs.get_agent(TwoCalls, agent.name)
        barrier = threading.Barrier(2)

        def answer(tab: Think, approval: Approval, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            tab.respond_to_approval(approval.approval_id, True)

        tabs = [
            threading.Thread(target=answer, args=(agent, one)),
            threading.Thread(target=answer, args=(other_tab, two)),
        ]
        for tab in tabs:
            tab.start()
        for tab in tabs:
            tab.join(30)
    with worker(jobs):
        for agent, (one, _) in zip(chosen, asked, strict=True):
            wait_for_status(agent, one.continuation_id, "completed")


@pytest.mark.parametrize("how", ["cancel", "reset"])
def test_an_answered_approval_whose_continuation_never_ran_leaves_no_open_call(
    jobs: ThinkJobs, how: str
) -> None:
    """Approved, then stopped before a worker ran the continuation (the chat's stop button
    cancels it: an answered continuation is the active turn), or a reset skipped it. Its
    tool never ran, and the stored call is denied, saying so — it stayed
    ``approval-requested``, and a client showed the buttons again."""
    agent = jobs.get_agent(Payer, "approved-then-stopped")
    agent.submit_messages([user("pay the invoice")])
    with worker(jobs):
        (approval,) = wait_until(lambda: _one_pending(agent))
    agent.respond_to_approval(approval.approval_id, True)
    if how == "reset":
        agent.reset_turn_state()
    else:
        agent.cancel_submission(approval.continuation_id)
    later = agent.submit_messages([user("and then?")])
    with worker(jobs):
        wait_for_status(agent, later.submission_id, "completed")
    assert RAN == []
    part = tool_part(agent.get_messages()[1], "call-1")
    assert part.state == "output-denied"
    assert part.approval is not None and part.approval.reason == NOT_RUN_REASON
    assert texts(agent)[2:] == [("user", "and then?"), ("assistant", "second answer")]


def _asked_two(agent: Think) -> list[Approval]:
    found: list[Approval] = wait_until(lambda: _two_pending(agent))
    return found


def _one_pending(agent: Think) -> list[Approval]:
    found = agent.list_approvals("pending")
    return found if len(found) == 1 else []


class ApprovedHanger(Think):
    """Asked ``hang``: calls a tool that needs approval and hangs until the test lets it go."""

    def get_model(self) -> ScriptedModel:
        def script(request: ModelRequest) -> Reply:
            if message_text(request.messages[-1]) == "hang":
                return Reply(tool_calls=[ToolCall("hang", id="h1")], then=Reply(text="done"))
            return Reply(text="ok")

        return ScriptedModel(script)

    def get_tools(self) -> dict[str, Tool]:
        @tool(needs_approval=True)
        def hang() -> str:
            """Waits until the test lets it go."""
            return held("hang", "finally")

        return {"hang": hang}


@pytest.mark.usefixtures("gates")
def test_a_continuation_cancelled_inside_its_approved_tool_stores_the_answered_reply(
    jobs: ThinkJobs,
) -> None:
    """The approved tool hangs, the user stops the continuation, a reader ends its stream
    from the database (no chunk of it went out). What the tool returns after that end is in
    no stream, so the stored reply is the one the answering client holds: the call approved
    (``approval-responded``), not left ``approval-requested`` as if never answered."""
    jobs.register(ApprovedHanger)
    agent = jobs.get_agent(ApprovedHanger, "stopped-in-an-approved-tool")
    agent.submit_messages([user("hang")])
    with worker(jobs):
        (approval,) = wait_until(lambda: _one_pending(agent))
        agent.respond_to_approval(approval.approval_id, True)
        assert HUNG.wait(30)
        agent.cancel_submission(approval.continuation_id)
        events = list(agent.stream(approval.continuation_id, timeout_s=20))
        UNHANG.set()
        later = agent.submit_messages([user("next")])
        wait_for_status(agent, later.submission_id, "completed")
    assert TOOL_RUNS == ["hang"]
    assert events[-1].done and events[-1].status == "aborted"
    part = tool_part(agent.get_messages()[1], "h1")
    assert part.state == "approval-responded"
    assert part.approval is not None and part.approval.approved is True


class FailsToContinue(Payer):
    """Its ``before_turn`` raises for an approval's continuation."""

    def before_turn(self, ctx: Any) -> None:
        if ctx.trigger == "approval":
            raise RuntimeError("before_turn of the continuation failed")


def test_a_continuation_that_fails_before_its_model_leaves_no_open_call(jobs: ThinkJobs) -> None:
    """Approved, but the continuation's ``before_turn`` raises: the tool never runs, and the
    call is denied in the stored reply and in the stream (it stayed ``approval-requested``)."""
    agent = jobs.get_agent(FailsToContinue, "fails-to-continue")
    agent.submit_messages([user("pay")])
    with worker(jobs):
        (approval,) = wait_until(lambda: _one_pending(agent))
        agent.respond_to_approval(approval.approval_id, True)
        done = wait_for_status(agent, approval.continuation_id, "error")
        events = list(agent.stream(approval.continuation_id, timeout_s=20))
        later = agent.submit_messages([user("and then?")])
        wait_for_status(agent, later.submission_id, "completed")
    assert done.error == "before_turn of the continuation failed" and RAN == []
    assert tool_part(agent.get_messages()[1], "call-1").state == "output-denied"
    kinds = [event.chunk["type"] for event in events if event.chunk is not None]
    assert kinds == ["tool-output-denied", "error"]
