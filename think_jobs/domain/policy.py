"""The decisions, as pure functions: what to do with an orphaned turn, who must be nudged when
a lease is given back, which existing submission two ids name, how recoveries are counted.

Every place that hands on to the next turn (the end of an attempt, a drain, a cancellation,
a history delete, a submission) asks ``next_nudge``; every recovery asks ``plan_for_orphan``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal

from think_jobs.domain.records import HeadBrief, Released, TurnRecord
from think_jobs.domain.status import Kind, Status
from think_jobs.errors import SubmissionConflictError
from think_jobs.results import WorkerRecord

CONFLICT_MESSAGE: Final = "submission_id and idempotency_key refer to different submissions"
CALLER_GONE: Final = "The caller went away before its turn started."
SKIPPED_BY_RESET: Final = "Submission was skipped by turn reset."
DELETED: Final = "The submission was deleted."
INTERRUPTED_AFTER_APPLIED: Final = "Submission was interrupted after messages were applied."
UNAPPLIABLE: Final = (
    "The submission's stored messages cannot be applied ({reason}): the row was left by an "
    "older version or a manual edit; the turn did not run."
)
INTERRUPTED_PARTIALLY_APPLIED: Final = (
    "Submission was interrupted after messages were partially applied."
)


class Nudge(StrEnum):
    """Who must be told that an agent's next turn can run."""

    NONE = "none"  # nothing is waiting
    DRAIN = "drain"  # a worker: enqueue a drain
    WAKE = "wake"  # the blocking caller waiting on it: wake it


def next_nudge(head: HeadBrief | None) -> Nudge:
    """After a release: a worker runs submissions and orphaned turns (running, or with their
    messages applied); a blocking turn not begun is run by its own caller; a continuation
    waiting for an approval is nudged by the answer, not now."""
    if head is None or head.awaiting_approval:
        return Nudge.NONE
    if head.kind is Kind.SUBMISSION or head.status is Status.RUNNING or head.messages_applied:
        return Nudge.DRAIN
    return Nudge.WAKE


def nudge_after_release(released: Released) -> Nudge:
    """``next_nudge`` of the head found at the release; a head that could not be read gets a
    drain, which looks for itself (it runs a submission, wakes the caller of a blocking turn,
    or finds nothing to do): never left to the sweeper's next pass."""
    if released.head_unread:
        return Nudge.DRAIN
    return next_nudge(released.next_turn)


OrphanPlan = Literal["requeue", "continue"] | str


def plan_for_orphan(turn: TurnRecord, *, max_recoveries: int) -> OrphanPlan:
    """A turn whose executor vanished: ``requeue`` (nothing was applied, run it afresh),
    ``continue`` (a continuation finishes the reply), or the error text it must end with."""
    if not turn.messages_applied:
        return "requeue"
    if turn.recoveries >= max_recoveries:
        return INTERRUPTED_AFTER_APPLIED
    return "continue"


def recoveries_after_progress(turn: TurnRecord, buffer_length: int) -> int:
    """The recovery count to store: back to 1 when the stream grew since the last recovery."""
    grew = turn.recovered_at_seq is not None and buffer_length > turn.recovered_at_seq
    return 1 if grew else turn.recoveries


def existing_submission(
    found: list[TurnRecord], submission_id: str | None, idempotency_key: str | None
) -> TurnRecord | None:
    """The submission these ids already name (None: admit a new one); raises
    ``SubmissionConflictError`` when they name different ones (SPEC §5)."""
    by_id = next((t for t in found if t.request_id == submission_id), None)
    by_key = next((t for t in found if t.idempotency_key == idempotency_key), None)
    if idempotency_key is not None and by_key is not None:
        if submission_id is not None and (by_id is None or by_id.id != by_key.id):
            raise SubmissionConflictError(CONFLICT_MESSAGE)
        return by_key
    if by_id is None:
        return None
    if not by_id.is_submission:
        raise SubmissionConflictError(CONFLICT_MESSAGE)
    if idempotency_key is not None and by_id.idempotency_key not in (None, idempotency_key):
        raise SubmissionConflictError(CONFLICT_MESSAGE)
    return by_id


def waiting_reason(workers: list[WorkerRecord], *, queue: str, agent_type: str) -> str | None:
    """Why a pending turn of ``agent_type`` cannot start given the live ``workers``, or None
    when one of them consumes ``queue`` and serves the type."""
    on_queue = [w for w in workers if w.role == "worker" and queue in w.queues]
    if any(agent_type in w.agent_types for w in on_queue):
        return None
    missing = f"no live worker serves agent type {agent_type}"
    if not on_queue:
        return f"{missing} (no live worker consumes queue {queue})"
    served = sorted({t for w in on_queue for t in w.agent_types})
    if not served:
        return f"{missing} (the live workers on queue {queue} serve no agent types: --app?)"
    return f"{missing} (live workers on queue {queue} serve {', '.join(served)})"
