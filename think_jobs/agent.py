"""``Think``: the agent base class. Override the hooks; call the public methods.

The methods are thin: each passes the runtime's ``Services`` and the agent itself (an
``engine.ports.AgentHooks``) to the engine module that owns the behaviour (submissions,
blocking turns, cancellation, streams, schedules, repairs). An instance is only a handle
(class + name + the runtime); all state lives in the database and Redis, so any process may
call any method.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from think_jobs import validation
from think_jobs.db import conversation as conversation_ops
from think_jobs.domain.status import INTERRUPTED
from think_jobs.engine import approvals, blocking, cancellation, repair, schedules, submissions
from think_jobs.engine.execution import CallerTurn, MessagesFunction, TurnResult
from think_jobs.engine.ports import Services
from think_jobs.engine.repair import Repair, UnreadableMessage
from think_jobs.errors import UnknownRequestError
from think_jobs.keys import agent_address
from think_jobs.limits import Limits
from think_jobs.messages import UIMessage, coerce_messages, stored_messages, user_text_message
from think_jobs.models.base import Model
from think_jobs.results import (
    Approval,
    ChatResponseResult,
    SaveMessagesResult,
    StreamEvent,
    SubmissionInspection,
    SubmissionStatus,
    SubmitMessagesResult,
    TurnStatus,
)
from think_jobs.scheduled_task import ScheduledTask
from think_jobs.signals import SignalLike
from think_jobs.tools import Tool
from think_jobs.transport.streams import StreamRef, broker_errors_mapped, follow, follow_agent

if TYPE_CHECKING:
    from think_jobs.context import TurnContext
    from think_jobs.engine.submissions import StatusFilter, SubmissionPage
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)

MessageInput = UIMessage | Mapping[str, Any]
ChatInput = str | MessageInput | Sequence[MessageInput] | MessagesFunction
AgentT = TypeVar("AgentT", bound="Think")


class Think:
    """Base class of every agent. ``agent_type`` defaults to the class name."""

    agent_type: ClassVar[str] = "Think"
    stall_timeout_s: ClassVar[float | None] = None
    turn_timeout_s: ClassVar[float | None] = None
    max_steps: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "agent_type" not in cls.__dict__:
            cls.agent_type = cls.__name__

    def __init__(self, jobs: ThinkJobs, name: str) -> None:
        self.jobs = jobs
        self.name = name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.address}>"

    @property
    def address(self) -> str:
        """``<agent_type>:<name>``, how Redis keys and logs name this agent."""
        return agent_address(self.agent_type, self.name)

    @property
    def _services(self) -> Services:
        return self.jobs.services

    def overrides(self, hook: str) -> bool:
        """Whether this agent's class overrides the hook named ``hook``."""
        return getattr(type(self), hook) is not getattr(Think, hook)

    # -- hooks (override) ----------------------------------------------------------------------

    def get_model(self) -> Model:
        raise NotImplementedError(f"{type(self).__name__} must implement get_model()")

    def get_system_prompt(self) -> str:
        return "You are a helpful assistant."

    def get_tools(self) -> dict[str, Tool]:
        return {}

    def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
        return {}

    def get_default_timezone(self) -> str | None:
        return None

    def before_turn(self, ctx: TurnContext) -> None:
        """Called inside the turn, after its messages were applied, before the model runs."""

    def on_chat_response(self, result: ChatResponseResult) -> None:
        """Called once per turn on every path, inside the turn."""

    def on_chat_error(self, error: str) -> None:
        """Called inside the turn when the model failed (before ``on_chat_response``)."""

    def on_submission_status(self, inspection: SubmissionInspection) -> None:
        """Called on every status transition of a submission; exceptions are logged."""

    def webhook_to_messages(
        self, payload: Any, headers: Mapping[str, str]
    ) -> Sequence[MessageInput]:
        """Turn a webhook delivery into the messages to submit (default: its JSON as text)."""
        text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
        return [user_text_message(text)]

    # -- durable submissions -------------------------------------------------------------------

    def submit_messages(
        self,
        messages: Sequence[MessageInput],
        *,
        submission_id: str | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SubmitMessagesResult:
        """Accept a turn durably and return before the model runs (see SPEC §5)."""
        return self._submit(messages, submission_id, idempotency_key, metadata, "submission")

    def regenerate(
        self,
        *,
        submission_id: str | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SubmitMessagesResult:
        """Accept a turn durably that replaces the agent's last assistant reply with a new one
        (``useChat``'s regenerate): when its turn comes, the last message is removed if it is
        an assistant reply, and the model answers the conversation again."""
        regenerate = submissions.REGENERATE
        return self._submit([], submission_id, idempotency_key, metadata, regenerate)

    def _submit(
        self,
        messages: Sequence[MessageInput],
        submission_id: str | None,
        idempotency_key: str | None,
        metadata: Mapping[str, Any] | None,
        trigger: str,
    ) -> SubmitMessagesResult:
        submission = submissions.validated(
            self._services,
            messages,
            submission_id=submission_id,
            idempotency_key=idempotency_key,
            metadata=metadata,
            trigger=trigger,
        )
        return submissions.submit(self._services, self, submission)

    def inspect_submission(self, submission_id: str) -> SubmissionInspection | None:
        return submissions.inspect(self._services, self, submission_id)

    def list_submissions(
        self, *, status: StatusFilter = None, limit: int = 50, before: str | None = None
    ) -> list[SubmissionInspection]:
        """Newest first; ``before`` (a submission id from an earlier page) lists what is older."""
        return self.page_submissions(status=status, limit=limit, before=before).rows

    def page_submissions(
        self, *, status: StatusFilter = None, limit: int = 50, before: str | None = None
    ) -> SubmissionPage:
        """One page of ``list_submissions`` and the cursor of the next (older) page."""
        services = self._services
        return submissions.page_of(services, self, status=status, limit=limit, before=before)

    def cancel_submission(self, submission_id: str, reason: str | None = None) -> None:
        submissions.cancel(self._services, self, submission_id, reason)

    def delete_submission(self, submission_id: str) -> bool:
        return submissions.delete_one(self._services, self, submission_id)

    def delete_submissions(
        self,
        *,
        status: StatusFilter = None,
        completed_before: datetime | None = None,
        limit: int = 100,
    ) -> int:
        return submissions.delete_many(
            self._services, self, status=status, completed_before=completed_before, limit=limit
        )

    def list_approvals(
        self, status: str | Sequence[str] | None = None, *, request_id: str | None = None
    ) -> list[Approval]:
        """The agent's tool approvals, oldest first, at most 1000 (``status``: one or several
        of pending, approved, denied, expired, cancelled; ``request_id``: only those the turn
        asked, or that the continuation with that id waits for)."""
        return approvals.list_for(self._services, self, status, request_id=request_id)

    def get_approval(self, approval_id: str) -> Approval | None:
        """One tool approval of this agent, or None."""
        return approvals.get(self._services, self, approval_id)

    def respond_to_approval(
        self, approval_id: str, approved: bool, reason: str | None = None
    ) -> Approval:
        """Answer a tool call's approval from any process: approved, the tool runs and the
        model goes on; denied, the model is told. Returns the approval as stored; one already
        closed is returned unchanged (a second answer is a no-op). Unknown id:
        ``UnknownApprovalError``."""
        return approvals.respond(self._services, self, approval_id, approved, reason)

    def request_status(self, request_id: str) -> SubmissionStatus | None:
        """The status of the turn with this request id (any turn: submissions and blocking
        calls alike), or None when the agent has no such turn."""
        turn = submissions.find_turn(self._services, self, request_id)
        return None if turn is None else turn.status

    def submitted_messages(self, request_id: str) -> list[UIMessage]:
        """The messages the turn with this request id was submitted with (empty for a blocking
        call's turn, a regenerate, or an unknown request)."""
        turn = submissions.find_turn(self._services, self, request_id)
        wire = turn.messages if turn is not None else None
        return [UIMessage.model_validate(item) for item in wire or []]

    # -- blocking turns ------------------------------------------------------------------------

    def save_messages(
        self,
        messages_or_fn: Sequence[MessageInput] | MessagesFunction,
        *,
        signal: SignalLike | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> SaveMessagesResult:
        """Append messages and run a turn in this process when its turn comes; wait for it."""
        result = self._run_blocking("save_messages", messages_or_fn, signal=signal, body=body)
        return _save_result(result)

    def continue_last_turn(
        self, body: Mapping[str, Any] | None = None, *, signal: SignalLike | None = None
    ) -> SaveMessagesResult:
        """Run the model again after the last assistant message; its output is a new message."""
        agent_id = self.jobs.agent_id_of(self, create=False)
        last = None
        if agent_id is not None:
            with self.jobs.db.read() as conn:
                last = conversation_ops.last_message(conn, agent_id)
        if last is None or last.get("role") != "assistant":
            return SaveMessagesResult(request_id="", status="skipped")
        result = self._run_blocking(
            "continue_last_turn", [], signal=signal, body=body, continuation=True
        )
        return _save_result(result)

    def chat(
        self,
        user_message: ChatInput,
        callback: object,
        *,
        signal: SignalLike | None = None,
        metadata: Mapping[str, Any] | None = None,
        tools: object = None,
    ) -> None:
        """Run a full turn here, streaming it to ``callback`` (see ``StreamCallback``)."""
        if tools is not None:
            warnings.warn("chat() no longer accepts tools", DeprecationWarning, stacklevel=2)
        messages: Sequence[MessageInput] | MessagesFunction
        if isinstance(user_message, str):
            messages = [user_text_message(user_message)]
        elif isinstance(user_message, UIMessage | Mapping):
            messages = [user_message]
        else:
            messages = user_message
        result = self._run_blocking(
            "chat", messages, signal=signal, callback=callback, metadata=metadata
        )
        if result.callback_error is not None:
            raise result.callback_error

    def _run_blocking(
        self,
        trigger: str,
        messages: Sequence[MessageInput] | MessagesFunction,
        *,
        signal: SignalLike | None,
        body: Mapping[str, Any] | None = None,
        callback: object | None = None,
        metadata: Mapping[str, Any] | None = None,
        continuation: bool = False,
    ) -> TurnResult:
        function = messages if callable(messages) else None
        limits = Limits.of(self.jobs.settings)  # the same edge as submit_messages
        static = None
        if function is None:
            given = cast(Sequence[MessageInput], messages)
            static = [m.to_wire() for m in coerce_messages(given, limits=limits)]
        request = blocking.BlockingRequest(
            trigger=trigger,
            payload=function,
            static_messages=static,
            body=validation.body_object(body, limits=limits),
            continuation=continuation,
            metadata=validation.json_object(metadata, "metadata", limits=limits),
            caller=CallerTurn(payload=function, signal=signal, callback=callback),
        )
        return blocking.run_blocking(self._services, self, request)

    # -- cancellation and reset ----------------------------------------------------------------

    def cancel_chat(self, request_id: str, reason: str | None = None) -> None:
        """Cancel a turn by request id from any process; no-op if unknown or finished."""
        cancellation.cancel_turn(self._services, self, request_id, reason, submissions_only=False)

    def abort_request(self, request_id: str, reason: str | None = None) -> None:
        cancellation.cancel_turn(self._services, self, request_id, reason, submissions_only=False)

    def abort_all_requests(self) -> None:
        cancellation.abort_running(self._services, self, None)

    def reset_turn_state(self) -> None:
        """Skip queued turns and pending submissions; abort the running turn."""
        cancellation.reset_turns(self._services, self)

    def clear_messages(self) -> None:
        """Reset turn state, then delete the conversation."""
        cancellation.reset_turns(self._services, self)
        blocking.delete_history(self._services, self)

    # -- reading -------------------------------------------------------------------------------

    def get_messages(self) -> list[UIMessage]:
        agent_id = self.jobs.agent_id_of(self, create=False)
        if agent_id is None:
            return []
        with self.jobs.db.read() as conn:
            return stored_messages(conversation_ops.load_messages_json(conn, agent_id))

    def stream(
        self,
        request_id: str,
        after_seq: int | None = None,
        timeout_s: float | None = None,
        *,
        live: bool = True,
    ) -> Iterator[StreamEvent]:
        """A request's events: replayed from the buffer, then live, until ``done``. A finished
        turn whose buffer is gone (expired, Redis restarted empty) is replayed from its stored
        reply. ``live=False`` gives what the stream holds now and stops.

        Raises UnknownRequestError when the agent has no turn with this request id,
        TimeoutError after ``timeout_s``, BrokerUnavailableError if Redis fails, and
        StreamResetError when ``after_seq`` is past the end of the stream (at once if the
        stream has ended, else once this reader completed it from the database): a position
        from before the buffer was lost and rebuilt. Resumed exactly at the end: no events.
        """
        services = self._services
        turn = submissions.find_turn(services, self, request_id)
        if turn is None:
            raise UnknownRequestError(f"no request {request_id!r} for agent {self.address}")
        ref = StreamRef(self.address, request_id, turn.id)
        return broker_errors_mapped(
            lambda: follow(
                services.redis,
                services.keys,
                ref,
                after_seq=after_seq,
                timeout_s=timeout_s,
                stored=lambda: submissions.stored_end(services, ref.turn_id),
                ttl_s=services.settings.stream_ttl_s,
                live=live,
            )
        )

    def subscribe(self, timeout_s: float | None = None) -> Iterator[StreamEvent]:
        """Every event of every request of this agent, live (for dashboards)."""
        services = self._services
        return broker_errors_mapped(
            lambda: follow_agent(services.redis, services.keys, self.address, timeout_s=timeout_s)
        )

    def sub_agent(self, cls: type[AgentT], name: str) -> AgentT:
        """The child agent ``cls``/``name`` (the same class and name give the same agent)."""
        return self.jobs.get_agent(cls, name)

    def start(self) -> None:
        """Make the agent exist (its row, and its schedules) without sending it anything."""
        self.jobs.agent_id_of(self, create=True)

    # -- schedules -----------------------------------------------------------------------------

    def run_scheduled_task(
        self, task_id: str, *, scheduled_for: datetime | None = None
    ) -> SubmitMessagesResult | None:
        """Fire one occurrence of a scheduled task now (a "run now" button); returns the
        submission of a prompt task, None for a handler task."""
        return schedules.run_now(self._services, self, task_id, scheduled_for=scheduled_for)

    def next_runs(self) -> dict[str, datetime]:
        """When each scheduled task fires next (aware UTC)."""
        return schedules.next_runs(self._services, self)

    # -- repairs (operators) -------------------------------------------------------------------

    def unreadable_messages(self) -> list[UnreadableMessage]:
        """Stored messages of this agent that no longer read back (``think-jobs messages``)."""
        return repair.unreadable_messages(self._services, self)

    def remove_message(self, message_id: str) -> bool:
        """Delete one stored message; True if it existed."""
        return repair.remove_message(self._services, self, message_id)

    def repair_message(self, message_id: str) -> Repair:
        """Keep what of a stored message still reads back (its id, role, readable parts)."""
        return repair.repair_message(self._services, self, message_id)


def _save_result(result: TurnResult) -> SaveMessagesResult:
    """A stalled turn handed to recovery is ``aborted`` for its caller (SPEC §9)."""
    status = "aborted" if result.status == INTERRUPTED else result.status
    return SaveMessagesResult(
        request_id=result.request_id, status=cast(TurnStatus, status), error=result.error
    )
