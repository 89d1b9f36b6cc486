"""Running a claimed turn: the attempt itself (``turn_run``), then release and hand-on.

Whoever holds the claim runs this: a Celery worker for submissions, the calling process for
blocking calls (``save_messages``, ``chat``, ``continue_last_turn``). Hooks run inside the turn,
while the lease is still held, so a slow ``on_chat_response`` delays the agent's next turn and
a ``submit_messages`` made there is admitted before anything that comes later.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from think_jobs import queueing
from think_jobs.context import utcnow
from think_jobs.db import conversation as conversation_ops
from think_jobs.errors import ThinkJobsError
from think_jobs.turn_run import INTERRUPTED, CallerTurn, MessagesFunction, TurnResult, TurnRun

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

__all__ = ["INTERRUPTED", "CallerTurn", "MessagesFunction", "TurnResult", "execute"]

log = logging.getLogger(__name__)

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


def claim(
    jobs: ThinkJobs,
    agent: queueing.AgentRef,
    *,
    caller_turn_id: int | None = None,
    held_token: str | None = None,
) -> queueing.Claim | queueing.NotClaimed:
    """Take the agent's lease and start its next turn (see ``queueing.claim_next``); a turn
    whose messages are already applied gets its conversation read in the same transaction."""
    settings = jobs.settings
    with jobs.db.write() as conn:
        claimed = queueing.claim_next(
            conn,
            agent,
            now=utcnow(),
            lease_ttl=timedelta(seconds=settings.lease_ttl_s),
            max_recoveries=settings.recovery_max_attempts,
            caller_turn_id=caller_turn_id,
            held_token=held_token,
        )
        if isinstance(claimed, queueing.Claim) and claimed.turn.messages_applied:
            history = conversation_ops.load_messages_json(conn, agent.id)
            claimed = replace(claimed, history=history)
    return claimed


def execute(jobs: ThinkJobs, claim: queueing.Claim, caller: CallerTurn | None = None) -> TurnResult:
    """Run the claimed turn to its end, then release the lease and hand on to the next turn."""
    result, released = run_and_release(jobs, claim, caller)
    if released is not None:
        hand_on(jobs, claim, released)
    return result


def run_and_release(
    jobs: ThinkJobs,
    claim: queueing.Claim,
    caller: CallerTurn | None = None,
    *,
    keep_lease: bool = False,
) -> tuple[TurnResult, queueing.Released | None]:
    """Run the claimed turn and release the lease; the caller decides who runs what is next.

    Returns no ``Released`` when the lease was lost (someone else owns the turn now), the
    release itself failed (the lease will expire), or ``keep_lease`` kept it for the caller's
    next ``claim(..., held_token=claim.token)``.
    """
    run: TurnRun | None = None
    try:
        agent = jobs.instantiate(claim.agent_type, claim.agent_name)
        run = TurnRun(jobs, agent, claim, caller, keep_lease=keep_lease)
        with _active(agent.address):
            result = run.perform()
    finally:
        released = _end_attempt(jobs, claim, run, keep_lease=keep_lease)
    return result, released


def _end_attempt(
    jobs: ThinkJobs, claim: queueing.Claim, run: TurnRun | None, *, keep_lease: bool
) -> queueing.Released | None:
    """Stop the watch and give the lease back, unless it was released, lost or kept."""
    if run is None:
        return _release(jobs, claim)
    run.watch.close()
    if run.released is not None:
        return run.released
    lease_lost = run.watch.reason is not None and run.watch.reason.kind == "lease_lost"
    return None if lease_lost or keep_lease else _release(jobs, claim)


def _release(jobs: ThinkJobs, claim: queueing.Claim) -> queueing.Released | None:
    try:
        with jobs.db.write() as conn:
            return queueing.release(conn, claim)
    except ThinkJobsError:
        log.exception("could not release the lease of %s; it will expire", claim.agent_name)
        return None


def hand_on(jobs: ThinkJobs, claim: queueing.Claim, released: queueing.Released) -> None:
    """Nudge whoever runs the agent's next turn: a worker, or the waiting caller."""
    if released.needs_worker:
        jobs.dispatch.enqueue_drain(claim.agent_id)
    elif released.next_turn is not None:
        jobs.dispatch.wake_callers(f"{claim.agent_type}:{claim.agent_name}")
