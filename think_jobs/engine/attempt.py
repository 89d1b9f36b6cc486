"""One attempt of a claimed turn: from applying its messages to the model's last chunk, then
its delivery (the stream's end and the hooks) once ``execution`` has written the outcome.

Steps: apply the caller's messages (blocking turns) or pick up the partial of an earlier
attempt (recovery, from the stream this attempt took over); ``before_turn``; the model through
``TurnRunner``. ``run()`` returns what happened as an ``Ending`` and writes nothing final:
``execution`` owns the claim, the lease, the watch and the final write. Every write the
attempt makes on the way (applied messages, a recovered partial) goes through the lease's
fence, so a stale attempt's write changes nothing; it then ends ``Interrupted``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from think_jobs.assembly import MessageAssembler
from think_jobs.callbacks import call_optional
from think_jobs.chunks import Chunk, ErrorChunk, ToolOutputDeniedChunk, is_content_chunk
from think_jobs.context import TurnContext
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.engine import Connection
from think_jobs.domain import policy
from think_jobs.domain.records import ApprovalAnswer, Claim, TurnRecord
from think_jobs.domain.status import INTERRUPTED, Status, StopKind
from think_jobs.engine import approvals, continuation, events
from think_jobs.engine.lease import Lease, LeaseLost
from think_jobs.engine.model_loop import RunOutcome, TurnRunner
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.engine.watch import StopReason, TurnWatch
from think_jobs.errors import StoredMessageError
from think_jobs.limits import Limits, storable_text
from think_jobs.messages import (
    AWAITING_ANSWER,
    DynamicToolPart,
    ToolPart,
    UIMessage,
    coerce_messages,
    message_text,
    stored_messages,
)
from think_jobs.models.base import ModelRequest
from think_jobs.observe import metrics, tracing
from think_jobs.results import ChatResponseResult, TurnStatus
from think_jobs.signals import SignalLike
from think_jobs.transport.streams import StreamWriter
from think_jobs.validation import seconds_or_none

log = logging.getLogger(__name__)

MessagesFunction = Callable[[list[UIMessage]], Sequence[UIMessage | dict[str, Any]]]
# Chunks that carry no content: published together with the next chunk that does.
FRAMING = frozenset(
    {"start", "start-step", "finish-step", "finish", "text-start", "text-end"}
    | {"reasoning-start", "reasoning-end", "tool-input-start"}
)
LEASE_LOST = StopReason(StopKind.LEASE_LOST, "the agent's lease was lost")
STREAM_AHEAD = StopReason(
    StopKind.STREAM_AHEAD, "the turn's stream shows more than the reply this attempt continued"
)


@dataclass
class CallerTurn:
    """What a blocking caller brings to its own turn: messages (or a function), signal, callback."""

    payload: MessagesFunction | None
    signal: SignalLike | None
    callback: object | None


@dataclass(frozen=True)
class TurnResult:
    request_id: str
    status: str  # a final status, or INTERRUPTED
    error: str | None
    message: UIMessage | None
    callback_error: BaseException | None = None
    interruption: StopKind | None = None  # why an INTERRUPTED attempt stopped


@dataclass(frozen=True)
class Finished:
    """The attempt ran to an end: write ``outcome`` as the turn's final status and reply."""

    outcome: RunOutcome


@dataclass(frozen=True)
class Interrupted:
    """The attempt stopped but the turn goes on: stalled (``partial`` is kept and the turn
    handed to recovery) or its lease was lost (another attempt owns the turn; nothing of
    this one may be written)."""

    reason: StopReason
    partial: RunOutcome | None = None


Ending = Finished | Interrupted


@dataclass(frozen=True)
class Written:
    """What the final write stored: the status the turn has now (this attempt's, or one set
    meanwhile, such as ``aborted``) and whether this attempt set it."""

    status: str
    error: str | None
    by_us: bool


@dataclass(frozen=True)
class Tools:
    """What an attempt works with, owned by ``execution``."""

    lease: Lease
    watch: TurnWatch
    writer: StreamWriter


