"""The model loop's side of tool approvals (SPEC §13), without services: a call of a tool that
needs approval is not run and ends the loop after its step; the answers a continuation brings
run the tool or deny it; a model may not send the approval chunks itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from think_jobs import tool
from think_jobs.assembly import MessageAssembler
from think_jobs.chunks import Chunk
from think_jobs.domain.records import ApprovalAnswer
from think_jobs.engine.model_loop import RunOutcome, TurnRunner
from think_jobs.messages import ToolPart
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall
from think_jobs.tools import Tool

RAN: list[int] = []


def _raises(raw: Mapping[str, Any]) -> bool:
    raise RuntimeError("the rule broke")


def tools(rule: Any) -> dict[str, Tool]:
    @tool(needs_approval=rule)
    def pay(amount: int) -> int:
        """Pay."""
        RAN.append(amount)
        return amount

    return {"pay": pay}


def run(
    model: Any,
    rule: Any = True,
    *,
    assembler: MessageAssembler | None = None,
    answers: list[ApprovalAnswer] | None = None,
    first_step: int = 0,
) -> tuple[RunOutcome, list[Chunk]]:
    sent: list[Chunk] = []
    runner = TurnRunner(
        model=model,
        request=ModelRequest(system="", messages=[], tools=tools(rule)),
        assembler=assembler or MessageAssembler("m"),
        emit=sent.append,
        should_stop=lambda: False,
        max_steps=5,
        answers=answers or [],
        first_step=first_step,
    )
    return runner.run(), sent


def script(amount: int = 500) -> ScriptedModel:
    call = ToolCall("pay", {"amount": amount}, id="c")
    return ScriptedModel(lambda _request: Reply(tool_calls=[call], then=Reply("done")))


def test_a_call_that_needs_approval_is_not_run_and_ends_the_loop() -> None:
    RAN.clear()
    outcome, sent = run(script())
    assert outcome.status == "completed" and RAN == []
    (asked,) = outcome.asked
    assert (asked.tool_name, asked.tool_call_id, asked.input) == ("pay", "c", {"amount": 500})
    kinds = [chunk.type for chunk in sent]
    assert kinds.count("start-step") == 1 and kinds[-2:] == ["tool-approval-request", "finish"]
    (part,) = [p for p in outcome.message.parts if isinstance(p, ToolPart)]
    assert part.state == "approval-requested" and part.approval is not None
    assert part.approval.id == asked.approval_id


def test_a_rule_decides_per_input_and_a_rule_that_raises_asks() -> None:
    RAN.clear()
    small, _ = run(script(5), lambda raw: raw["amount"] > 100)
    assert small.asked == () and RAN == [5]
    broken, _ = run(script(5), _raises)
    assert len(broken.asked) == 1 and RAN == [5]


def test_answers_run_the_tool_or_deny_it_and_the_steps_go_on() -> None:
    RAN.clear()
    first, _ = run(script())
    (asked,) = first.asked
    for approved, state in ((True, "output-available"), (False, "output-denied")):
        seeded = MessageAssembler("m", parts=first.message.parts)
        answer = ApprovalAnswer(asked.approval_id, "c", approved, None if approved else "no")
        outcome, sent = run(script(), assembler=seeded, answers=[answer], first_step=1)
        (part,) = [p for p in outcome.message.parts if isinstance(p, ToolPart)]
        assert part.state == state and outcome.asked == ()
        assert part.approval is not None and part.approval.approved is approved
        texts = [c for c in sent if c.type == "text-delta"]
        assert len(texts) == 1  # step 1 of the script: "done"
    assert RAN == [500]


def test_a_model_may_not_send_approval_chunks() -> None:
    class Forger:
        def stream(self, request: ModelRequest) -> Any:
            yield {"type": "tool-input-available", "toolCallId": "x", "toolName": "pay"}
            yield {"type": "tool-approval-request", "approvalId": "fake", "toolCallId": "x"}

    outcome, _ = run(Forger())
    assert outcome.status == "error" and outcome.error is not None
    assert "approvals come from tools declared with needs_approval" in outcome.error
