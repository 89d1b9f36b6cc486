"""Deterministic models for tests and demos: the only fake model think-jobs ships.

``ScriptedModel`` answers from a script chosen by the conversation itself (not process memory),
so a worker in another process gives the same reply: the Nth turn of a conversation (counted by
its assistant messages) gets the Nth reply, and the last reply repeats. A reply can stream
slowly, stall, fail in-band or by raising, and call tools. Waits happen on the turn's abort
signal, so a cancelled turn stops at once.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from think_jobs.messages import UIMessage, message_text
from think_jobs.models.base import ModelRequest

_WORDS = re.compile(r"\S+\s*|\s+")


@dataclass(frozen=True)
class ToolCall:
    """A tool call the scripted model makes; ``id`` defaults to ``call-<step>-<index>``."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """What the scripted model streams for one step.

    ``text`` is split into words (or ``chunk_size`` characters); ``delay_s`` waits before each
    chunk; ``stall_after`` stops after that many text chunks and waits until aborted;
    ``error`` streams an in-band error chunk after the text; ``raise_error`` raises
    ``RuntimeError`` after the text; ``tool_calls`` are made after the text, and ``then`` is
    the reply of the next step (after the tools ran).
    """

    text: str = ""
    reasoning: str | None = None
    chunk_size: int | None = None
    delay_s: float = 0.0
    stall_after: int | None = None
    error: str | None = None
    raise_error: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    then: Reply | None = None

    def for_step(self, step: int) -> Reply | None:
        reply: Reply | None = self
        for _ in range(step):
            reply = reply.then if reply is not None else None
        return reply


ScriptItem = str | Reply
Script = ScriptItem | Sequence[ScriptItem] | Callable[[ModelRequest], ScriptItem]


def _as_reply(item: ScriptItem) -> Reply:
    return Reply(text=item) if isinstance(item, str) else item


def _pieces(reply: Reply) -> list[str]:
    if reply.chunk_size:
        size = reply.chunk_size
        return [reply.text[i : i + size] for i in range(0, len(reply.text), size)]
    return _WORDS.findall(reply.text)


def completed_turns(request: ModelRequest) -> int:
    """How many assistant replies came before this turn (the reply being built excluded)."""
    count = sum(1 for message in request.messages if message.role == "assistant")
    return count - 1 if request.step > 0 else count


class ScriptedModel:
    """A model that streams scripted replies (see the module docstring)."""

    def __init__(self, script: Script) -> None:
        self._script = script

    def reply_for(self, request: ModelRequest) -> Reply | None:
        if callable(self._script):
            return _as_reply(self._script(request)).for_step(request.step)
        items = [self._script] if isinstance(self._script, str | Reply) else list(self._script)
        index = min(completed_turns(request), len(items) - 1)
        return _as_reply(items[index]).for_step(request.step)

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        reply = self.reply_for(request)
        if reply is None:
            return
        if reply.reasoning:
            yield from _block("reasoning", f"r{request.step}", [reply.reasoning])
        yield from self._text(reply, request)
        yield from _tool_calls(reply, request.step)
        if reply.error is not None:
            yield {"type": "error", "errorText": reply.error}
        if reply.raise_error is not None:
            raise RuntimeError(reply.raise_error)

    def _text(self, reply: Reply, request: ModelRequest) -> Iterator[dict[str, Any]]:
        pieces = _pieces(reply)
        if not pieces:
            return
        block = f"t{request.step}"
        yield {"type": "text-start", "id": block}
        for count, piece in enumerate(pieces):
            if reply.stall_after is not None and count >= reply.stall_after:
                request.signal.wait()
                return
            if reply.delay_s and request.signal.wait(reply.delay_s):
                return
            yield {"type": "text-delta", "id": block, "delta": piece}
        yield {"type": "text-end", "id": block}


def _block(kind: str, block: str, pieces: list[str]) -> Iterator[dict[str, Any]]:
    yield {"type": f"{kind}-start", "id": block}
    for piece in pieces:
        yield {"type": f"{kind}-delta", "id": block, "delta": piece}
    yield {"type": f"{kind}-end", "id": block}


def _tool_calls(reply: Reply, step: int) -> Iterator[dict[str, Any]]:
    for index, call in zip(itertools.count(), reply.tool_calls, strict=False):
        call_id = call.id or f"call-{step}-{index}"
        yield {"type": "tool-input-start", "toolCallId": call_id, "toolName": call.name}
        yield {
            "type": "tool-input-available",
            "toolCallId": call_id,
            "toolName": call.name,
            "input": call.input,
        }


class EchoModel:
    """Replies with the text of the last user message, prefixed by ``prefix``."""

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        text = self._prefix + _last_user_text(request.messages)
        return ScriptedModel(text).stream(request)


def _last_user_text(messages: Sequence[UIMessage]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            return message_text(message)
    return ""
