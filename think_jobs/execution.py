"""The life of one claimed turn: apply messages, run the model, persist, report, release.

Whoever holds the claim runs this: a Celery worker for submissions, the calling process for
blocking calls (``save_messages``, ``chat``, ``continue_last_turn``). Hooks run inside the turn,
while the lease is still held, so a slow ``on_chat_response`` delays the agent's next turn and
a ``submit_messages`` made there is admitted before anything that comes later.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from think_jobs import queueing
from think_jobs.assembly import MessageAssembler
from think_jobs.callbacks import call_optional
from think_jobs.chunks import Chunk
from think_jobs.context import TurnContext, utcnow
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.turns import TurnRecord
from think_jobs.errors import ThinkJobsError
from think_jobs.messages import UIMessage, coerce_messages
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
_ACTIVE_AGENTS: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "think_jobs_active_agents", default=frozenset()
)


def in_active_turn(address: str) -> bool:
    """True inside a turn (or its hooks) of the agent at ``address`` in this thread/context."""
    return address in _ACTIVE_AGENTS.get()


@contextmanager
def _active(address: str) -> Iterator[None]:
    token = _ACTIVE_AGENTS.set(_ACTIVE_AGENTS.get() | {address})
    try:
        yield
    finally:
        _ACTIVE_AGENTS.reset(token)


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


def execute(jobs: ThinkJobs, claim: queueing.Claim, caller: CallerTurn | None = None) -> TurnResult:
    """Run the claimed turn to its end, then release the lease and hand on to the next turn."""
    agent = jobs.instantiate(claim.agent_type, claim.agent_name)
    run = _TurnRun(jobs, agent, claim, caller)
    try:
        with _active(agent.address):
            result = run.perform()
    finally:
        run.watch.close()
        released = _release(jobs, claim)
    if released is not None:
        _hand_on(jobs, claim, released)
    return result


def _release(jobs: ThinkJobs, claim: queueing.Claim) -> queueing.Released | None:
    try:
        with jobs.db.write() as conn:
            return queueing.release(conn, claim)
    except ThinkJobsError:
        log.exception("could not release the lease of %s; it will expire", claim.agent_name)
        return None


def _hand_on(jobs: ThinkJobs, claim: queueing.Claim, released: queueing.Released) -> None:
    if released.needs_worker:
        jobs.dispatch.enqueue_drain(claim.agent_id)
    elif released.next_turn is not None:
        jobs.dispatch.wake_callers(f"{claim.agent_type}:{claim.agent_name}")


class _TurnRun:
    def __init__(
        self, jobs: ThinkJobs, agent: Think, claim: queueing.Claim, caller: CallerTurn | None
    ) -> None:
        self.jobs = jobs
        self.agent = agent
        self.claim = claim
        self.turn = claim.turn
        self.caller = caller
        self.watch = TurnWatch(
            jobs,
            claim,
            signal=caller.signal if caller else None,
            stall_timeout_s=type(agent).stall_timeout_s,
        ).start()
        self.writer = StreamWriter(
            jobs.redis,
            jobs.keys,
            agent.address,
            self.turn.request_id,
            ttl_s=jobs.settings.stream_ttl_s,
            start_seq=self._start_seq(),
        )
        self.callback_error: BaseException | None = None
        self._wrote_final = False
        self._last_body: dict[str, Any] | None = None

    def _start_seq(self) -> int:
        if self.turn.attempt <= 1:
            return 0
        try:
            return next_seq_of(
                self.jobs.redis, self.jobs.keys, self.agent.address, self.turn.request_id
            )
        except Exception:
            return 0

    # -- the turn ------------------------------------------------------------------------------

    def perform(self) -> TurnResult:
        self.agent._notify_submission(self.turn, "running")
        if not self.turn.messages_applied and not self._apply_caller_messages():
            return self._deliver(self._finish(self._not_run()))
        history = self._load_history()
        context = self._context(history)
        try:
            self.agent.before_turn(context)
        except Exception as error:
            log.exception("before_turn failed for %s", self.agent.address)
            return self._deliver(self._finish(self._failed_before_model(error)))
        self.watch.stall_timeout_s = context.stall_timeout_s
        return self._deliver(self._finish(self._run_model(context)))

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
        with self.jobs.db.read() as conn:
            stored = conversation_ops.load_messages(conn, self.turn.agent_id)
            last_body = agent_ops.get_last_body(conn, self.turn.agent_id)
        self._last_body = last_body
        return [UIMessage.model_validate(message) for message in stored]

    def _context(self, history: list[UIMessage]) -> TurnContext:
        body = self.turn.body
        if body is None and self.turn.continuation:
            body = self._last_body
        return TurnContext(
            request_id=self.turn.request_id,
            trigger=self.turn.trigger,
            continuation=self.turn.continuation,
            body=body,
            messages=history,
            submission_id=self.turn.request_id if self.turn.is_submission else None,
            metadata=self.turn.metadata,
            attempt=self.turn.attempt,
            stall_timeout_s=type(self.agent).stall_timeout_s,
        )

    def _assembler(self) -> MessageAssembler:
        message_id = self.turn.assistant_message_id or self.turn.request_id
        return MessageAssembler(message_id)

    def _run_model(self, context: TurnContext) -> RunOutcome:
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
            assembler=self._assembler(),
            emit=self._emit,
            should_stop=lambda: self.watch.stopped,
            max_steps=type(self.agent).max_steps or self.jobs.settings.max_steps,
        )
        return runner.run()

    def _emit(self, chunk: Chunk) -> None:
        chunk_json = chunk.model_dump_json(exclude_none=True)
        self.writer.chunk(chunk_json)
        self.watch.chunk_published(revoked=self.writer.revoked)
        if self.caller is not None and self.caller.callback is not None and chunk.type != "error":
            try:
                call_optional(self.caller.callback, "on_event", chunk_json)
            except Exception as error:
                self.callback_error = self.callback_error or error
                self.watch.stop("signal", f"on_event raised: {error}")

    def _not_run(self) -> RunOutcome:
        return RunOutcome("aborted", None, self._assembler().message, False)

    def _failed_before_model(self, error: Exception) -> RunOutcome:
        message = str(error) or type(error).__name__
        return RunOutcome("error", message, self._assembler().message, False)

    # -- the end -------------------------------------------------------------------------------

    def _finish(self, outcome: RunOutcome) -> RunOutcome:
        """Persist the reply and the final status (never overwriting a status set meanwhile)."""
        status, error = outcome.status, outcome.error
        if status == "aborted" and self.watch.reason is not None:
            error = self.watch.reason.text
        self._wrote_final = False
        with self.jobs.db.write() as conn:
            if outcome.has_content:
                conversation_ops.upsert_message(
                    conn,
                    self.turn.agent_id,
                    outcome.message.to_wire(),
                    turn_id=self.turn.id,
                    now=utcnow(),
                )
            if self.turn.body is not None:
                agent_ops.set_last_body(conn, self.turn.agent_id, self.turn.body)
            self._wrote_final = turn_ops.finish_turn(
                conn, self.turn, status=status, error=error, now=utcnow()
            )
            if not self._wrote_final:
                stored = turn_ops.get_turn_by_id(conn, self.turn.id)
                if stored is not None and stored.status != "running":
                    status, error = stored.status, stored.error
        return RunOutcome(status, error, outcome.message, outcome.has_content)

    def _deliver(self, outcome: RunOutcome) -> TurnResult:
        """Close the stream, then call the hooks in Think's order for this outcome."""
        self.writer.done(outcome.status, outcome.error)
        if self._wrote_final:
            self.agent._notify_submission(self._final_record(outcome), outcome.status)
        message = outcome.message if outcome.has_content else None
        response = ChatResponseResult(
            message=message,
            request_id=self.turn.request_id,
            continuation=self.turn.continuation,
            status=cast(TurnStatus, outcome.status),
            error=outcome.error,
        )
        self._call_hooks(response)
        return TurnResult(
            self.turn.request_id, outcome.status, outcome.error, message, self.callback_error
        )

    def _final_record(self, outcome: RunOutcome) -> TurnRecord:
        return turn_ops.replace_record(
            self.turn, status=outcome.status, error=outcome.error, completed_at=utcnow()
        )

    def _call_hooks(self, response: ChatResponseResult) -> None:
        callback = self.caller.callback if self.caller is not None else None
        if response.status == "completed" and callback is not None:
            self._guard_callback(callback, "on_done")
        if response.status == "error":
            _safely(self.agent.on_chat_error, response.error or "")
        _safely(self.agent.on_chat_response, response)
        if response.status == "error" and callback is not None:
            self._guard_callback(callback, "on_error", response.error or "")

    def _guard_callback(self, callback: object, name: str, *args: Any) -> None:
        try:
            call_optional(callback, name, *args)
        except Exception as error:
            self.callback_error = self.callback_error or error


def _safely(hook: Callable[..., Any], *args: Any) -> None:
    try:
        hook(*args)
    except Exception:
        log.exception("%s raised; ignored", getattr(hook, "__name__", "hook"))
