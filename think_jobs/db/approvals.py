"""Named operations on ``think_approvals``: tool calls waiting for a human, and their answers.

An approval is written in the transaction of its turn's final write (never alone), answered
once (``decide`` only moves a ``pending`` row), and read by the continuation turn that goes
on once every approval of its turn is closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, func, select, update

from think_jobs.db.dialect import db_now, db_now_plus, seconds_param
from think_jobs.db.tables import approvals
from think_jobs.domain.records import ApprovalAsked
from think_jobs.domain.status import ApprovalStatus
from think_jobs.results import Approval

_PENDING = ApprovalStatus.PENDING.value


@dataclass(frozen=True)
class Decided:
    """An approval moved out of ``pending``: the record, and its continuation's row id."""

    approval: Approval
    agent_id: int
    continuation_turn_id: int


def _approval(row: Row[Any]) -> Approval:
    values = row._mapping
    return Approval(
        approval_id=values["approval_id"],
        request_id=values["request_id"],
        continuation_id=values["continuation_id"],
        tool_name=values["tool_name"],
        tool_call_id=values["tool_call_id"],
        input=values["input"],
        status=ApprovalStatus(values["status"]),
        created_at=values["created_at"],
        decided_at=values["decided_at"],
        reason=values["reason"],
    )


def insert_approvals(
    conn: Connection,
    asked: Sequence[ApprovalAsked],
    *,
    agent_id: int,
    turn: tuple[int, str],
    continuation: tuple[int, str],
) -> None:
    """Store the turn's open approvals (``turn`` and ``continuation``: row id, request id)."""
    rows = [
        {
            "approval_id": item.approval_id,
            "agent_id": agent_id,
            "turn_id": turn[0],
            "request_id": turn[1],
            "continuation_turn_id": continuation[0],
            "continuation_id": continuation[1],
            "tool_name": item.tool_name,
            "tool_call_id": item.tool_call_id,
            "input": item.input,
            "status": _PENDING,
            "reason": None,
            "decided_at": None,
        }
        for item in asked
    ]
    conn.execute(approvals.insert().values(created_at=db_now()), rows)


def list_approvals(
    conn: Connection,
    agent_id: int,
    *,
    statuses: Sequence[str] | None,
    request_id: str | None = None,
    limit: int,
) -> list[Approval]:
    """The agent's approvals, oldest first (``request_id``: asked by, or continued by)."""
    query = select(approvals).where(approvals.c.agent_id == agent_id)
    if statuses is not None:
        query = query.where(approvals.c.status.in_(statuses))
    if request_id is not None:
        query = query.where(
            (approvals.c.request_id == request_id) | (approvals.c.continuation_id == request_id)
        )
    query = query.order_by(approvals.c.created_at, approvals.c.id).limit(limit)
    return [_approval(row) for row in conn.execute(query)]


def get_approval(conn: Connection, agent_id: int, approval_id: str) -> Approval | None:
    query = select(approvals).where(
        approvals.c.agent_id == agent_id, approvals.c.approval_id == approval_id
    )
    row = conn.execute(query).one_or_none()
    return None if row is None else _approval(row)


def of_continuation(conn: Connection, continuation_turn_id: int) -> list[Approval]:
    """The approvals a continuation turn answers, in the order they were asked."""
    query = (
        select(approvals)
        .where(approvals.c.continuation_turn_id == continuation_turn_id)
        .order_by(approvals.c.id)
    )
    return [_approval(row) for row in conn.execute(query)]


def decide(
    conn: Connection,
    approval_id: str,
    status: ApprovalStatus,
    reason: str | None,
    *,
    agent_id: int | None = None,
) -> Decided | None:
    """Close an open approval (None: unknown, or already closed)."""
    statement = (
        update(approvals)
        .where(approvals.c.approval_id == approval_id, approvals.c.status == _PENDING)
        .values(status=status.value, reason=reason, decided_at=db_now())
        .returning(*approvals.c)
    )
    if agent_id is not None:
        statement = statement.where(approvals.c.agent_id == agent_id)
    row = conn.execute(statement).one_or_none()
    if row is None:
        return None
    return Decided(_approval(row), row.agent_id, row.continuation_turn_id)


def open_count(conn: Connection, continuation_turn_id: int) -> int:
    query = select(func.count()).where(
        approvals.c.continuation_turn_id == continuation_turn_id, approvals.c.status == _PENDING
    )
    return int(conn.execute(query).scalar_one())


def open_of_turns(conn: Connection, turn_ids: Sequence[int]) -> list[str]:
    """The open approvals asked by, or continued by, these turns."""
    query = select(approvals.c.approval_id).where(
        approvals.c.status == _PENDING,
        (approvals.c.turn_id.in_(turn_ids)) | (approvals.c.continuation_turn_id.in_(turn_ids)),
    )
    return list(conn.execute(query).scalars())


_SINCE = db_now_plus(seconds_param("offset_s"))


def overdue(conn: Connection, *, timeout_s: float, limit: int) -> list[str]:
    """Open approvals created more than ``timeout_s`` ago (database clock), oldest first."""
    query = (
        select(approvals.c.approval_id)
        .where(
            approvals.c.status == _PENDING,
            approvals.c.created_at < _SINCE,
        )
        .order_by(approvals.c.created_at)
        .limit(limit)
    )
    return list(conn.execute(query, {"offset_s": -timeout_s}).scalars())
