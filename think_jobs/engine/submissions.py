"""Durable submissions: accept now, run later on a worker; inspect, list, cancel, clean up.

``submit`` commits the row first and only then enqueues Celery work, so a worker can never
look for a row that is not there, and a broker outage cannot lose an accepted submission (the
sweeper enqueues what was never enqueued).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from think_jobs import validation
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.engine import ConcurrentWrite
from think_jobs.domain import policy
from think_jobs.domain.policy import DELETED
from think_jobs.domain.records import Admission, NewTurn, TurnRecord
from think_jobs.domain.status import TERMINAL, Kind, Status
from think_jobs.engine import approvals, cancellation, events, handoff, queueing
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.errors import BrokerUnavailableError, InvalidInputError, UnknownCursorError
from think_jobs.limits import Limits
from think_jobs.messages import UIMessage, readable_message
from think_jobs.observe import metrics, tracing
from think_jobs.results import SubmissionInspection, SubmissionStatus, SubmitMessagesResult
from think_jobs.transport import presence, streams
from think_jobs.transport.streams import StoredEnd, StreamRef

log = logging.getLogger(__name__)

StatusFilter = SubmissionStatus | str | Iterable[SubmissionStatus | str] | None
REGENERATE = queueing.REGENERATE
inspection_of = events.inspection_of


@dataclass(frozen=True)
class Submission:
    """What a caller asks to submit, validated."""

    messages: list[dict[str, Any]]
    submission_id: str | None
    idempotency_key: str | None
    metadata: dict[str, Any] | None
    trigger: str


def validated(
    services: Services,
    messages: Sequence[UIMessage | Mapping[str, Any]],
    *,
    submission_id: str | None,
    idempotency_key: str | None,
    metadata: Mapping[str, Any] | None,
    trigger: str,
) -> Submission:
    """The edge every submission passes (Python API, HTTP, webhooks, CLI, schedules,
    workflow steps): raises ``InvalidInputError`` naming the field; nothing is stored."""
    settings = services.settings
    regenerating = trigger == REGENERATE and not messages
    return Submission(
        messages=[] if regenerating else validation.submission_messages(messages, settings),
        submission_id=validation.optional_id(submission_id, "submission_id"),
        idempotency_key=validation.optional_key(idempotency_key, "idempotency_key"),
        metadata=validation.json_object(metadata, "metadata", limits=Limits.of(settings)),
        trigger=trigger,
    )


def submit(services: Services, agent: AgentHooks, submission: Submission) -> SubmitMessagesResult:
    """Store a submission (or find the one these ids name) and enqueue its agent's work.
    A ``regenerate`` submission carries no message: its turn replaces the last reply."""
    with tracing.span("think_jobs.accept", attributes={"think_jobs.agent_type": agent.agent_type}):
        new = NewTurn(
            request_id=submission.submission_id or str(uuid.uuid4()),
            kind=Kind.SUBMISSION,
            trigger=submission.trigger,
            messages=submission.messages,
            idempotency_key=submission.idempotency_key,
            metadata=submission.metadata,
            trace_context=tracing.carrier(),  # inside the span: the turn's spans are its children
        )
        admission = _admit(services, agent, new, submission.submission_id)
    _observe(agent, admission)
    if admission.accepted:
        events.status_changed(agent, admission.turn, Status.PENDING)
    handoff.admitted(services, admission, agent.address)
    return SubmitMessagesResult(
        **inspection_of(admission.turn).model_dump(), accepted=admission.accepted
    )


def _observe(agent: AgentHooks, admission: Admission) -> None:
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
        "status": admission.turn.status.value,
    }
    log.info(f"submission {outcome}", extra=fields)


def _admit(
    services: Services, agent: AgentHooks, new: NewTurn, submission_id: str | None
) -> Admission:
    agent_id = services.agents.agent_id_of(agent, create=True)
    assert agent_id is not None
    return admit(services, agent_id, new, submission_id=submission_id)


def admit(
    services: Services, agent_id: int, new: NewTurn, *, submission_id: str | None
) -> Admission:
    """Store a submission, or find the one its ids name. On PostgreSQL the common case is one
    statement that commits by itself, and a duplicate one read more; the rest (a contended
    agent, SQLite) is a transaction of the general path."""
    for attempt in range(3):
        try:
            if services.db.one_statement_writes:
                with services.db.statement() as conn:
                    found = queueing.admit_at_tail(conn, agent_id, new)
                    if found is None:  # a duplicate (a webhook retried): one more read
                        found = queueing.existing_submission(
                            conn, agent_id, new, submission_id=submission_id
                        )
                if found is not None:
                    return found
            with services.db.write() as conn:
                return queueing.admit_submission(conn, agent_id, new, submission_id=submission_id)
        except ConcurrentWrite:  # a concurrent insert won a unique constraint: look again
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def find_turn(
    services: Services, agent: AgentHooks, request_id: str, *, name: str = "request_id"
) -> TurnRecord | None:
    """The agent's turn with this request id (None: no such agent or turn). An id no turn
    could have (not a string, a NUL, over the length limit) is ``InvalidInputError`` naming
    ``name``, not a driver's error."""
    request_id = validation.identifier(request_id, name)
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return None
    with services.db.read() as conn:
        return turn_ops.get_turn(conn, agent_id, request_id)


_DELETED_END = StoredEnd(Status.ABORTED, DELETED, None)  # what a deleted turn's readers get