class Attempt:
    def __init__(
        self,
        services: Services,
        agent: AgentHooks,
        claim: Claim,
        caller: CallerTurn | None,
        tools: Tools,
    ) -> None:
        self.services = services
        self.agent = agent
        self.claim = claim
        self.turn = claim.turn
        self.caller = caller
        self.callback = caller.callback if caller is not None else None
        self.callback_error: BaseException | None = None
        self.lease, self.watch, self.writer = tools.lease, tools.watch, tools.writer
        self.claimed_history = claim.history
        self.attempt_started = time.monotonic()
        self.first_chunk_seen = False
        self.chunks_published = metrics.CHUNKS_PUBLISHED.labels(agent.agent_type)
        self.answers: list[ApprovalAnswer] = []  # a continuation's answered approvals

    # -- running -------------------------------------------------------------------------------

    def run(self) -> Ending:
        """Run the attempt to its ``Ending`` (nothing final is written here)."""
        self._observe_queue_wait()
        attributes = {f"think_jobs.{key}": value for key, value in self.log_fields().items()}
        with tracing.span("think_jobs.turn", parent=self.turn.trace_context, attributes=attributes):
            try:
                return self._run()
            except LeaseLost:
                return Interrupted(LEASE_LOST)

    def _observe_queue_wait(self) -> None:
        """Admission → first start, as a metric and as a span of the submission's trace."""
        started, created = self.turn.started_at, self.turn.created_at
        if self.turn.attempt != 1 or started is None:
            return
        waited_s = (started - created).total_seconds()
        metrics.QUEUE_WAIT.labels(self.agent.agent_type).observe(waited_s)
        tracing.record_span(
            "think_jobs.queue_wait", start=created, end=started, parent=self.turn.trace_context
        )

    def _run(self) -> Ending:
        log.info("turn started", extra=self.log_fields())
        events.status_changed(self.agent, self.turn, Status.RUNNING)
        try:
            if not self.turn.messages_applied and not self._apply_caller_messages():
                return Finished(self._not_run())
            history = self._load_history()
        except StoredMessageError as error:  # the agent is not bricked: this turn fails
            log.error("turn cannot read its conversation: %s", error, extra=self.log_fields())
            return Finished(self._failed(self._assembler(None), error))
        except _PayloadFailed as failed:  # the caller's messages function raised or was wrong
            return Finished(self._failed(self._assembler(None), failed.error))
        if self.claim.recovering:
            return self._resume(history)
        if self.turn.trigger == approvals.APPROVAL_TRIGGER:
            return self._answer_approvals(history)
        return self._run_with_hooks(self._context(history), self._assembler(None))

    def _answer_approvals(self, history: list[UIMessage]) -> Ending:
        """A continuation of a turn that stopped at tool calls needing approval: the reply it
        extends, and the answers the model loop applies before the model goes on."""
        own_id = self.turn.assistant_message_id
        self.answers = approvals.answers_for(self.services, self.turn)
        context = self._context([m for m in history if m.id != own_id])
        return self._run_with_hooks(context, self._assembler(approvals.extended(self.turn)))

    def _run_with_hooks(self, context: TurnContext, assembler: MessageAssembler) -> Ending:
        try:
            self.agent.before_turn(context)
            stall_s = seconds_or_none(context.stall_timeout_s, "ctx.stall_timeout_s")
            turn_s = seconds_or_none(context.turn_timeout_s, "ctx.turn_timeout_s")
        except Exception as error:
            log.exception("before_turn failed for %s", self.agent.address)
            return Finished(self._failed(assembler, error))
        self.watch.set_timeouts(stall_s=stall_s, turn_s=turn_s)
        outcome = self._run_model(context, assembler)
        if self.writer.sealed:
            outcome = self._as_streamed(outcome)
        reason = self.watch.reason
        if reason is not None and reason.interrupts:
            return Interrupted(reason, outcome if reason.kind.hands_to_recovery else None)
        if self.writer.lost:
            return Interrupted(LEASE_LOST)
        if not self.writer.confirm_base():  # a recovery that could not read its stream
            return Interrupted(STREAM_AHEAD, outcome)
        return Finished(outcome)

    def _as_streamed(self, outcome: RunOutcome) -> RunOutcome:
        """A reader ended the stream from the database (the turn was ended there: a cancel)
        while this attempt ran on — inside a slow tool, say. The reader's client holds the
        stream's end, so the attempt stores what the stream shows, not what it built after
        that end (a tool's output that came back later): the stored reply is the one the
        client saw. With nothing of the stream to go by, the stored partial stays; an approval's
        continuation whose stream shows nothing (cancelled in its approved tool) stores the
        reply with its answers, as the client that answered holds it."""
        shown = self.writer.shown()
        if shown is None:
            return replace(outcome, has_content=False)
        base = approvals.answered_base(self.services, self.turn)
        recovered = continuation.recover(self.turn, shown, base, seed=base)
        if recovered.message.parts != outcome.message.parts:
            log.info(
                "request %s: its stream was ended from the database; the reply is stored as "
                "the stream shows it", self.turn.request_id, extra=self.log_fields(),
            )  # fmt: skip
        return replace(outcome, message=recovered.message, has_content=recovered.has_content)

    def _resume(self, history: list[UIMessage]) -> Ending:
        """Continue after an attempt that died or stalled (messages were applied)."""
        own_id = self.turn.assistant_message_id
        stored = next((m for m in history if m.id == own_id), None)
        seed = approvals.extended(self.turn)  # an approval continuation's stream extends it
        if seed is not None:  # answers not applied yet apply now; its stream applies to them
            self.answers = approvals.answers_for(self.services, self.turn)
            seed = approvals.responded(seed, self.answers)
        recovered = continuation.recover(self.turn, self.writer.prefix, stored, seed=seed)
        if not recovered.from_stream:  # the stream must lead to the stored partial too
            base = recovered.message
            if seed is not None:
                base = approvals.responded(base, self.answers)
            self.writer.continue_from(base, extends=seed)
        metrics.RECOVERIES.labels(self.agent.agent_type, "continuation").inc()
        self._store_recovered(recovered)
        log.info("turn resumed", extra={**self.log_fields(), "finished": recovered.finished})
        if recovered.finished:
            return Finished(RunOutcome("completed", None, recovered.message, recovered.has_content))
        context = self._context([m for m in history if m.id != own_id], continuing=True)
        return self._run_with_hooks(context, self._assembler(recovered.message))

    def _store_recovered(self, recovered: continuation.Recovered) -> None:
        recoveries = policy.recoveries_after_progress(self.turn, recovered.buffer_length)
        with self.lease.write("recovery") as conn:
            if recovered.has_content:
                store_reply(conn, self.turn, recovered.message, self.lease)
            turn_ops.note_recovery(
                conn, self.turn.id, recoveries=recoveries, at_seq=recovered.buffer_length
            )

    # -- messages and context ------------------------------------------------------------------

    def _apply_caller_messages(self) -> bool:
        """Append the blocking caller's messages; False if the turn was cancelled first."""
        payload = self._caller_payload()
        with self.lease.write("messages") as conn:
            current = turn_ops.get_turn_by_id(conn, self.turn.id)
            if current is None or current.status is not Status.RUNNING:
                return False
            if current.attempt != self.turn.attempt:
                raise LeaseLost("a newer attempt owns the turn")
            conversation_ops.append_messages(
                conn, self.turn.agent_id, payload, turn_id=self.turn.id, now=self.lease.db_now
            )
            turn_ops.mark_messages_applied(conn, self.turn.id)
        return True

    def _caller_payload(self) -> list[dict[str, Any]]:
        if self.caller is None or self.caller.payload is None:
            return list(self.turn.messages or [])
        current = self._load_history()
        limits = Limits.of(self.services.settings)
        try:
            given = coerce_messages(self.caller.payload(current), limits=limits)
        except Exception as error:
            log.warning("the caller's messages function failed: %s", error, extra=self.log_fields())
            raise _PayloadFailed(error) from error
        return [message.to_wire() for message in given]

    def _load_history(self) -> list[UIMessage]:
        """The conversation now: as read when the turn was claimed, else from the database."""
        claimed, self.claimed_history = self.claimed_history, None
        if claimed is not None:
            return stored_messages(claimed)
        with self.services.db.read() as conn:
            return stored_messages(conversation_ops.load_messages_json(conn, self.turn.agent_id))

    def _remembered_body(self) -> dict[str, Any] | None:
        with self.services.db.read() as conn:
            return agent_ops.get_last_body(conn, self.turn.agent_id)

    def _context(self, history: list[UIMessage], *, continuing: bool = False) -> TurnContext:
        body = self.turn.body
        if body is None and (self.turn.continuation or continuing):
            body = self._remembered_body()
        return TurnContext(
            request_id=self.turn.request_id,
            trigger="recovery" if continuing else self.turn.trigger,
            continuation=self.turn.continuation or continuing,
            body=body,
            messages=history,
            submission_id=self.turn.request_id if self.turn.is_submission else None,
            metadata=self.turn.metadata,
            attempt=self.turn.attempt,
            stall_timeout_s=self.agent.stall_timeout_s,
            turn_timeout_s=self.agent.turn_timeout_s,
        )

    def _assembler(self, partial: UIMessage | None) -> MessageAssembler:
        message_id = self.turn.assistant_message_id or self.turn.request_id
        return MessageAssembler(message_id, parts=partial.parts if partial else None)

    # -- the model -----------------------------------------------------------------------------

    def _run_model(self, context: TurnContext, assembler: MessageAssembler) -> RunOutcome:
        request = ModelRequest(
            system=self.agent.get_system_prompt(),
            messages=context.messages,
            tools=self.agent.get_tools(),
            body=context.body,
            continuation=context.continuation,
            signal=self.watch.signal,
        )
        runner = TurnRunner(
            model=self.agent.get_model(),
            request=request,
            assembler=assembler,
            emit=self._emit,
            should_stop=lambda: not self.watch.confirm(),
            in_tool=self.watch.in_tool,
            stop_error=self._stop_error,
            max_steps=self.agent.max_steps or self.services.settings.max_steps,
            limits=Limits.of(self.services.settings),
            answers=self.answers,
            first_step=_steps_so_far(assembler) if self.answers else 0,
        )
        return runner.run()

    def _emit(self, chunk: Chunk) -> None:
        """Stream one chunk. The writer may hold it for a flush window (``StreamWriter``):
        its ``lost`` and ``revoked`` then come with the send that carries it, read here after
        a later chunk (the watch's ``RevocationPoller`` sees a revocation meanwhile)."""
        if chunk.type == "abort" and self.watch.interrupted:
            return  # an interruption is not the end of the turn: its continuation follows
        if isinstance(chunk, ErrorChunk):  # streamed as the turn's error is stored
            chunk = chunk.model_copy(update={"error_text": storable_text(chunk.error_text)})
        chunk_json = chunk.model_dump_json(exclude_none=True)
        self.writer.chunk(chunk_json, defer=chunk.type in FRAMING)
        if self.writer.diverged:
            self.watch.stop(StopKind.STREAM_AHEAD, STREAM_AHEAD.text)
            return
        if self.writer.lost:
            self.watch.stop(StopKind.LEASE_LOST, "a newer attempt owns the turn's stream")
            return
        if self.writer.sealed:  # a reader ended it from the database: the turn ended there
            self.watch.stop(StopKind.CANCELLED, None)
            return  # refused: the callback sees what the stream (and the stored reply) show
        self.chunks_published.inc()
        if not self.first_chunk_seen and is_content_chunk(chunk):
            self.first_chunk_seen = True
            elapsed = time.monotonic() - self.attempt_started
            metrics.FIRST_CHUNK.labels(self.agent.agent_type).observe(elapsed)
        self.watch.chunk_published(revoked=self.writer.revoked)
        if self.callback is not None and chunk.type != "error":
            try:
                call_optional(self.callback, "on_event", chunk_json)
            except Exception as error:
                self.callback_error = self.callback_error or error
                self.watch.stop(StopKind.SIGNAL, f"on_event raised: {error}")

    def _stop_error(self) -> str | None:
        """The error a stop ends the turn with: the time limit's (other stops abort it)."""
        reason = self.watch.reason
        return reason.text if reason is not None and reason.kind is StopKind.TIMED_OUT else None

    def _not_run(self) -> RunOutcome:
        return RunOutcome("aborted", None, self._assembler(None).message, False)

    def _failed(self, assembler: MessageAssembler, error: Exception) -> RunOutcome:
        """The turn fails before its model runs (``before_turn`` raised, its conversation or
        its caller's messages cannot be read): streamed as an error chunk, as a model's
        failure is, so a client (``useChat``'s ``error``) learns why, not only that."""
        text = str(error) or type(error).__name__
        denied = self._deny_waiting(assembler)
        self._emit(ErrorChunk(error_text=text))
        return RunOutcome("error", text, assembler.message, denied)

    def _deny_waiting(self, assembler: MessageAssembler) -> bool:
        """An approval's continuation that fails before its model ran applies none of its
        answers: each call of its reply still waiting for one is denied, streamed and stored,
        so the conversation moves on without an open tool call (it stayed
        ``approval-requested``). True when there was one."""
        waiting = _tool_calls_waiting(assembler)
        for call_id in waiting:
            chunk = ToolOutputDeniedChunk(tool_call_id=call_id)
            assembler.feed(chunk)
            self._emit(chunk)
        return bool(waiting)

    # -- delivery (after execution wrote the outcome) ------------------------------------------

    def final_status(self, outcome: RunOutcome) -> tuple[str, str | None]:
        """The status and error this attempt writes for ``outcome``. The error may quote an
        exception (a hook's, a callback's, the model's) or a model's error chunk: it is made
        text the database stores and reads back (``storable_text``: no NUL, no lone surrogate,
        cut to ``ERROR_MAX_CHARS``), or the final write would fail and the turn be retried."""
        error = outcome.error
        if outcome.status == "aborted" and self.watch.reason is not None:
            error = self.watch.reason.text
        return outcome.status, None if error is None else storable_text(error)

    def deliver(self, outcome: RunOutcome, written: Written) -> TurnResult:
        """End the stream, then call the hooks in Think's order for what was written."""
        self.writer.done(written.status, written.error)
        status = cast(TurnStatus, written.status)  # a final status: the write ended the turn
        final = RunOutcome(status, written.error, outcome.message, outcome.has_content)
        self._observe_end(final)
        if written.by_us:
            record = turn_ops.replace_record(self.turn, status=final.status, error=final.error)
            events.status_changed(self.agent, record, Status(final.status), final.error)
        message = final.message if final.has_content else None
        self._call_hooks(
            ChatResponseResult(
                message=message,
                request_id=self.turn.request_id,
                continuation=self.turn.continuation,
                status=final.status,
                error=final.error,
            )
        )
        return TurnResult(
            self.turn.request_id, final.status, final.error, message, self.callback_error
        )

    def interrupted(self, ending: Interrupted) -> TurnResult:
        """The attempt was handed to recovery (stalled) or lost its turn to another attempt."""
        reason = ending.reason
        log.warning(
            "turn interrupted (%s: %s)",
            reason.kind,
            reason.text or "no detail",
            extra={**self.log_fields(), "reason": reason.kind},
        )
        metrics.RECOVERIES.labels(self.agent.agent_type, reason.kind).inc()
        if self.callback is not None:
            self._guard_callback("on_interrupted")
        return TurnResult(
            self.turn.request_id, INTERRUPTED, reason.text, None, self.callback_error, reason.kind
        )

    def _observe_end(self, outcome: RunOutcome) -> None:
        agent_type = self.agent.agent_type
        duration_s = time.monotonic() - self.attempt_started
        metrics.TURNS_FINISHED.labels(agent_type, outcome.status).inc()
        metrics.TURN_DURATION.labels(agent_type).observe(duration_s)
        fields = {**self.log_fields(), "status": outcome.status, "duration_s": round(duration_s, 3)}
        log.info("turn finished", extra={**fields, "error": outcome.error})
        if self.services.settings.log_content:
            log.debug("turn reply", extra={**fields, "reply": message_text(outcome.message)})

    def _call_hooks(self, response: ChatResponseResult) -> None:
        if response.status == "completed":
            self._guard_callback("on_done")
        if response.status == "error":
            _safely(self.agent.on_chat_error, response.error or "")
        _safely(self.agent.on_chat_response, response)
        if response.status == "error":
            self._guard_callback("on_error", response.error or "")

    def _guard_callback(self, name: str, *args: Any) -> None:
        if self.callback is None:
            return
        try:
            call_optional(self.callback, name, *args)
        except Exception as error:
            self.callback_error = self.callback_error or error

    def log_fields(self) -> dict[str, Any]:
        return {
            "agent": self.agent.address,
            "agent_type": self.agent.agent_type,
            "agent_name": self.agent.name,
            "submission_id": self.turn.request_id if self.turn.is_submission else None,
            "request_id": self.turn.request_id,
            "attempt": self.turn.attempt,
            "trigger": self.turn.trigger,
        }


class _PayloadFailed(Exception):
    """The blocking caller's messages function raised, or returned messages that were refused."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def store_reply(conn: Connection, turn: TurnRecord, message: UIMessage, lease: Lease) -> None:
    """Store the assistant reply of ``turn`` (replacing a partial stored earlier), inside a
    transaction the lease fenced."""
    conversation_ops.upsert_message(
        conn, turn.agent_id, message.to_wire(), turn_id=turn.id, now=lease.db_now
    )


def _tool_calls_waiting(assembler: MessageAssembler) -> list[str]:
    """The ids of the reply's tool calls still waiting for an approval's answer."""
    return [
        part.tool_call_id
        for part in assembler.message.parts
        if isinstance(part, ToolPart | DynamicToolPart) and part.state in AWAITING_ANSWER
    ]


def _steps_so_far(assembler: MessageAssembler) -> int:
    """How many model steps the reply being extended already has."""
    return len(assembler.parts_matching(lambda part: part.type == "step-start"))


def _safely(hook: Callable[..., Any], *args: Any) -> None:
    try:
        hook(*args)
    except Exception:
        log.exception("%s raised; ignored", getattr(hook, "__name__", "hook"))
