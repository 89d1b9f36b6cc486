"""A stored assistant reply as UI message stream chunks: how a stream is rebuilt from the database.

The database is the truth and a turn's Redis stream its cache. When the cache is gone (its TTL
passed, Redis restarted empty) or never got its tail (the writer could not reach Redis), the
stream is rebuilt from the stored reply:

- ``render(message)``: the chunks that assemble into ``message`` (what a reader that saw
  nothing gets);
- ``suffix(prefix, message)``: the chunks that, after the chunks a stream already holds,
  assemble into ``message`` — or None when the stored reply does not extend what the stream
  shows (then only the ``done`` event can be added).

An approval's continuation streams only what it adds to the reply it answers: its chunks apply
to that reply as a client holds it (``base``: the asking turn's reply with the answers
recorded), as ``useChat`` continues the message. ``extension(message, base)`` is such a stream
from its start, and every function here takes the ``base`` its chunks apply to.

Both are checked by assembling their result: what they return always rebuilds the reply
exactly. Pure functions: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from think_jobs.assembly import MessageAssembler
from think_jobs.errors import MessageValidationError
from think_jobs.messages import (
    AWAITING_ANSWER,
    DataPart,
    DynamicToolPart,
    FilePart,
    Part,
    ReasoningPart,
    SourceDocumentPart,
    SourceUrlPart,
    StepStartPart,
    TextPart,
    ToolPart,
    UIMessage,
)

Wire = dict[str, Any]
_BLOCK_KINDS = {"text": "text", "reasoning": "reasoning"}
_SKIPPED = frozenset({"abort", "error"})  # interruptions: not part of the reply


def render(message: UIMessage, *, finished: bool = True) -> list[Wire]:
    """Chunks that assemble into ``message``: ``start``, its parts, ``finish``."""
    start: Wire = {"type": "start", "messageId": message.id}
    if message.metadata is not None:
        start["messageMetadata"] = message.metadata
    chunks = [start, *_Renderer().parts(message.parts)]
    return [*chunks, {"type": "finish"}] if finished else chunks


def extension(message: UIMessage, base: UIMessage, *, finished: bool = True) -> list[Wire] | None:
    """Chunks that, applied to ``base``, assemble into ``message``: ``start``, what it adds,
    ``finish`` (an approval's continuation, rebuilt); None when ``message`` does not extend
    ``base``."""
    rest = suffix([], message, finished=finished, base=base)
    return None if rest is None else [{"type": "start", "messageId": message.id}, *rest]


def suffix(
    prefix: Iterable[Mapping[str, Any]],
    message: UIMessage,
    *,
    finished: bool = True,
    base: UIMessage | None = None,
) -> list[Wire] | None:
    """Chunks that complete ``prefix`` (the chunks a stream holds, applied to ``base``) into
    ``message``, ending with ``finish`` when the turn completed and the prefix has none."""
    raw = [dict(chunk) for chunk in prefix if chunk.get("type") not in _SKIPPED]
    try:
        shown = assemble(raw, message.id, base=base)
    except MessageValidationError:
        return None
    chunks = _continue(raw, shown, message, finished=finished)
    if chunks is None or not rebuilds(raw + chunks, message, base=base):
        return None
    return chunks


def assemble(
    chunks: Iterable[Mapping[str, Any]], message_id: str, *, base: UIMessage | None = None
) -> UIMessage:
    """The message a client builds from ``chunks`` applied to ``base`` (None: to nothing),
    interruptions skipped."""
    if base is None:
        assembler = MessageAssembler(message_id)
    else:
        assembler = MessageAssembler(message_id, metadata=base.metadata, parts=base.parts)
    for chunk in chunks:
        if chunk.get("type") not in _SKIPPED:
            assembler.feed(chunk)
    return assembler.message


def rebuilds(
    chunks: Iterable[Mapping[str, Any]], message: UIMessage, *, base: UIMessage | None = None
) -> bool:
    """Whether ``chunks`` applied to ``base`` assemble into exactly ``message`` (parts and
    metadata)."""
    try:
        built = assemble(chunks, message.id, base=base)
    except MessageValidationError:
        return False
    return built.parts == message.parts and built.metadata == message.metadata


# -- completing a prefix -----------------------------------------------------------------------


def _continue(
    raw: list[Wire], shown: UIMessage, message: UIMessage, *, finished: bool
) -> list[Wire] | None:
    have, want = shown.parts, message.parts
    if len(have) > len(want):
        return None
    renderer = _Renderer.after(raw)
    chunks: list[Wire] = []
    for index, (part, stored) in enumerate(zip(have, want, strict=False)):
        if part == stored:
            continue
        if index == len(have) - 1:  # the last part may be any part left open
            tail = renderer.finish_part(part, stored)
        else:  # before it only a tool call can still change: its chunks name their call
            tail = _grow_any_tool(part, stored)
        if tail is None:
            return None
        chunks += tail
    chunks += renderer.parts(want[len(have) :])
    if shown.metadata != message.metadata and message.metadata is not None:
        chunks.append({"type": "message-metadata", "messageMetadata": message.metadata})
    if finished and not any(chunk.get("type") == "finish" for chunk in raw):
        chunks.append({"type": "finish"})
    return chunks


# -- rendering parts ---------------------------------------------------------------------------


@dataclass
class _Renderer:
    """Turns parts into chunks, keeping track of the open step and the open text blocks."""

    step_open: bool = False
    open_blocks: dict[str, str] = field(default_factory=dict)  # kind -> id of the open block
    next_id: int = 0

    @classmethod
    def after(cls, raw: list[Wire]) -> _Renderer:
        """A renderer that continues the stream ``raw`` (its open step and blocks)."""
        renderer = cls(next_id=len(raw))
        for chunk in raw:
            renderer._track(chunk)
        return renderer

    def _track(self, chunk: Wire) -> None:
        kind = str(chunk.get("type", ""))
        if kind == "start-step":
            self.step_open = True
        elif kind == "finish-step":
            self.step_open = False
            self.open_blocks.clear()
        elif kind.endswith("-start") and kind[: -len("-start")] in _BLOCK_KINDS:
            self.open_blocks[kind[: -len("-start")]] = str(chunk.get("id"))
        elif kind.endswith("-end") and kind[: -len("-end")] in _BLOCK_KINDS:
            self.open_blocks.pop(kind[: -len("-end")], None)

    def parts(self, parts: Iterable[Part]) -> list[Wire]:
        """The chunks of ``parts``, closing the step they leave open (if they added any)."""
        chunks = [chunk for part in parts for chunk in self.part(part)]
        if chunks and self.step_open:
            chunks.append({"type": "finish-step"})
            self.step_open = False
        return chunks

    def part(self, part: Part) -> list[Wire]:
        if isinstance(part, StepStartPart):
            return self._step()
        if isinstance(part, TextPart | ReasoningPart):
            return self._block(part)
        if isinstance(part, ToolPart | DynamicToolPart):
            return _tool(part)
        return [_simple(part)]

    def _step(self) -> list[Wire]:
        chunks: list[Wire] = [{"type": "finish-step"}] if self.step_open else []
        self.step_open = True
        self.open_blocks.clear()
        return [*chunks, {"type": "start-step"}]

    def _block(self, part: TextPart | ReasoningPart) -> list[Wire]:
        self.next_id += 1
        block_id = f"replay-{self.next_id}"
        head = _with_metadata({"type": f"{part.type}-start", "id": block_id}, part)
        chunks = [head, *_delta(part.type, block_id, part.text)]
        if part.state == "streaming":
            self.open_blocks[part.type] = block_id
            return chunks
        return [*chunks, {"type": f"{part.type}-end", "id": block_id}]

    def finish_part(self, have: Part, want: Part) -> list[Wire] | None:
        """Chunks that turn the stream's last part ``have`` into the stored ``want``."""
        if isinstance(have, TextPart | ReasoningPart) and type(have) is type(want):
            assert isinstance(want, TextPart | ReasoningPart)
            return self._grow(have, want)
        return _grow_any_tool(have, want)

    def _grow(
        self, have: TextPart | ReasoningPart, want: TextPart | ReasoningPart
    ) -> list[Wire] | None:
        block_id = self.open_blocks.get(have.type)
        if block_id is None or not want.text.startswith(have.text):
            return None
        chunks = _delta(have.type, block_id, want.text[len(have.text) :])
        if want.state != "streaming":
            self.open_blocks.pop(have.type)
            chunks.append({"type": f"{have.type}-end", "id": block_id})
        return chunks


def _grow_any_tool(have: Part, want: Part) -> list[Wire] | None:
    if isinstance(have, ToolPart | DynamicToolPart) and type(have) is type(want):
        assert isinstance(want, ToolPart | DynamicToolPart)
        return _grow_tool(have, want)
    return None


def _grow_tool(
    have: ToolPart | DynamicToolPart, want: ToolPart | DynamicToolPart
) -> list[Wire] | None:
    if have.tool_call_id != want.tool_call_id:
        return None
    if have.state == "input-streaming":  # its input had not arrived yet
        return [chunk for chunk in _tool(want) if chunk["type"] != "tool-input-start"]
    return _tool_outcome(want, asked=have.state in AWAITING_ANSWER)


def _delta(kind: str, block_id: str, text: str) -> list[Wire]:
    return [{"type": f"{kind}-delta", "id": block_id, "delta": text}] if text else []


def _with_metadata(chunk: Wire, part: TextPart | ReasoningPart) -> Wire:
    if part.provider_metadata is not None:
        chunk["providerMetadata"] = part.provider_metadata
    return chunk


def _tool(part: ToolPart | DynamicToolPart) -> list[Wire]:
    name = part.tool_name
    common: Wire = {"toolCallId": part.tool_call_id, "toolName": name}
    if isinstance(part, DynamicToolPart):
        common["dynamic"] = True
    if part.provider_executed is not None:
        common["providerExecuted"] = part.provider_executed
    if part.state == "input-streaming":
        return [{"type": "tool-input-start", **common}]
    available = {"type": "tool-input-available", **common, "input": part.input}
    if part.call_provider_metadata is not None:
        available["providerMetadata"] = part.call_provider_metadata
    return [available, *_tool_outcome(part)]


def _tool_outcome(part: ToolPart | DynamicToolPart, *, asked: bool = False) -> list[Wire]:
    """The chunks of the call's outcome (``asked``: its approval request was shown)."""
    base: Wire = {"toolCallId": part.tool_call_id}
    if part.provider_executed is not None:
        base["providerExecuted"] = part.provider_executed
    if part.state == "output-available":
        output = {"type": "tool-output-available", **base, "output": part.output}
        return [output if part.preliminary is None else {**output, "preliminary": part.preliminary}]
    if part.state == "output-error":
        return [{"type": "tool-output-error", **base, "errorText": part.error_text or ""}]
    return _approval_outcome(part, asked=asked)


def _approval_outcome(part: ToolPart | DynamicToolPart, *, asked: bool) -> list[Wire]:
    """An approval asked (unless ``asked``) and, once answered, a denial, as the AI SDK's
    chunks say them."""
    call: Wire = {"toolCallId": part.tool_call_id}
    if part.approval is None or part.state not in _APPROVAL_STATES:
        return []
    request: Wire = {"type": "tool-approval-request", "approvalId": part.approval.id, **call}
    chunks = [] if asked else [request]
    if part.state == "output-denied":
        return [*chunks, {"type": "tool-output-denied", **call}]
    return chunks


_APPROVAL_STATES = frozenset({"approval-requested", "approval-responded", "output-denied"})


def _simple(part: SourceUrlPart | SourceDocumentPart | FilePart | DataPart) -> Wire:
    """Parts whose chunk carries the same fields as the part."""
    wire: Wire = json.loads(part.model_dump_json(by_alias=True, exclude_none=True))
    if isinstance(part, FilePart):
        wire.pop("filename", None)  # a file chunk carries no file name
    return wire
