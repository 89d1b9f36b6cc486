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
from typing import TYPE_CHECKING

from think_jobs import queueing
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


def execute(jobs: ThinkJobs, claim: queueing.Claim, caller: CallerTurn | None = None) -> TurnResult:
    """Run the claimed turn to its end, then release the lease and hand on to the next turn."""
    agent = jobs.instantiate(claim.agent_type, claim.agent_name)
    run = TurnRun(jobs, agent, claim, caller)
    lease_lost = False
    try:
        with _active(agent.address):
            result = run.perform()
    finally:
        run.watch.close()
        lease_lost = run.watch.reason is not None and run.watch.reason.kind == "lease_lost"
        released = None if lease_lost else _release(jobs, claim)
    if released is not None:
        _hand_on(jobs, claim, released)
    return result


def _release(jobs: ThinkJobs, claim: queueing.Claim) -> queueing.Released | None:
    try:
        with jobs.db.write() as conn:
            return queueing.release(conn, claim)
    except ThinkJobsError:
        log.exception("could not release the lease of %s; it will expire", claim.agent_name)
        return None


def _hand_on(jobs: ThinkJobs, claim: queueing.Claim, released: queueing.Released) -> None:
    if released.needs_worker:
        jobs.dispatch.enqueue_drain(claim.agent_id)
    elif released.next_turn is not None:
        jobs.dispatch.wake_callers(f"{claim.agent_type}:{claim.agent_name}")
