"""What a model is shown (SPEC §4, issue 16 item 13): the conversation as stored, and never an
empty assistant message on a turn's first step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from tests.support.builders import user
from think_jobs import Think, ThinkJobs
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall
from think_jobs.tools import Tool, tool


class Seen:
    """Each step's ``request.messages`` as (role, part types) pairs."""

    requests: ClassVar[list[list[tuple[str, list[str]]]]] = []


class SpyModel:
    """Records what it is shown, then answers with a tool call on step 0 and text after."""

    def stream(self, request: ModelRequest) -> Iterator[Any]:
        Seen.requests.append([(m.role, [p.type for p in m.parts]) for m in request.messages])
        reply = Reply(text="Checking. ", tool_calls=[ToolCall("lookup", {"q": "x"})])
        yield from ScriptedModel(reply if request.step == 0 else "Done.").stream(request)


class Spied(Think):
    def get_model(self) -> SpyModel:
        return SpyModel()

    def get_tools(self) -> dict[str, Tool]:
        @tool
        def lookup(q: str) -> str:
            """Look something up."""
            return f"found {q}"

        return {"lookup": lookup}


def test_the_first_step_ends_with_the_new_user_message(jobs: ThinkJobs) -> None:
    Seen.requests.clear()
    agent = jobs.get_agent(Spied, "spy")
    assert agent.save_messages([user("Hi")]).status == "completed"
    assert agent.save_messages([user("Again")]).status == "completed"
    first_turn_step0, first_turn_step1, second_turn_step0, _ = Seen.requests
    assert first_turn_step0 == [("user", ["text"])]
    assert second_turn_step0[-1] == ("user", ["text"])
    assert [role for role, _ in second_turn_step0] == ["user", "assistant", "user"]
    # A later step of the same turn does show the reply so far (the tool call and its output).
    assert first_turn_step1[-1][0] == "assistant"
    assert "tool-lookup" in first_turn_step1[-1][1]