def stored_end(services: Services, turn_id: int) -> StoredEnd | None:
    """The turn's final status and stored reply, or None while it is not finished (what a
    stream reader rebuilds a lost stream from). A turn deleted meanwhile (only a finished one
    can be) ends ``aborted`` with ``DELETED``: a reader following it is told, not left
    waiting for an end no one will write."""
    with services.db.read() as conn:
        turn = turn_ops.get_turn_by_id(conn, turn_id)
        if turn is None:
            return _DELETED_END
        if turn.active:
            return None
        reply_id = turn.assistant_message_id
        raw = (
            None
            if reply_id is None
            else conversation_ops.message_json(conn, turn.agent_id, reply_id)
        )
    return StoredEnd(
        turn.status, turn.error, readable_message(raw), approvals.answered_base(services, turn)
    )


def inspect(
    services: Services, agent: AgentHooks, submission_id: str
) -> SubmissionInspection | None:
    """The submission, with a ``waiting_reason`` when it is pending and nothing can run it."""
    turn = find_turn(services, agent, submission_id, name="submission_id")
    if turn is None or not turn.is_submission:
        return None
    found = inspection_of(turn)
    if found.status is not SubmissionStatus.PENDING:
        return found
    reason: str | None = None
    if turn.awaiting_approval:
        reason = approvals.waiting_reason(services, turn)
    else:
        reason = waiting_reason(services, agent.agent_type)
    return found.model_copy(update={"waiting_reason": reason})


def waiting_reason(services: Services, agent_type: str) -> str | None:
    """Why a pending turn of ``agent_type`` cannot start, or None when a live worker serves it."""
    try:
        workers = presence.live_workers(services.redis, services.keys)
    except BrokerUnavailableError as error:  # say so; do not fail the inspection
        return f"cannot tell whether a live worker serves agent type {agent_type}: {error}"
    return policy.waiting_reason(workers, queue=services.settings.queue, agent_type=agent_type)


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


@dataclass(frozen=True)
class SubmissionPage:
    """One page of a listing; ``next_before`` is the cursor of the next, older page."""

    rows: list[SubmissionInspection]
    next_before: str | None


def page_of(
    services: Services,
    agent: AgentHooks,
    *,
    status: StatusFilter,
    limit: int,
    before: str | None = None,
) -> SubmissionPage:
    """Up to ``limit`` (1 to 100) submissions older than ``before``, newest first."""
    statuses = statuses_of(status, default=None)
    limit = validation.clamp(limit, 1, 100, "limit")
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        if before is not None:
            raise _unknown_cursor(agent, before)
        return SubmissionPage([], None)
    with services.db.read() as conn:
        cursor = None if before is None else turn_ops.get_turn(conn, agent_id, before)
        if before is not None and (cursor is None or not cursor.is_submission):
            raise _unknown_cursor(agent, before)
        found = turn_ops.list_submissions(
            conn, agent_id, statuses=statuses, limit=limit + 1, before=cursor
        )
    rows = [inspection_of(turn) for turn in found[:limit]]
    return SubmissionPage(rows, rows[-1].submission_id if len(found) > limit else None)


def _unknown_cursor(agent: AgentHooks, before: str) -> UnknownCursorError:
    return UnknownCursorError(
        f"list_submissions: before={before!r} is not a submission of agent {agent.address}; "
        "pass the submission_id of the last row of the previous page"
    )


def cancel(services: Services, agent: AgentHooks, submission_id: str, reason: str | None) -> None:
    cancellation.cancel_turn(services, agent, submission_id, reason, submissions_only=True)


def delete_one(services: Services, agent: AgentHooks, submission_id: str) -> bool:
    submission_id = validation.identifier(submission_id, "submission_id")
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return False
    with services.db.write() as conn:
        deleted = turn_ops.delete_terminal_submission(conn, agent_id, submission_id)
    if deleted is None:
        return False
    _forget_streams(services, agent, {deleted: submission_id})
    return True


def _forget_streams(services: Services, agent: AgentHooks, deleted: Mapping[int, str]) -> None:
    """A deleted submission's stream goes with it (best effort: it expires anyway)."""
    ttl_s = services.settings.stream_ttl_s
    try:
        for turn_id, request_id in deleted.items():
            ref = StreamRef(agent.address, request_id, turn_id)
            streams.forget(services.redis, services.keys, ref, _DELETED_END, ttl_s=ttl_s)
    except BrokerUnavailableError as error:
        log.warning("streams of deleted submissions left to expire: %s", error)


def _utc_or_none(when: datetime | None) -> datetime | None:
    """``completed_before`` in UTC, or InvalidInputError: naive, or out of range once in UTC
    (``9999-12-31T23:59:59-23:59`` was a driver's error, a 500 over HTTP)."""
    if when is None:
        return None
    if when.tzinfo is None:
        raise InvalidInputError("completed_before must be a timezone-aware datetime")
    try:
        return when.astimezone(UTC)
    except OverflowError:
        raise InvalidInputError(
            f"completed_before {when.isoformat()} is out of range in UTC"
        ) from None


def delete_many(
    services: Services,
    agent: AgentHooks,
    *,
    status: StatusFilter,
    completed_before: datetime | None,
    limit: int,
) -> int:
    statuses = statuses_of(status, default=sorted(s.value for s in TERMINAL))
    assert statuses is not None
    limit = validation.clamp(limit, 1, 500, "limit")
    completed_before = _utc_or_none(completed_before)
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return 0
    with services.db.write() as conn:
        deleted = turn_ops.delete_terminal_submissions(
            conn, agent_id, statuses=statuses, completed_before=completed_before, limit=limit
        )
    _forget_streams(services, agent, deleted)
    return len(deleted)
