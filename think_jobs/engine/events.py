"""A submission's status changes, announced in one place: the agent's ``on_submission_status``
hook (exceptions logged and swallowed, SPEC §4). Every module that moves a submission's status
calls ``status_changed``; none calls the hook itself.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from think_jobs.domain.records import TurnRecord
from think_jobs.domain.status import Status
from think_jobs.engine.ports import AgentHooks
from think_jobs.results import SubmissionInspection, SubmissionStatus

log = logging.getLogger(__name__)


def inspection_of(turn: TurnRecord) -> SubmissionInspection:
    """A stored submission as the public API shows it."""
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


def status_changed(
    agent: AgentHooks, turn: TurnRecord, status: Status, error: str | None = None
) -> None:
    """``turn`` (a submission) now has ``status``: tell the agent's hook, if it has one."""
    if not turn.is_submission or not agent.overrides("on_submission_status"):
        return
    kept = error if error is not None else turn.error
    record = turn if turn.status is status else replace(turn, status=status, error=kept)
    try:
        agent.on_submission_status(inspection_of(record))
    except Exception:
        log.exception("on_submission_status raised for %s; ignored", turn.request_id)
