"""Tool calls that wait for a human, durably (SPEC §13).

When a turn's model calls a tool declared ``needs_approval``, the attempt ends after that
step and its final write (one fenced transaction) also stores, here:

- the open approvals (``think_approvals``), one per waiting call;
- the turn's **continuation**: a submission admitted with the finished turn's own number in
  the agent's line (the turn takes its row id, negated), so the turns admitted behind it stay
  behind — the conversation cannot move on with an open tool call. It waits
  (``awaiting_approval``) and nobody claims it until every approval of it is closed.

``respond`` closes an approval from any process (a second answer changes nothing) and, once
the continuation's last approval is closed, lets it run: a worker applies the answers (the
tool runs, or ``tool-output-denied``) and the model loop goes on, extending the same reply.
An approval open past ``approval_timeout_s`` expires (the sweeper: denied, with a reason);
cancelling the submission that asked, or its continuation, cancels its approvals and the
continuation, and the line moves on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from think_jobs import validation
from think_jobs.assembly import MessageAssembler
from think_jobs.db import approvals as approval_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.engine import Connection
from think_jobs.domain.records import ApprovalAnswer, ApprovalAsked, NewTurn, TurnRecord
from think_jobs.domain.status import ApprovalStatus, Kind, Status
from think_jobs.engine import events
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.errors import InvalidInputError, UnknownApprovalError
from think_jobs.messages import AWAITING_ANSWER, DynamicToolPart, ToolApproval, ToolPart, UIMessage
from think_jobs.results import Approval

log = logging.getLogger(__name__)

APPROVAL_TRIGGER = "approval"  # the trigger of a continuation that applies approvals
EXPIRED_REASON = "The approval expired after {timeout:g} s without an answer."
CANCELLED_REASON = "The submission was cancelled before the approval was answered."
_LIST_LIMIT = 1000
_EXPIRE_BATCH = 100

__all__ = [
    "APPROVAL_TRIGGER",
    "answers_for",
    "cancel_for_turns",
    "expire_overdue",
    "get",
    "hold_place",
    "list_for",
    "respond",
    "responded",
]


# -- asking (inside the asking turn's final write) ---------------------------------------------


def hold_place(
    conn: Connection, turn: TurnRecord, asked: Sequence[ApprovalAsked], reply: UIMessage
) -> TurnRecord:
    """Store ``asked`` and admit the continuation of ``reply`` in ``turn``'s place (``conn``:
    the turn's fenced final write, which just ended it); returns the continuation."""
    turn_ops.give_up_place(conn, turn)
    new = NewTurn(
        request_id=f"continue-{asked[0].approval_id}",
        kind=Kind.SUBMISSION,
        trigger=APPROVAL_TRIGGER,
        metadata=turn.metadata,
        continuation=True,
        trace_context=turn.trace_context,
        assistant_message_id=turn.assistant_message_id,
        awaiting_approval=True,
        extends=reply.to_wire(),
    )
    continuation = turn_ops.insert_turn(conn, agent_id=turn.agent_id, seq=turn.seq, new=new).turn
    approval_ops.insert_approvals(
        conn,
        asked,
        agent_id=turn.agent_id,
        turn=(turn.id, turn.request_id),
        continuation=(continuation.id, continuation.request_id),
    )
    return continuation


# -- answering ---------------------------------------------------------------------------------


def list_for(
    services: Services,
    agent: AgentHooks,
    status: str | Iterable[str] | None,
    *,
    request_id: str | None = None,
) -> list[Approval]:
    """The agent's approvals, oldest first, optionally of one or several statuses, or of one
    request (the turn that asked, or the continuation)."""
    statuses = _statuses(status)
    request_id = validation.optional_id(request_id, "request_id")
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return []
    with services.db.read() as conn:
        return approval_ops.list_approvals(
            conn, agent_id, statuses=statuses, request_id=request_id, limit=_LIST_LIMIT
        )


def get(services: Services, agent: AgentHooks, approval_id: str) -> Approval | None:
    approval_id = validation.identifier(approval_id, "approval_id")
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return None
    with services.db.read() as conn:
        return approval_ops.get_approval(conn, agent_id, approval_id)


def _statuses(status: str | Iterable[str] | None) -> list[str] | None:
    if status is None:
        return None
    values = [status] if isinstance(status, str) else list(status)
    known = [member.value for member in ApprovalStatus]
    unknown = [value for value in values if value not in known]
    if unknown:
        raise InvalidInputError(
            f"status: unknown approval status {', '.join(map(repr, unknown))}; "
            f"expected one of {', '.join(known)}"
        )
    return values


