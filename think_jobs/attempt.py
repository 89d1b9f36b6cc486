"""One attempt of a claimed turn, from applying its messages to calling its hooks.

Steps: apply the caller's messages (blocking turns) or pick up the partial of an earlier
attempt (recovery); ``before_turn``; the model through ``TurnRunner``; persist the reply and
the final status (conditional: never overwrites a status set meanwhile); close the stream;
hooks in Think's order. An attempt that stalls is handed to recovery instead of finishing: its
partial is stored, the turn goes back to ``pending`` and a worker continues it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection

from think_jobs import continuation, metrics, queueing, tracing
from think_jobs.assembly import MessageAssembler
from think_jobs.callbacks import call_optional
from think_jobs.chunks import Chunk, is_content_chunk
from think_jobs.context import TurnContext, utcnow
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.messages import UIMessage, coerce_messages, message_text, stored_messages
from think_jobs.models.base import ModelRequest
from think_jobs.results import ChatResponseResult, TurnStatus
from think_jobs.runner import RunOutcome, TurnRunner
from think_jobs.signals import SignalLike
from think_jobs.streaming import StreamWriter, next_seq_of
from think_jobs.watch import TurnWatch

if TYPE_CHECKING:
    from think_jobs.agent import Think
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)

MessagesFunction = Callable[[list[UIMessage]], Sequence[UIMessage | dict[str, Any]]]
INTERRUPTED = "interrupted"  # the attempt was handed to recovery; the turn is not over
# Chunks that carry no content: published together with the next chunk that does.
FRAMING = frozenset(
    {"start", "start-step", "finish-step", "finish", "text-start", "text-end"}
    | {"reasoning-start", "reasoning-end", "tool-input-start"}
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
    status: str
    error: str | None
    message: UIMessage | None
    callback_error: BaseException | None = None


class TurnRun:
    def __init__(
        self,
        jobs: ThinkJobs,
        agent: Think,
        claim: queueing.Claim,
        caller: CallerTurn | None,
        *,
        keep_lease: bool = False,
    ) -> None:
        self.jobs = jobs
        self.agent = agent
        self.claim = claim
        self.turn = claim.turn
        self.caller = caller
        self.callback = caller.callback if caller is not None else None
        self.callback_error: BaseException | None = None
        self.wrote_final = False
        self.claimed_history = claim.history
        # With no hook or callback to run inside the turn after the final write, that write
        # also releases the lease: one transaction less per turn.
        self.release_with_finish = caller is None and not keep_lease and not has_turn_hooks(agent)
        self.released: queueing.Released | None = None
        self.watch = TurnWatch(
            jobs,
            claim,
            signal=caller.signal if caller else None,
            stall_timeout_s=type(agent).stall_timeout_s,
        )
        self.attempt_started = time.monotonic()
        self.first_chunk_seen = False
        self.chunks_published = metrics.CHUNKS_PUBLISHED.labels(agent.agent_type)
        self.writer = StreamWriter(
            jobs.thread_redis,
            jobs.keys,
            agent.address,
            self.turn.request_id,
            ttl_s=jobs.settings.stream_ttl_s,
            start_seq=self._start_seq(),
        )
        self.watch.start()  # last: nothing above may leave a running watch behind

    def _start_seq(self) -> int:
        if self.turn.attempt <= 1:
            return 0
        try:
            return next_seq_of(
                self.jobs.redis, self.jobs.keys, self.agent.address, self.turn.request_id
            )
        except Exception:  # Redis down: the stream will show a gap, the turn goes on
            return 0

    # -- the attempt ---------------------------------------------------------------------------

    def perform(self) -> TurnResult:
        self._observe_queue_wait()
        attributes = {f"think_jobs.{key}": value for key, value in self.log_fields().items()}
        with tracing.span("think_jobs.turn", parent=self.turn.trace_context, attributes=attributes):
            return self._perform()

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

    def _perform(self) -> TurnResult:
        log.info("turn started", extra=self.log_fields())
        self.agent._notify_submission(self.turn, "running")
        if not self.turn.messages_applied and not self._apply_caller_messages():
            return self._deliver(self._finish(self._not_run()))
        if self.claim.recovering:
            return self._resume()
        history = self._load_history()
        return self._run_with_hooks(self._context(history), self._assembler(None))

    def _run_with_hooks(self, context: TurnContext, assembler: MessageAssembler) -> TurnResult:
        try:
            self.agent.before_turn(context)
        except Exception as error:
            log.exception("before_turn failed for %s", self.agent.address)
            return self._deliver(self._finish(self._failed(assembler, error)))
        self.watch.stall_timeout_s = context.stall_timeout_s
        outcome = self._run_model(context, assembler)
        if self.watch.reason is not None and self.watch.reason.kind in ("stalled", "lease_lost"):
            return self._interrupted(outcome)
        return self._deliver(self._finish(outcome))

    def _resume(self) -> TurnResult:
        """Continue after an attempt that died or stalled (messages were applied)."""
        history = self._load_history()
        own_id = self.turn.assistant_message_id
        stored = next((m for m in history if m.id == own_id), None)
        recovered = continuation.recover(self.jobs, self.agent.address, self.turn, stored)
        metrics.RECOVERIES.labels(self.agent.agent_type, "continuation").inc()
        self._store_recovered(recovered)
        log.info("turn resumed", extra={**self.log_fields(), "finished": recovered.finished})
        if recovered.finished:
            outcome = RunOutcome("completed", None, recovered.message, recovered.has_content)
            return self._deliver(self._finish(outcome))
        context = self._context([m for m in history if m.id != own_id], continuing=True)
        return self._run_with_hooks(context, self._assembler(recovered.message))

    def _store_recovered(self, recovered: continuation.Recovered) -> None:
        recoveries = continuation.recoveries_after_progress(self.turn, recovered.buffer_length)
        with self.jobs.db.write() as conn:
            if recovered.has_content:
                self._store_reply(conn, recovered.message)
            turn_ops.note_recovery(
                conn, self.turn.id, recoveries=recoveries, at_seq=recovered.buffer_length
            )

    def _store_reply(self, conn: Connection, message: UIMessage) -> None:
        """Store the assistant reply of this turn (replacing a partial stored earlier)."""
        wire = message.to_wire()
        conversation_ops.upsert_message(
            conn, self.turn.agent_id, wire, turn_id=self.turn.id, now=utcnow()
        )

    # -- messages and context ------------------------------------------------------------------

    def _apply_caller_messages(self) -> bool:
        """Append the blocking caller's messages; False if the turn was cancelled first."""
        payload = self._caller_payload()
        with self.jobs.db.write() as conn:
            current = turn_ops.get_turn_by_id(conn, self.turn.id)
            if current is None or current.status != "running":
                return False
            conversation_ops.append_messages(
                conn, self.turn.agent_id, payload, turn_id=self.turn.id, now=utcnow()
            )
            turn_ops.mark_messages_applied(conn, self.turn.id)
        return True

    def _caller_payload(self) -> list[dict[str, Any]]:
        if self.caller is None or self.caller.payload is None:
            return list(self.turn.messages or [])
        current = self._load_history()
        return [message.to_wire() for message in coerce_messages(self.caller.payload(current))]

    def _load_history(self) -> list[UIMessage]:
        """The conversation now: as read when the turn was claimed, else from the database."""
        claimed, self.claimed_history = self.claimed_history, None
        if claimed is not None:
            return stored_messages(claimed)
        with self.jobs.db.read() as conn:
            return stored_messages(conversation_ops.load_messages_json(conn, self.turn.agent_id))

    def _remembered_body(self) -> dict[str, Any] | None:
        with self.jobs.db.read() as conn:
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
            stall_timeout_s=type(self.agent).stall_timeout_s,
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
            should_stop=lambda: self.watch.stopped,
            max_steps=type(self.agent).max_steps or self.jobs.settings.max_steps,
        )
        return runner.run()

    def _emit(self, chunk: Chunk) -> None:
        chunk_json = chunk.model_dump_json(exclude_none=True)
        self.writer.chunk(chunk_json, defer=chunk.type in FRAMING)
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
                self.watch.stop("signal", f"on_event raised: {error}")

    def _not_run(self) -> RunOutcome:
        return RunOutcome("aborted", None, self._assembler(None).message, False)

    def _failed(self, assembler: MessageAssembler, error: Exception) -> RunOutcome:
        return RunOutcome("error", str(error) or type(error).__name__, assembler.message, False)

    # -- the end -------------------------------------------------------------------------------

    def _finish(self, outcome: RunOutcome) -> RunOutcome:
        """Persist the reply and the final status (never overwriting a status set meanwhile)."""
        status, error = outcome.status, outcome.error
        if status == "aborted" and self.watch.reason is not None:
            error = self.watch.reason.text
        if self.release_with_finish:
            self.watch.close()  # nothing runs inside the turn after this write
        with self.jobs.db.write() as conn:
            if outcome.has_content:
                self._store_reply(conn, outcome.message)
            if self.turn.body is not None:
                agent_ops.set_last_body(conn, self.turn.agent_id, self.turn.body)
            self.wrote_final = turn_ops.finish_turn(
                conn, self.turn, status=status, error=error, now=utcnow()
            )
            if not self.wrote_final:
                stored = turn_ops.get_turn_by_id(conn, self.turn.id)
                if stored is not None and stored.status != "running":
                    status, error = stored.status, stored.error
            if self.release_with_finish:
                self.released = queueing.release(conn, self.claim)
        return RunOutcome(status, error, outcome.message, outcome.has_content)

    def _interrupted(self, outcome: RunOutcome) -> TurnResult:
        """A stalled attempt (or one whose lease was lost) is handed to recovery."""
        reason = self.watch.reason
        assert reason is not None
        if reason.kind == "stalled":
            with self.jobs.db.write() as conn:
                if outcome.has_content:
                    self._store_reply(conn, outcome.message)
                turn_ops.requeue_turn(conn, self.turn)
        log.warning("turn interrupted", extra={**self.log_fields(), "reason": reason.kind})
        metrics.RECOVERIES.labels(self.agent.agent_type, reason.kind).inc()
        if self.callback is not None:
            self._guard_callback("on_interrupted")
        return TurnResult(self.turn.request_id, INTERRUPTED, reason.text, None, self.callback_error)

    def _deliver(self, outcome: RunOutcome) -> TurnResult:
        """Close the stream, then call the hooks in Think's order for this outcome."""
        self.writer.done(outcome.status, outcome.error)
        self._observe_end(outcome)
        if self.wrote_final:
            final = turn_ops.replace_record(
                self.turn, status=outcome.status, error=outcome.error, completed_at=utcnow()
            )
            self.agent._notify_submission(final, outcome.status)
        message = outcome.message if outcome.has_content else None
        self._call_hooks(
            ChatResponseResult(
                message=message,
                request_id=self.turn.request_id,
                continuation=self.turn.continuation,
                status=cast(TurnStatus, outcome.status),
                error=outcome.error,
            )
        )
        return TurnResult(
            self.turn.request_id, outcome.status, outcome.error, message, self.callback_error
        )

    def _observe_end(self, outcome: RunOutcome) -> None:
        agent_type = self.agent.agent_type
        started = self.turn.started_at or utcnow()
        duration_s = (utcnow() - started).total_seconds()
        metrics.TURNS_FINISHED.labels(agent_type, outcome.status).inc()
        metrics.TURN_DURATION.labels(agent_type).observe(duration_s)
        fields = {**self.log_fields(), "status": outcome.status, "duration_s": round(duration_s, 3)}
        log.info("turn finished", extra={**fields, "error": outcome.error})
        if self.jobs.settings.log_content:
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


def has_turn_hooks(agent: Think) -> bool:
    """Whether the agent's class overrides a hook that runs after a turn's final write."""
    from think_jobs.agent import Think

    cls = type(agent)
    hooks = ("on_chat_response", "on_chat_error", "on_submission_status")
    return any(getattr(cls, name) is not getattr(Think, name) for name in hooks)


def _safely(hook: Callable[..., Any], *args: Any) -> None:
    try:
        hook(*args)
    except Exception:
        log.exception("%s raised; ignored", getattr(hook, "__name__", "hook"))
