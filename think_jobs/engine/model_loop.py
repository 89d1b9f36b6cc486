"""One turn of the model: framing, the tool loop, cancellation checks. No Celery, no SQL.

The runner pulls chunks from the model step by step, frames them (``start``, ``start-step``,
``finish-step``, ``finish``), feeds them to the assembler that builds the assistant message,
hands each to ``emit`` (which publishes it), and checks ``should_stop`` between chunks and
before each model call and tool, so a cancelled turn stops within one chunk (the attempt
confirms its lease there too). Server tools run between steps.

A call of a tool that needs approval is not run: its part gets ``tool-approval-request`` and
the loop ends after that step (``RunOutcome.asked``); the turn's continuation later applies
the answers (``answers``: run the tool, or ``tool-output-denied``) before the model goes on.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from think_jobs.assembly import MessageAssembler
from think_jobs.chunks import (
    FRAMING_CHUNK_TYPES,
    AbortChunk,
    Chunk,
    DataChunk,
    ErrorChunk,
    FinishChunk,
    FinishStepChunk,
    ReasoningDeltaChunk,
    StartChunk,
    StartStepChunk,
    TextDeltaChunk,
    TextEndChunk,
    TextStartChunk,
    ToolApprovalRequestChunk,
    ToolOutputAvailableChunk,
    ToolOutputDeniedChunk,
    ToolOutputErrorChunk,
    parse_chunk,
)
from think_jobs.domain.records import ApprovalAnswer, ApprovalAsked
from think_jobs.domain.status import FinalStatus
from think_jobs.engine.reply_bounds import ReplyBounds, ReplyTooLarge
from think_jobs.engine.surrogates import PairJoiner
from think_jobs.limits import (
    DEFAULT_LIMITS,
    ID_MAX_CHARS,
    Limits,
    has_control_characters,
    is_unicode,
    value_problem,
    well_formed,
)
from think_jobs.messages import (
    AWAITING_ANSWER,
    DynamicToolPart,
    Part,
    ToolApproval,
    ToolPart,
    UIMessage,
    message_bytes,
)
from think_jobs.models.base import Model, ModelRequest
from think_jobs.observe import tracing
from think_jobs.tools import Tool

log = logging.getLogger(__name__)

Emit = Callable[[Chunk], None]
RunStatus = FinalStatus


@dataclass(frozen=True)
class RunOutcome:
    status: RunStatus
    error: str | None
    message: UIMessage
    has_content: bool
    asked: tuple[ApprovalAsked, ...] = ()  # tool calls waiting for a human's approval


class _Stopped(Exception):
    """Raised inside the loop when ``should_stop`` turns true."""


class _ModelFailed(Exception):
    """The model raised, or streamed an ``error`` chunk (then ``streamed`` is True)."""

    def __init__(self, message: str, *, streamed: bool = False) -> None:
        super().__init__(well_formed(message))  # it is streamed and stored as the turn's error
        self.streamed = streamed


@dataclass
class TurnRunner:
    model: Model
    request: ModelRequest
    assembler: MessageAssembler
    emit: Emit
    should_stop: Callable[[], bool]
    max_steps: int
    limits: Limits = DEFAULT_LIMITS  # JSON depth a chunk may carry; the reply's bytes and parts
    answers: Sequence[ApprovalAnswer] = ()  # a continuation's answered approvals
    first_step: int = 0  # steps the reply already has (a continuation goes on counting)
    in_tool: Callable[[bool], None] = lambda running: None  # told as a tool starts and ends
    stop_error: Callable[[], str | None] = lambda: None  # a stop that is an error: its text
    asked: list[ApprovalAsked] = field(default_factory=list, init=False)
    bounds: ReplyBounds = field(init=False)

    def __post_init__(self) -> None:
        self.assembler.json_depth = self.limits.json_depth  # for tool inputs left streaming
        self.bounds = ReplyBounds(
            self.limits.message_bytes,
            self.limits.parts_per_message,
            measure=lambda: message_bytes(self.assembler.message),
            parts=lambda: self.assembler.part_count,
        )

    def run(self) -> RunOutcome:
        """Run the whole tool loop; never raises for model or tool failures."""
        self._send(StartChunk(message_id=self.assembler.message_id))
        try:
            self._apply_answers()
            self._steps()
        except _Stopped:
            error = self.stop_error()
            if error is None:
                return self._aborted()
            self._end_unanswered(error)
            self.emit(ErrorChunk(error_text=error))
            return self._outcome("error", error)
        except _ModelFailed as failure:
            if not failure.streamed:
                self.emit(ErrorChunk(error_text=str(failure)))
            return self._outcome("error", str(failure))
        self._send(FinishChunk())
        return self._outcome("completed", None)

    def _steps(self) -> None:
        for step in range(self.first_step, self.first_step + self.max_steps):
            self._check_stop()
            self._add(StartStepChunk())
            with tracing.span("think_jobs.model_step", attributes={"think_jobs.step": step}):
                self._stream_step(step)
            self._add(FinishStepChunk())
            if not self._run_pending_tools() or self.asked:
                return

    def _apply_answers(self) -> None:
        """Answered approvals of tool calls still waiting: run the tool, or say it was denied."""
        if not self.answers:
            return
        waiting = {part.tool_call_id: part for part in _tool_calls(self.assembler, AWAITING_ANSWER)}
        for answer in self.answers:
            part = waiting.get(answer.tool_call_id)
            if part is None:
                continue  # answered by an earlier attempt of this continuation
            self._check_stop()
            approval = ToolApproval(
                id=answer.approval_id, approved=answer.approved, reason=answer.reason
            )
            self.assembler.respond(part.tool_call_id, approval)
            if answer.approved:
                self._add_output(self._run_tool(part))
            else:
                self._send(ToolOutputDeniedChunk(tool_call_id=part.tool_call_id))

    def _stream_step(self, step: int) -> None:
        request = replace(self.request, messages=self._conversation(), step=step)
        stream = _iterate(self.model, request)
        joiner = PairJoiner()
        try:
            for raw in stream:
                self._take(_parse_model_chunk(raw, self.limits.json_depth), joiner)
            for replacement in joiner.rest():  # a half character the model never finished
                self._add(replacement)
            self._check_stop()  # a model that saw the signal may simply end its stream
        except (_Stopped, _ModelFailed):
            raise
        except Exception as error:
            raise _ModelFailed(_describe(error)) from error
        finally:
            _close(stream)

    def _take(self, chunk: Chunk, joiner: PairJoiner) -> None:
        """One chunk of the model's: a delta joined with a half character held from the one
        before it, then every chunk's text made well-formed."""
        if isinstance(chunk, TextDeltaChunk | ReasoningDeltaChunk):
            joined = joiner.delta(chunk)
            if joined is None:
                return
            chunk = joined
        else:
            replacement = joiner.ending(chunk)
            if replacement is not None:
                self._add(replacement)
        chunk = _well_formed(chunk)
        if isinstance(chunk, ErrorChunk):
            self.emit(chunk)
            raise _ModelFailed(chunk.error_text, streamed=True)
        self._add(chunk)
        self._check_stop()

    def _conversation(self) -> list[UIMessage]:
        """The request's messages, plus this turn's reply so far once it has content (a
        reply that is only its ``step-start`` is not shown to the model: SPEC §4)."""
        if not self.assembler.has_content:
            return list(self.request.messages)
        return [*self.request.messages, self.assembler.message]

    def _run_pending_tools(self) -> bool:
        """Execute server tools whose input is available (or ask for their approval); True if
        any ran or waits (the model is called again, unless an approval is waited for)."""
        ran = False
        for part in _tool_calls(self.assembler, ("input-available",)):
            tool = self.request.tools.get(part.tool_name)
            if tool is None and part.provider_executed:
                continue
            self._check_stop()
            if tool is not None and _needs_approval(tool, part.input):
                self._ask(part)
            else:
                self._add_output(self._run_tool(part))
            ran = True
        return ran

    def _run_tool(self, part: ToolPart | DynamicToolPart) -> Chunk:
        tool = self.request.tools.get(part.tool_name)
        with tracing.span("think_jobs.tool", attributes={"think_jobs.tool": part.tool_name}):
            self.in_tool(True)
            try:
                result = _execute_tool(tool, part.tool_name, part.tool_call_id, part.input)
            finally:
                self.in_tool(False)
            return _bounded_output(result, self.limits.json_depth)

    def _ask(self, part: ToolPart | DynamicToolPart) -> None:
        """Stop at this call: it runs once a human approves it (``respond_to_approval``)."""
        asked = ApprovalAsked(uuid.uuid4().hex, part.tool_name, part.tool_call_id, part.input)
        self.asked.append(asked)
        self._send(
            ToolApprovalRequestChunk(approval_id=asked.approval_id, tool_call_id=asked.tool_call_id)
        )

    def _add(self, chunk: Chunk) -> None:
        """Send a chunk that grows the reply, if the reply's limits allow it."""
        try:
            self.bounds.admit(chunk)
        except ReplyTooLarge as too_large:
            raise _ModelFailed(f"{too_large}: the reply was stopped there") from None
        self._send(chunk)

    def _add_output(self, result: Chunk) -> None:
        """A tool's result; one the reply has no room for becomes the tool's error."""
        try:
            self.bounds.admit(result)
        except ReplyTooLarge as too_large:
            call_id = cast(ToolOutputAvailableChunk | ToolOutputErrorChunk, result).tool_call_id
            error = f"the output was not stored: {too_large}"
            self._add(ToolOutputErrorChunk(tool_call_id=call_id, error_text=error))
        else:
            self._send(result)

    def _end_unanswered(self, why: str) -> None:
        """Tool calls a turn ends in error without answering (its time limit came first, a
        tool still running or not yet run) get that error as their output: the client shows
        the call ended, and the next turn's model sees a call with its result, not one left
        open. A call the reply has no room for stays as the model left it."""
        for part in _tool_calls(self.assembler, ("input-available",)):
            chunk = ToolOutputErrorChunk(tool_call_id=part.tool_call_id, error_text=why)
            try:
                self.bounds.admit(chunk)
            except ReplyTooLarge:
                return
            self._send(chunk)

    def _send(self, chunk: Chunk) -> None:
        self.assembler.feed(chunk)
        self.emit(chunk)

    def _check_stop(self) -> None:
        if self.should_stop():
            raise _Stopped

    def _aborted(self) -> RunOutcome:
        self._send(AbortChunk())
        return self._outcome("aborted", None)

    def _outcome(self, status: RunStatus, error: str | None) -> RunOutcome:
        message, has_content = self.assembler.message, self.assembler.has_content
        asked = tuple(self.asked) if status == "completed" else ()
        return RunOutcome(status, error, message, has_content, asked)


