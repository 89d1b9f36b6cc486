"""An agent whose tool hangs where no signal reaches (as one without a timeout does on a
server that never answers), and the gates a test holds it with: ``HUNG`` is set once the tool
was entered, ``UNHANG`` lets it return (the ``gates`` fixture of tests/integration clears
them and lets every hung call go at the end of a test)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from think_jobs import Think
from think_jobs.messages import message_text
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall
from think_jobs.signals import AbortSignal
from think_jobs.tools import tool

HUNG = threading.Event()  # the tool has been entered
UNHANG = threading.Event()  # the test lets it return
TOOL_RUNS: list[str] = []
TURN_SIGNALS: list[AbortSignal] = []  # the turn's own signal, as a model call was given it


def held(name: str, result: str) -> str:
    """What a hung tool does: say it was entered, then wait until the test lets it go."""
    TOOL_RUNS.append(name)
    HUNG.set()
    assert UNHANG.wait(60), f"the test never let the {name} tool go"
    return result


@contextmanager
def gates() -> Iterator[None]:
    """Fresh gates and tool runs for a test; whatever happens, its hung call is let go."""
    HUNG.clear()
    UNHANG.clear()
    TOOL_RUNS.clear()
    TURN_SIGNALS.clear()
    try:
        yield
    finally:
        UNHANG.set()


def hang_or_answer(request: ModelRequest) -> Reply:
    """Asked ``hang``: call the hung tool, then say ``done``; otherwise answer ``ok``."""
    if message_text(request.messages[-1]) == "hang":
        return Reply(tool_calls=[ToolCall("hang")], then=Reply(text="done"))
    return Reply(text="ok")


class Hanger(Think):
    """Calls a tool that hangs (as one without a timeout does on a server that never answers)
    when asked ``hang``; answers ``ok`` otherwise."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(hang_or_answer)

    def get_tools(self) -> dict[str, Any]:
        @tool
        def hang() -> str:
            """Waits until the test lets it go."""
            return held("hang", "finally")

        return {"hang": hang}


class StallingHanger(Hanger):
    """``Hanger`` with a stall timeout its hung tool outlasts: the stall stops the attempt
    first, inside the tool. Each model call's signal is kept in ``TURN_SIGNALS``."""

    stall_timeout_s = 0.3

    def get_model(self) -> ScriptedModel:
        def script(request: ModelRequest) -> Reply:
            TURN_SIGNALS.append(request.signal)
            return hang_or_answer(request)

        return ScriptedModel(script)
