"""``/api/agents/<type>/chat``: the endpoints the AI SDK's ``DefaultChatTransport`` calls, so a
``useChat({ resume: true })`` page talks to think-jobs with the transport's defaults.

One chat is one agent: the chat ``id`` is the agent's name. ``POST .../chat`` admits the newest
user message of the body as a durable submission whose id is that message's id (a retried POST
adds nothing; the conversation lives on the server, so the client's copy of earlier messages is
never applied again) and answers that turn's UI message stream; ``regenerate-message`` admits
``agent.regenerate()``. ``GET .../chat/<name>/stream`` (the transport's reconnect URL) answers the
agent's active turn from its first chunk, or 204 when no turn is running or waiting. ``POST
.../chat/<name>/stop`` cancels the active turn (the partial reply is kept): in a resumable chat
the SDK's ``stop()`` only disconnects.

The active turn is the running submission, else the oldest pending one: a turn accepted but not
started yet answers its stream (not 204), so the client's status does not fall back to "ready".
A continuation still waiting for a tool approval is not active (nothing will stream until a
human answers).

Tool approvals (AI SDK v6+): when the last message of the body is the assistant's with tool parts
in ``approval-responded`` (``addToolApprovalResponse`` then ``sendAutomaticallyWhen``), the POST
answers those approvals (``respond_to_approval``) and streams the continuation, which extends
that same assistant message. Only the public ``think_jobs`` API is used here.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

from flask import Response, request

from think_jobs import SubmissionInspection, SubmissionStatus, Think, UIMessage
from think_jobs.errors import StoredMessageError
from think_jobs.limits import Limits
from think_jobs.messages import DynamicToolPart, ToolApproval, ToolPart, coerce_messages
from web import auth, params, sse
from web.api_approvals import conflict
from web.api_streams import stream_source
from web.current import current_extension
from web.errors import ApiError, unreadable_message
from web.openapi import SSE, api_blueprint, operation
from web.schemas import CancelBody, ChatBody, ErrorBody

bp = api_blueprint("think_jobs_api_chat", __name__)

BASE = "/agents/<agent_type>/chat"
ONE = BASE + "/<agent_name>"
SOURCE = {"source": "chat"}
REGENERATE = "regenerate-message"
ACTIVE = [SubmissionStatus.PENDING, SubmissionStatus.RUNNING]
PAGE = 100


@bp.post(BASE)
@operation(
    summary="Send the newest user message of a chat and stream its turn (DefaultChatTransport)",
    tag="chat",
    body=ChatBody,
    responses={200: SSE, 409: ErrorBody},
    description=(
        "The chat id is the agent's name. The newest user message is admitted once (its id is "
        "the submission id); a retried request answers the same turn. regenerate-message "
        "replaces the last assistant reply with a new turn."
    ),
)
@auth.requires(auth.WRITE)
def send(agent_type: str) -> Response:
    body = params.json_body(ChatBody)
    agent = params.agent(agent_type, body.id)
    history = _history(agent, body.messages)
    answers = _approval_answers(history)
    if body.trigger == REGENERATE:
        request_id = _regenerate(agent, body.message_id)
    elif answers:
        request_id = _answer(agent, answers)
    else:
        request_id = _submit(agent, _newest_user_message(history))
    return _stream(agent, request_id, after_seq=None)


@bp.get(ONE + "/stream")
@operation(
    summary="Resume a chat: its active turn's stream from the start (204 when none)",
    tag="chat",
    headers={"Last-Event-ID": "Resume after this seq of the active turn."},
    responses={200: SSE, 204: None, 409: ErrorBody},
    description="409 stream_reset: Last-Event-ID is past the end of the turn's ended stream.",
)
@auth.requires(auth.READ)
def resume(agent_type: str, agent_name: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    after_seq = sse.parse_event_id(request.headers.get("Last-Event-ID"))
    active = active_submission(agent)
    if active is None:
        return Response(status=204)
    return _stream(agent, active.request_id, after_seq=after_seq)


@bp.post(ONE + "/stop")
@operation(
    summary="Stop a chat: cancel its active turn, keeping the partial reply (204 when none)",
    tag="chat",
    body=CancelBody,
    responses={200: SubmissionInspection, 204: None},
)
@auth.requires(auth.WRITE)
def stop(agent_type: str, agent_name: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    reason = params.json_body(CancelBody, optional=True).reason
    active = active_submission(agent)
    if active is None:
        return Response(status=204)
    agent.cancel_submission(active.submission_id, reason)
    stopped = agent.inspect_submission(active.submission_id)
    return params.model_response(stopped or active)


def active_submission(agent: Think) -> SubmissionInspection | None:
    """The running submission, else the oldest pending one (the next to run) that does not
    wait for a tool approval, else None."""
    waiting = {a.continuation_id for a in agent.list_approvals(status="pending")}
    oldest = None
    for found in _active_submissions(agent):
        if found.status == SubmissionStatus.RUNNING:
            return found
        if found.submission_id not in waiting:
            oldest = found
    return oldest


def _active_submissions(agent: Think) -> Iterator[SubmissionInspection]:
    """Pending and running submissions, newest first, each page read in one query."""
    before = None
    while True:
        page = agent.list_submissions(status=ACTIVE, limit=PAGE, before=before)
        yield from page
        if len(page) < PAGE:
            return
        before = page[-1].submission_id


def _history(agent: Think, messages: Sequence[Any]) -> list[UIMessage]:
    """The client's copy of the chat, checked like any input (each message within the
    limits, every id by the id rule) though only the newest user message is admitted: the
    count limit of a submission does not apply to a whole conversation."""
    limits = Limits.of(agent.jobs.settings)
    lifted = dataclasses.replace(limits, messages_per_submission=max(len(messages), 1))
    history = coerce_messages(messages, limits=lifted)
    for index, message in enumerate(history):
        params.identifier(message.id, f"body.messages[{index}].id")
    return history


def _approval_answers(history: Sequence[UIMessage]) -> list[ToolApproval]:
    """The answered approvals of the client's last message, when it is the assistant's."""
    if not history or history[-1].role != "assistant":
        return []
    return [
        part.approval
        for part in history[-1].parts
        if isinstance(part, ToolPart | DynamicToolPart)
        and part.state == "approval-responded"
        and part.approval is not None
        and part.approval.approved is not None
    ]


def _answer(agent: Think, answers: Sequence[ToolApproval]) -> str:
    """Answer the approvals (a retried request answers nothing new) and name the
    continuation to stream; an approval closed otherwise is a 409."""
    stored = None
    for answer in answers:
        approved = bool(answer.approved)
        stored = agent.respond_to_approval(
            params.identifier(answer.id, "body.messages[-1].parts[].approval.id"),
            approved,
            answer.reason,
        )
        if stored.status.value != ("approved" if approved else "denied"):
            raise conflict(stored)
    assert stored is not None
    return stored.continuation_id


def _newest_user_message(history: Sequence[UIMessage]) -> UIMessage:
    for message in reversed(history):
        if message.role == "user":
            return message
    raise ApiError(
        400, "body.messages: a chat request needs a user message", type="validation_error"
    )


def _submit(agent: Think, message: UIMessage) -> str:
    """Admit ``message`` once: its id is the submission id. Sent again with other content
    (an edit) it is a 409: the agent keeps the message it has."""
    result = agent.submit_messages([message], submission_id=message.id, metadata=SOURCE)
    if not result.accepted and _edited(agent, message):
        raise ApiError(
            409,
            f"message {message.id!r} was already sent with other content; editing a sent "
            "message is not supported (send a new message)",
            type="message_edited",
        )
    return result.request_id


def _edited(agent: Think, message: UIMessage) -> bool:
    stored = next((m for m in _conversation(agent) if m.id == message.id), None)
    return stored is not None and stored.to_wire()["parts"] != message.to_wire()["parts"]


def _conversation(agent: Think) -> list[UIMessage]:
    try:
        return agent.get_messages()
    except StoredMessageError as error:
        raise unreadable_message(error, agent.agent_type, agent.name) from error


def _regenerate(agent: Think, message_id: str | None) -> str:
    """Admit a turn that replaces the last reply. While one is pending or running, a second
    request (a retry, a double click) joins it instead of stacking another."""
    if message_id is not None:
        _check_last_reply(agent, message_id)
    newest = agent.list_submissions(limit=1)
    if newest and _is_regenerate(newest[0]) and not newest[0].status.terminal:
        return newest[0].request_id
    after = newest[0].submission_id if newest else ""
    submission_id = "regenerate-" + hashlib.sha256(after.encode()).hexdigest()[:32]
    metadata = {**SOURCE, "trigger": REGENERATE}
    return agent.regenerate(submission_id=submission_id, metadata=metadata).request_id


def _is_regenerate(found: SubmissionInspection) -> bool:
    return (found.metadata or {}).get("trigger") == REGENERATE


def _check_last_reply(agent: Think, message_id: str) -> None:
    """``regenerate({ messageId })`` may name the last reply or the user message it answers."""
    conversation = _conversation(agent)
    last_user = next((m.id for m in reversed(conversation) if m.role == "user"), None)
    last_reply = conversation[-1].id if conversation and conversation[-1].role != "user" else None
    if message_id not in (last_user, last_reply):
        raise ApiError(
            409,
            f"only the last reply can be regenerated; {message_id!r} is not it",
            type="regenerate_conflict",
        )


def _stream(agent: Think, request_id: str, *, after_seq: int | None) -> Response:
    source = stream_source(agent, request_id, after_seq)
    limits = current_extension().stream_limits()
    return sse.response(sse.events(source, after_seq=after_seq, limits=limits))