def _tool_calls(
    assembler: MessageAssembler, states: tuple[str, ...]
) -> list[ToolPart | DynamicToolPart]:
    """Copies of the reply's tool calls in one of ``states`` (only those are copied)."""

    def keep(part: Part) -> bool:
        return isinstance(part, ToolPart | DynamicToolPart) and part.state in states

    return cast(list[ToolPart | DynamicToolPart], assembler.parts_matching(keep))


def _iterate(model: Model, request: ModelRequest) -> Iterator[Chunk | Mapping[str, Any]]:
    try:
        return iter(model.stream(request))
    except Exception as error:
        raise _ModelFailed(_describe(error)) from error


_OURS = frozenset({"tool-approval-request", "tool-output-denied"})  # only the loop sends these


def _parse_model_chunk(raw_iterator_item: Chunk | Mapping[str, Any], depth_limit: int) -> Chunk:
    """A chunk the model may send and whose content could be stored, or ``_ModelFailed``
    saying what the model got wrong."""
    try:
        chunk = parse_chunk(raw_iterator_item)
    except Exception as error:
        raise _ModelFailed(f"model produced an invalid chunk: {error}") from error
    if chunk.type in _OURS:
        raise _ModelFailed(
            f"model produced a {chunk.type} chunk: approvals come from tools declared with "
            "needs_approval, not from the model"
        )
    if chunk.type in FRAMING_CHUNK_TYPES:  # a start's messageId could name another message
        article = "an" if chunk.type == "abort" else "a"
        raise _ModelFailed(
            f"model produced {article} {chunk.type} chunk: message and step framing come from "
            "the runner, not the model (a model yields only content chunks)"
        )
    problem = label_problem(chunk) or json_problem(chunk, depth_limit)
    if problem is not None:
        raise _ModelFailed(f"model produced a chunk that could not be stored: {problem}")
    return chunk


