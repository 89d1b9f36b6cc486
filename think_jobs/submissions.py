"""Durable submissions: accept now, run later on a worker; inspect, list, cancel, clean up.

``submit`` commits the row first and only then enqueues Celery work, so a worker can never
look for a row that is not there, and a broker outage cannot lose an accepted submission (the
sweeper enqueues what was never enqueued).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis
from sqlalchemy import exc

from think_jobs import cancellation, metrics, presence, queueing, streaming, tracing, validation
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.turns import TurnRecord
from think_jobs.errors import InvalidInputError, UnknownCursorError
from think_jobs.limits import Limits
from think_jobs.messages import UIMessage
from think_jobs.results import (
    TERMINAL_STATUSES,
    SubmissionInspection,
    SubmissionStatus,
    SubmitMessagesResult,
)
from think_jobs.streaming import StreamRef

if TYPE_CHECKING:
    from think_jobs.agent import Think

log = logging.getLogger(__name__)

StatusFilter = SubmissionStatus | str | Iterable[SubmissionStatus | str] | None
REGENERATE = queueing.REGENERATE


def inspection_of(turn: TurnRecord) -> SubmissionInspection:
    return SubmissionInspection(
        submission_id=turn.request_id,
        idempotency_key=turn.idempotency_key,
        request_id=turn.request_id,
        status=SubmissionStatus(turn.status),
        error=turn.error,
        metadata=turn.metadata,
        created_at=turn.created_at,
        started_at=turn.started_at,
        completed_at=turn.completed_at,
        attempt=turn.attempt,
    )


def submit(
    agent: Think,
    messages: Sequence[UIMessage | Mapping[str, Any]],
    *,
    submission_id: str | None = None,
    idempotency_key: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    trigger: str = "submission",
) -> SubmitMessagesResult:
    """Store a submission (or find the one these ids name) and enqueue its agent's work.
    A ``regenerate`` submission carries no message: its turn replaces the last reply."""
    jobs = agent.jobs
    regenerating = trigger == REGENERATE and not messages
    wire = [] if regenerating else validation.submission_messages(messages, jobs.settings)
    values = {
        "submission_id": validation.optional_id(submission_id, "submission_id"),
        "idempotency_key": validation.optional_key(idempotency_key, "idempotency_key"),
        "metadata": validation.json_object(metadata, "metadata", limits=Limits.of(jobs.settings)),
        "messages": wire,
        "trigger": trigger,
    }
    with tracing.span("think_jobs.accept", attributes={"think_jobs.agent_type": agent.agent_type}):
        admission = _admit(agent, {**values, "trace_context": tracing.carrier()})
    _observe(agent, admission)
    if admission.accepted:
        agent._notify_submission(admission.turn, "pending")
    if admission.is_head or (not admission.accepted and admission.turn.status == "pending"):
        jobs.dispatch.enqueue_drain(admission.turn.agent_id)
    return SubmitMessagesResult(
        **inspection_of(admission.turn).model_dump(), accepted=admission.accepted
    )


def _observe(agent: Think, admission: queueing.Admission) -> None:
    outcome = "accepted" if admission.accepted else "duplicate"
    metrics.SUBMISSIONS.labels(agent.agent_type, outcome).inc()
    fields = {
        "agent": agent.address,
        "agent_type": agent.agent_type,
        "agent_name": agent.name,
        "submission_id": admission.turn.request_id,
        "request_id": admission.turn.request_id,
        "attempt": admission.turn.attempt,
        "trigger": admission.turn.trigger,
        "status": admission.turn.status,
    }
    log.info(f"submission {outcome}", extra=fields)


def _admit(agent: Think, values: dict[str, Any]) -> queueing.Admission:
    agent_id = agent.jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    for attempt in range(3):
        try:
            with agent.jobs.db.write() as conn:
                return queueing.admit_submission(conn, agent_id, **values)
        except exc.IntegrityError:  # a concurrent insert won a unique constraint: look again
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def find_turn(agent: Think, request_id: str) -> TurnRecord | None:
    """The agent's turn with this request id (None: no such agent or turn)."""
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return None
    with agent.jobs.db.read() as conn:
        return turn_ops.get_turn(conn, agent_id, request_id)


def stored_end(agent: Think, turn_id: int) -> streaming.StoredEnd | None:
    """The turn's final status and stored reply, or None while it is not finished (what a
    stream reader rebuilds a lost stream from)."""
    with agent.jobs.db.read() as conn:
        turn = turn_ops.get_turn_by_id(conn, turn_id)
        if turn is None or turn.status in turn_ops.ACTIVE:
            return None
        reply_id = turn.assistant_message_id
        raw = (
            None
            if reply_id is None
            else conversation_ops.message_json(conn, turn.agent_id, reply_id)
        )
    return streaming.StoredEnd(turn.status, turn.error, _reply(raw))


