"""``Think``: the agent base class. Override the hooks; call the public methods.

The methods are thin: each delegates to the module that owns the behaviour (submissions,
blocking turns, cancellation, streaming). An instance is only a handle (class + name + the
runtime); all state lives in the database and Redis, so any process may call any method.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from think_jobs import blocking, cancellation, schedules, submissions, validation
from think_jobs.db import conversation as conversation_ops
from think_jobs.db.turns import TurnRecord
from think_jobs.errors import UnknownRequestError
from think_jobs.execution import INTERRUPTED, CallerTurn, MessagesFunction, TurnResult
from think_jobs.limits import Limits
from think_jobs.messages import UIMessage, coerce_messages, stored_messages, user_text_message
from think_jobs.models.base import Model
from think_jobs.results import (
    ChatResponseResult,
    SaveMessagesResult,
    StreamEvent,
    SubmissionInspection,
    SubmitMessagesResult,
    TurnStatus,
)
from think_jobs.scheduled_task import ScheduledTask
from think_jobs.signals import SignalLike
from think_jobs.streaming import StreamRef, broker_errors_mapped, follow, follow_agent
from think_jobs.tools import Tool

if TYPE_CHECKING:
    from think_jobs.context import TurnContext
    from think_jobs.runtime import ThinkJobs
    from think_jobs.submissions import StatusFilter

log = logging.getLogger(__name__)

MessageInput = UIMessage | Mapping[str, Any]
ChatInput = str | MessageInput | Sequence[MessageInput] | MessagesFunction
AgentT = TypeVar("AgentT", bound="Think")


class Think:
    """Base class of every agent. ``agent_type`` defaults to the class name."""

    agent_type: ClassVar[str] = "Think"
    stall_timeout_s: ClassVar[float | None] = None
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
        return f"{self.agent_type}:{self.name}"

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
        return submissions.submit(
            self,
            messages,
            submission_id=submission_id,
            idempotency_key=idempotency_key,
            metadata=metadata,
        )

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
        return submissions.submit(
            self,
            [],
            submission_id=submission_id,
            idempotency_key=idempotency_key,
            metadata=metadata,
            trigger=submissions.REGENERATE,
        )

    def inspect_submission(self, submission_id: str) -> SubmissionInspection | None:
        return submissions.inspect(self, submission_id)

    def list_submissions(
        self, *, status: StatusFilter = None, limit: int = 50, before: str | None = None
    ) -> list[SubmissionInspection]:
        """Newest first; ``before`` (a submission id from an earlier page) lists what is older."""
        return submissions.list_for(self, status=status, limit=limit, before=before)

    def cancel_submission(self, submission_id: str, reason: str | None = None) -> None:
        submissions.cancel(self, submission_id, reason)

    def delete_submission(self, submission_id: str) -> bool:
        return submissions.delete_one(self, submission_id)

    def delete_submissions(
        self,
        *,
        status: StatusFilter = None,
        completed_before: datetime | None = None,
        limit: int = 100,
    ) -> int:
        return submissions.delete_many(
            self, status=status, completed_before=completed_before, limit=limit
        )

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
        with self.jobs.db.read() as conn:
            agent_id = self.jobs.agent_id_of(self, create=False)
            last = None if agent_id is None else conversation_ops.last_message(conn, agent_id)
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
        return blocking.run_blocking(self, request)

    # -- cancellation and reset ----------------------------------------------------------------

    def cancel_chat(self, request_id: str, reason: str | None = None) -> None:
        """Cancel a turn by request id from any process; no-op if unknown or finished."""
        cancellation.cancel_turn(self, request_id, reason, submissions_only=False)

    def abort_request(self, request_id: str, reason: str | None = None) -> None:
        cancellation.cancel_turn(self, request_id, reason, submissions_only=False)

    def abort_all_requests(self) -> None:
        cancellation.abort_running(self, None)

    def reset_turn_state(self) -> None:
        """Skip queued turns and pending submissions; abort the running turn."""
        cancellation.reset_turns(self)

    def clear_messages(self) -> None:
        """Reset turn state, then delete the conversation."""
        cancellation.reset_turns(self)
        blocking.delete_history(self)

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
        TimeoutError after ``timeout_s``, BrokerUnavailableError if Redis fails.
        """
        turn = submissions.find_turn(self, request_id)
        if turn is None:
            raise UnknownRequestError(f"no request {request_id!r} for agent {self.address}")
        ref = StreamRef(self.address, request_id, turn.id)
        events = broker_errors_mapped(
            lambda: follow(
                self.jobs.redis,
                self.jobs.keys,
                ref,
                after_seq=after_seq,
                timeout_s=timeout_s,
                stored=lambda: submissions.stored_end(self, ref.turn_id),
                ttl_s=self.jobs.settings.stream_ttl_s,
                live=live,
            )
        )
        return events

    def subscribe(self, timeout_s: float | None = None) -> Iterator[StreamEvent]:
        """Every event of every request of this agent, live (for dashboards)."""
        return broker_errors_mapped(
            lambda: follow_agent(self.jobs.redis, self.jobs.keys, self.address, timeout_s=timeout_s)
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
        return schedules.run_now(self, task_id, scheduled_for=scheduled_for)

    def next_runs(self) -> dict[str, datetime]:
        """When each scheduled task fires next (aware UTC)."""
        return schedules.next_runs(self)

    # -- internal ------------------------------------------------------------------------------

    def _notify_submission(self, turn: TurnRecord, status: str) -> None:
        if not turn.is_submission or type(self).on_submission_status is Think.on_submission_status:
            return
        record = turn if turn.status == status else _with_status(turn, status)
        try:
            self.on_submission_status(submissions.inspection_of(record))
        except Exception:
            log.exception("on_submission_status raised for %s; ignored", turn.request_id)


def _with_status(turn: TurnRecord, status: str) -> TurnRecord:
    from think_jobs.db.turns import replace_record

    return replace_record(turn, status=status)


def _save_result(result: TurnResult) -> SaveMessagesResult:
    """A stalled turn handed to recovery is ``aborted`` for its caller (SPEC §9)."""
    status = "aborted" if result.status == INTERRUPTED else result.status
    return SaveMessagesResult(
        request_id=result.request_id, status=cast(TurnStatus, status), error=result.error
    )


MessagesCallable = Callable[[list[UIMessage]], Sequence[MessageInput]]