def respond(
    services: Services,
    agent: AgentHooks,
    approval_id: str,
    approved: bool,
    reason: str | None,
) -> Approval:
    """Answer an approval; an approval already closed is returned as it is (a no-op)."""
    approval_id = validation.identifier(approval_id, "approval_id")
    if not isinstance(approved, bool):
        raise InvalidInputError(f"approved: expected true or false, got {approved!r}")
    reason = validation.reason(reason)
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        raise UnknownApprovalError(f"no approval {approval_id!r} for agent {agent.address}")
    status = ApprovalStatus.APPROVED if approved else ApprovalStatus.DENIED
    closed = _close(services, [approval_id], status, reason, agent_id=agent_id)
    if closed:
        log.info("approval answered", extra={"approval_id": approval_id, "status": status.value})
        return closed[0]
    with services.db.read() as conn:
        found = approval_ops.get_approval(conn, agent_id, approval_id)
    if found is None:
        raise UnknownApprovalError(f"no approval {approval_id!r} for agent {agent.address}")
    return found


@dataclass(frozen=True)
class _Released:
    agent_id: int
    continuation: TurnRecord


def _close(
    services: Services,
    approval_ids: Sequence[str],
    status: ApprovalStatus,
    reason: str | None,
    *,
    agent_id: int | None = None,
) -> list[Approval]:
    """Close open approvals in one transaction; a continuation left with none open may run."""
    closed: list[Approval] = []
    released: list[_Released] = []
    with services.db.write() as conn:
        for approval_id in approval_ids:
            decided = approval_ops.decide(conn, approval_id, status, reason, agent_id=agent_id)
            if decided is None:
                continue
            closed.append(decided.approval)
            turn = _released_continuation(conn, decided.continuation_turn_id)
            if turn is not None:
                released.append(_Released(decided.agent_id, turn))
    for item in released:
        services.dispatch.enqueue_drain(item.agent_id)
    return closed


def _released_continuation(conn: Connection, continuation_turn_id: int) -> TurnRecord | None:
    """The continuation, if the approval just closed was the last one open: it may run now.
    Its row is locked before the count, so of two transactions closing its last two
    approvals at once the second counts after the first committed and releases it (each
    counted the other's as open, and the continuation waited for good: PostgreSQL)."""
    turn_ops.lock_turn(conn, continuation_turn_id)
    if approval_ops.open_count(conn, continuation_turn_id):
        return None
    if not turn_ops.stop_awaiting(conn, continuation_turn_id):
        return None
    return turn_ops.get_turn_by_id(conn, continuation_turn_id)


def extended(turn: TurnRecord) -> UIMessage | None:
    """The reply an approval continuation extends, as the turn that asked stored it."""
    if turn.extends is None:
        return None
    return UIMessage.model_validate(turn.extends)


def responded(reply: UIMessage, answers: Sequence[ApprovalAnswer]) -> UIMessage:
    """``reply`` as a client holds it once its approvals are answered (the AI SDK's
    ``addToolApprovalResponse``): each call still waiting for one of ``answers`` in
    ``approval-responded``, as the model loop records it. A continuation's stream applies
    to this: it carries the tools' outputs (or ``tool-output-denied``) and what follows."""
    assembler = MessageAssembler(reply.id, metadata=reply.metadata, parts=reply.parts)
    waiting = {
        part.tool_call_id
        for part in reply.parts
        if isinstance(part, ToolPart | DynamicToolPart) and part.state in AWAITING_ANSWER
    }
    for answer in answers:
        if answer.tool_call_id in waiting:
            approval = ToolApproval(
                id=answer.approval_id, approved=answer.approved, reason=answer.reason
            )
            assembler.respond(answer.tool_call_id, approval)
    return assembler.message


def answered_base(services: Services, turn: TurnRecord) -> UIMessage | None:
    """The reply an approval's continuation extends, answered: what its stream's chunks apply
    to (None: the turn is no such continuation)."""
    if extended(turn) is None:
        return None
    with services.db.read() as conn:
        return answered_base_in(conn, turn)


def answered_base_in(conn: Connection, turn: TurnRecord) -> UIMessage | None:
    """``answered_base`` read in ``conn`` (a transaction holding a connection already, such as
    a claim's, takes no second one from the pool)."""
    seed = extended(turn)
    return None if seed is None else responded(seed, _answers_in(conn, turn))


def answers_for(services: Services, continuation: TurnRecord) -> list[ApprovalAnswer]:
    """What a continuation applies: every closed approval it waited for (a cancelled one
    never reaches here: its continuation was cancelled with it)."""
    with services.db.read() as conn:
        return _answers_in(conn, continuation)


def _answers_in(conn: Connection, continuation: TurnRecord) -> list[ApprovalAnswer]:
    found = approval_ops.of_continuation(conn, continuation.id)
    return [
        ApprovalAnswer(item.approval_id, item.tool_call_id, item.status.approved, item.reason)
        for item in found
        if item.status is not ApprovalStatus.PENDING
    ]


# -- expiry and cancellation -------------------------------------------------------------------