def _reply(raw: str | None) -> UIMessage | None:
    if raw is None:
        return None
    try:
        return UIMessage.model_validate_json(raw)
    except ValueError:  # unreadable: the stream ends without it
        return None


def inspect(agent: Think, submission_id: str) -> SubmissionInspection | None:
    """The submission, with a ``waiting_reason`` when it is pending and nothing can run it."""
    turn = find_turn(agent, submission_id)
    if turn is None or not turn.is_submission:
        return None
    found = inspection_of(turn)
    if found.status is not SubmissionStatus.PENDING:
        return found
    reason = presence.waiting_reason(agent.jobs, agent.agent_type)
    return found.model_copy(update={"waiting_reason": reason})


def statuses_of(status: StatusFilter, *, default: Iterable[str] | None) -> list[str] | None:
    """Normalise a status filter (one value or several) and reject unknown statuses."""
    if status is None:
        return None if default is None else list(default)
    values = [status] if isinstance(status, str) else list(status)
    try:
        return [SubmissionStatus(value).value for value in values]
    except ValueError as error:
        known = ", ".join(s.value for s in SubmissionStatus)
        raise InvalidInputError(f"unknown submission status in {values!r}; use {known}") from error


def list_for(
    agent: Think, *, status: StatusFilter, limit: int, before: str | None = None
) -> list[SubmissionInspection]:
    return page_of(agent, status=status, limit=limit, before=before).rows


@dataclass(frozen=True)
class SubmissionPage:
    """One page of a listing; ``next_before`` is the cursor of the next, older page."""

    rows: list[SubmissionInspection]
    next_before: str | None


def page_of(
    agent: Think, *, status: StatusFilter, limit: int, before: str | None = None
) -> SubmissionPage:
    """Up to ``limit`` (1 to 100) submissions older than ``before``, newest first."""
    statuses = statuses_of(status, default=None)
    limit = validation.clamp(limit, 1, 100, "limit")
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        if before is not None:
            raise _unknown_cursor(agent, before)
        return SubmissionPage([], None)
    with agent.jobs.db.read() as conn:
        cursor = None if before is None else turn_ops.get_turn(conn, agent_id, before)
        if before is not None and (cursor is None or not cursor.is_submission):
            raise _unknown_cursor(agent, before)
        found = turn_ops.list_submissions(
            conn, agent_id, statuses=statuses, limit=limit + 1, before=cursor
        )
    rows = [inspection_of(turn) for turn in found[:limit]]
    return SubmissionPage(rows, rows[-1].submission_id if len(found) > limit else None)


def _unknown_cursor(agent: Think, before: str) -> UnknownCursorError:
    return UnknownCursorError(
        f"list_submissions: before={before!r} is not a submission of agent {agent.address}; "
        "pass the submission_id of the last row of the previous page"
    )


def cancel(agent: Think, submission_id: str, reason: str | None) -> None:
    cancellation.cancel_turn(agent, submission_id, reason, submissions_only=True)


def delete_one(agent: Think, submission_id: str) -> bool:
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return False
    with agent.jobs.db.write() as conn:
        deleted = turn_ops.delete_terminal_submission(conn, agent_id, submission_id)
    if deleted is None:
        return False
    _forget_streams(agent, {deleted: submission_id})
    return True


def _forget_streams(agent: Think, deleted: Mapping[int, str]) -> None:
    """A deleted submission's stream goes with it (best effort: it expires anyway)."""
    jobs = agent.jobs
    try:
        for turn_id, request_id in deleted.items():
            streaming.forget(jobs.redis, jobs.keys, StreamRef(agent.address, request_id, turn_id))
    except redis.RedisError as error:
        log.warning("streams of deleted submissions left to expire: %s", error)


def delete_many(
    agent: Think, *, status: StatusFilter, completed_before: datetime | None, limit: int
) -> int:
    terminal = sorted(s.value for s in TERMINAL_STATUSES)
    statuses = statuses_of(status, default=terminal)
    assert statuses is not None
    limit = validation.clamp(limit, 1, 500, "limit")
    if completed_before is not None and completed_before.tzinfo is None:
        raise InvalidInputError("completed_before must be a timezone-aware datetime")
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return 0
    with agent.jobs.db.write() as conn:
        deleted = turn_ops.delete_terminal_submissions(
            conn, agent_id, statuses=statuses, completed_before=completed_before, limit=limit
        )
    _forget_streams(agent, deleted)
    return len(deleted)
