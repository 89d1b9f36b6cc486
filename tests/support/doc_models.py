"""The model that stands in for ``OpenAIChatModel`` when the documentation's blocks run.

It is ``ScriptedModel`` with a reply chosen from the request: on the first step of a turn
with tools it calls the first tool (string arguments filled in from the tool's schema), then
it answers in words. Only the documentation test installs it (``doc_standins/sitecustomize``).
"""

from __future__ import annotations

from typing import Any

from think_jobs import models
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall


def stand_in_reply(request: ModelRequest) -> Reply:
    if request.tools and request.step == 0:
        name, tool = next(iter(request.tools.items()))
        return Reply(text="Let me check. ", tool_calls=[ToolCall(name, _arguments(tool))])
    return Reply(text=f"(a stand-in for {request.system[:40]!r}) All good.")


def _arguments(tool: Any) -> dict[str, Any]:
    schema = tool.input_schema
    required = schema.get("required", [])
    return {key: "what the docs ask" for key in required}


class StandInChatModel(ScriptedModel):
    """Takes ``OpenAIChatModel``'s arguments, answers like ``stand_in_reply``."""

    def __init__(self, model: str = "", **_options: Any) -> None:
        super().__init__(stand_in_reply)
        self.model = model


def install() -> None:
    models.OpenAIChatModel = StandInChatModel  # type: ignore[misc,assignment]