def _well_formed(chunk: Chunk) -> Chunk:
    """``chunk`` with each lone surrogate in its text (a delta, an id, an error) replaced by
    U+FFFD: such text can be neither streamed nor stored and read back, and one reply holding
    it would fail every later turn of the agent. Its free-form JSON is ``json_problem``'s."""
    for value in chunk.__dict__.values():  # per chunk: the common, well-formed case is quick
        if value.__class__ is str and not value.isascii() and not is_unicode(value):
            break
    else:
        return chunk
    fixed = {
        name: well_formed(value)
        for name, value in chunk.__dict__.items()
        if isinstance(value, str) and not is_unicode(value)
    }
    return chunk.model_copy(update=fixed)


_FREE_JSON = ("data", "input", "output", "message_metadata", "provider_metadata")
_PLAIN = frozenset({"text-delta", "reasoning-delta", "text-start", "text-end"})
_Plain = TextDeltaChunk | ReasoningDeltaChunk | TextStartChunk | TextEndChunk


def json_problem(chunk: Chunk, depth_limit: int) -> str | None:
    """Why a chunk's free-form JSON (data, tool input and output, metadata) could not be
    stored and read back (too deep, not JSON), or None. A text chunk's only such JSON is its
    provider metadata, mostly absent: one attribute test on the hot path."""
    if chunk.type in _PLAIN and cast(_Plain, chunk).provider_metadata is None:
        return None
    for name in _FREE_JSON:
        value = getattr(chunk, name, None)
        if value is not None:
            problem = value_problem(value, f"{chunk.type}.{name}", depth_limit=depth_limit)
            if problem is not None:
                return problem
    return None