def expire_overdue(services: Services) -> int:
    """Deny the approvals open longer than ``approval_timeout_s``; returns how many."""
    timeout_s = services.settings.approval_timeout_s
    if timeout_s is None:
        return 0
    with services.db.read() as conn:
        overdue = approval_ops.overdue(conn, timeout_s=timeout_s, limit=_EXPIRE_BATCH)
    if not overdue:
        return 0
    reason = EXPIRED_REASON.format(timeout=timeout_s)
    expired = _close(services, overdue, ApprovalStatus.EXPIRED, reason)
    for approval in expired:
        log.info("approval expired", extra={"approval_id": approval.approval_id})
    return len(expired)


def cancel_for_turns(conn: Connection, turns: Sequence[TurnRecord]) -> list[TurnRecord]:
    """Inside a cancellation's transaction: cancel the open approvals asked by (or waited for
    by) ``turns``, mark their calls denied in the stored reply (the conversation moves on
    without an open tool call) and abort their continuations, which are returned."""
    if not turns:
        return []
    open_ids = approval_ops.open_of_turns(conn, [turn.id for turn in turns])
    aborted: dict[int, TurnRecord] = {}
    denials: dict[int, tuple[TurnRecord, dict[str, ToolApproval]]] = {}
    for approval_id in open_ids:
        decided = approval_ops.decide(conn, approval_id, ApprovalStatus.CANCELLED, CANCELLED_REASON)
        turn = (
            None if decided is None else turn_ops.get_turn_by_id(conn, decided.continuation_turn_id)
        )
        if decided is None or turn is None:
            continue
        _calls_of(denials, turn)[decided.approval.tool_call_id] = _denial(decided.approval)
        ended = turn_ops.end_turn(conn, turn.id, status=Status.ABORTED, error=CANCELLED_REASON)
        if ended is not None:
            aborted[turn.id] = turn
    for turn in turns:
        if turn.status is Status.PENDING and turn.trigger == APPROVAL_TRIGGER:
            _deny_unapplied(conn, turn, _calls_of(denials, turn))
    for continuation, calls in denials.values():
        _deny_in_reply(conn, continuation, calls)
    return list(aborted.values())


NOT_RUN_REASON = "Approved, but the turn was cancelled before the tool ran."


def _calls_of(
    denials: dict[int, tuple[TurnRecord, dict[str, ToolApproval]]], continuation: TurnRecord
) -> dict[str, ToolApproval]:
    """The calls to deny in ``continuation``'s reply (its reply is read and written once)."""
    return denials.setdefault(continuation.id, (continuation, {}))[1]


def _denial(approval: Approval, reason: str | None = None) -> ToolApproval:
    return ToolApproval(id=approval.approval_id, approved=False, reason=reason or approval.reason)


def _deny_unapplied(
    conn: Connection, continuation: TurnRecord, calls: dict[str, ToolApproval]
) -> None:
    """A continuation ended before it ran (cancelled, skipped by a reset) applies none of its
    answers: each call of the stored reply still waiting for one is denied — an approved
    one's tool never ran — so the conversation moves on without an open tool call (the
    answered ones stayed ``approval-requested``: a client showed the buttons again)."""
    for approval in approval_ops.of_continuation(conn, continuation.id):
        reason = NOT_RUN_REASON if approval.status is ApprovalStatus.APPROVED else None
        calls.setdefault(approval.tool_call_id, _denial(approval, reason))


def _deny_in_reply(
    conn: Connection, continuation: TurnRecord, calls: Mapping[str, ToolApproval]
) -> None:
    """Mark ``calls`` (call id: the denial) denied in the stored reply, those still waiting
    for an answer; one read and, if any changed, one write."""
    message_id = continuation.assistant_message_id
    raw = (
        None
        if message_id is None
        else conversation_ops.message_json(conn, continuation.agent_id, message_id)
    )
    if raw is None or message_id is None:
        return
    message = UIMessage.model_validate_json(raw)
    changed = False
    for part in message.parts:
        if not isinstance(part, ToolPart | DynamicToolPart) or part.state not in AWAITING_ANSWER:
            continue
        denial = calls.get(part.tool_call_id)
        if denial is not None:
            part.state, part.approval, changed = "output-denied", denial, True
    if changed:
        conversation_ops.replace_message(conn, continuation.agent_id, message_id, message.to_wire())


def waiting_reason(services: Services, continuation: TurnRecord) -> str:
    """Why a continuation does not run: the approvals it waits for."""
    with services.db.read() as conn:
        found = approval_ops.of_continuation(conn, continuation.id)
    waiting = [a for a in found if a.status is ApprovalStatus.PENDING]
    names = ", ".join(f"{a.tool_name} (approval {a.approval_id})" for a in waiting)
    return f"waiting for a human to approve or deny {names or 'its tool calls'}"


def announce_continuation(agent: AgentHooks, continuation: TurnRecord) -> None:
    """The continuation was admitted (with its turn's final write)."""
    log.info(
        "turn waits for tool approval",
        extra={"agent": agent.address, "submission_id": continuation.request_id},
    )
    events.status_changed(agent, continuation, Status.PENDING)