_TOOL_NAME_MAX_CHARS = ID_MAX_CHARS - len("tool-")  # its part's type is tool-<name>
_CALL = {"tool_call_id": ("toolCallId", ID_MAX_CHARS)}
_NAMED_CALL = {**_CALL, "tool_name": ("toolName", _TOOL_NAME_MAX_CHARS)}
_SOURCE = {"source_id": ("sourceId", ID_MAX_CHARS)}
_MEDIA = {"media_type": ("mediaType", ID_MAX_CHARS)}
_LABELS: dict[str, dict[str, tuple[str, int]]] = {  # by chunk type: field -> (wire name, limit)
    "tool-input-start": _NAMED_CALL,
    "tool-input-delta": _CALL,
    "tool-input-available": _NAMED_CALL,
    "tool-input-error": _NAMED_CALL,
    "tool-output-available": _CALL,
    "tool-output-error": _CALL,
    "source-url": _SOURCE,
    "source-document": {**_SOURCE, **_MEDIA},
    "file": _MEDIA,
}
_DATA_LABELS = {"type": ("type", ID_MAX_CHARS), "id": ("id", ID_MAX_CHARS)}


def label_problem(chunk: Chunk) -> str | None:
    """Why an id or name a chunk carries could not be stored and sent again (the rule of the
    input edge: at most 255 characters, and no control characters, which an approval's row
    and a client's next request of the chat cannot carry), or None."""
    labels = _DATA_LABELS if isinstance(chunk, DataChunk) else _LABELS.get(chunk.type)
    if labels is None:
        return None
    for name, (wire, limit) in labels.items():
        value = getattr(chunk, name)
        if value is None:
            continue
        where = f"{chunk.type}.{wire}" if name != "type" else "data-<name>.type"
        if len(value) > limit:
            return f"{where}: {len(value)} characters; the limit is {limit}"
        if has_control_characters(value):
            return f"{where}: must not contain control characters"
    return None


def _bounded_output(result: Chunk, depth_limit: int) -> Chunk:
    """A tool's output that could not be stored becomes the tool's error."""
    problem = json_problem(result, depth_limit)
    if problem is None or not isinstance(result, ToolOutputAvailableChunk):
        return result
    return ToolOutputErrorChunk(tool_call_id=result.tool_call_id, error_text=problem)


def _close(stream: Iterator[Any]) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # a model that fails while being closed must not mask the outcome
            log.exception("model stream raised while closing")


def _describe(error: BaseException) -> str:
    """What a model or tool that raised says, streamed and stored (so: well-formed text)."""
    return well_formed(str(error)) or type(error).__name__


def _needs_approval(tool: Tool, raw_input: Any) -> bool:
    """The tool's rule for this input; a rule that raises asks (never runs unapproved)."""
    try:
        return tool.approval_needed(raw_input)
    except Exception:
        log.exception("needs_approval of tool %s raised; asking for approval", tool.name)
        return True


def _execute_tool(tool: Tool | None, name: str, call_id: str, raw_input: Any) -> Chunk:
    if tool is None:
        return ToolOutputErrorChunk(tool_call_id=call_id, error_text=f'unknown tool "{name}"')
    try:
        output = tool.execute(raw_input if isinstance(raw_input, Mapping) else {})
        json.dumps(output)
    except Exception as error:
        return ToolOutputErrorChunk(tool_call_id=call_id, error_text=_describe(error))
    return ToolOutputAvailableChunk(tool_call_id=call_id, output=output)
