"""Stopping turns from any process: the database status first, then a Redis revocation flag.

The status is the record (a cancelled submission is ``aborted`` from that moment, and no later
write overwrites it; its open tool approvals are cancelled with it, and so is the continuation
that waited for them); the flag is how the executor learns within one chunk. If Redis is down
the executor still sees the status at its next heartbeat. A turn that never ran still gets
the end of its stream, so followers do not wait forever. Who runs next after a pending turn
was cancelled is ``handoff``'s decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from think_jobs import validation
from think_jobs.db import turns as turn_ops
from think_jobs.db.engine import Connection
from think_jobs.domain.policy import SKIPPED_BY_RESET
from think_jobs.domain.records import Ended, TurnRecord
from think_jobs.domain.status import Status
from think_jobs.engine import approvals, events, execution, followups, handoff
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.errors import BrokerUnavailableError
from think_jobs.transport import flags
from think_jobs.transport.streams import StoredEnd, StreamRef, seal_from_store

log = logging.getLogger(__name__)

__all__ = ["SKIPPED_BY_RESET", "abort_running", "cancel_turn", "reset_turns"]


def cancel_turn(
    services: Services,
    agent: AgentHooks,
    request_id: str,
    reason: str | None,
    *,
    submissions_only: bool,
) -> None:
    """Abort a pending or running turn; unknown or finished turns are left alone."""
    request_id = validation.identifier(
        request_id, "submission_id" if submissions_only else "request_id"
    )
    reason = validation.reason(reason)
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    with services.db.write() as conn:
        turn = turn_ops.get_turn(conn, agent_id, request_id)
        if turn is None or (submissions_only and not turn.is_submission):
            return
        turn, ended = _end_as_seen(conn, turn, lambda _: (Status.ABORTED, reason))
        continuations = approvals.cancel_for_turns(conn, [turn])  # its approvals go with it
    if ended is not None:
        followups.send_after_end(services, turn.id, ended)
        _after_abort(services, agent, turn, reason)
    for continuation in continuations:
        _after_abort(services, agent, continuation, approvals.CANCELLED_REASON)


_Ending = tuple[Status, str | None]  # a turn's final status and error


def _end_as_seen(
    conn: Connection, turn: TurnRecord, ending: Callable[[TurnRecord], _Ending]
) -> tuple[TurnRecord, Ended | None]:
    """End the turn (``ending``: its final status and error, given the turn as read) from
    the status it was read in, so what follows (a revocation flag for a running turn, the
    stream's end for a pending one) fits what was ended: a worker that claimed it between
    the read and the write (it went from pending to running), or a stall that put it back,
    makes it read again. Returns the turn as last read, and its end (None: it had ended, or
    was deleted)."""
    for _ in range(_READS):
        if not turn.active:
            return turn, None
        status, error = ending(turn)
        ended = turn_ops.end_turn(
            conn, turn.id, status=status, error=error, from_statuses=(turn.status,)
        )
        if ended is not None:
            return turn, ended
        found = turn_ops.get_turn_by_id(conn, turn.id)
        if found is None:
            return turn, None
        turn = found
    return turn, None


_READS = 5  # each retry follows a status change that committed meanwhile: few can


def abort_running(services: Services, agent: AgentHooks, reason: str | None) -> None:
    """Abort every running turn of the agent (``abort_all_requests``)."""
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    with execution.agent_write(services, agent, "abort_all_requests") as conn:
        running = [t for t in turn_ops.active_turns(conn, agent_id) if t.status is Status.RUNNING]
        ended = [
            (t, turn_ops.end_turn(conn, t.id, status=Status.ABORTED, error=reason)) for t in running
        ]
    for turn, end in ended:
        if end is not None:
            followups.send_after_end(services, turn.id, end)
            _after_abort(services, agent, turn, reason)


def reset_turns(services: Services, agent: AgentHooks) -> None:
    """Skip every queued turn and abort the running one (``reset_turn_state``)."""
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    with execution.agent_write(services, agent, "reset_turn_state") as conn:
        seen = [_end_as_seen(conn, t, _reset) for t in turn_ops.active_turns(conn, agent_id)]
        ended = [turn for turn, end in seen if end is not None]
        skipped = [t for t in ended if t.status is Status.PENDING]
        aborted = [t for t in ended if t.status is Status.RUNNING]
        approvals.cancel_for_turns(conn, skipped)  # their continuations were just skipped
    for turn in skipped:
        _announce_end(services, agent, turn, Status.SKIPPED, _skip_error(turn))
    for turn in aborted:
        _after_abort(services, agent, turn, None)
    followups.send_due(services)


def _skip_error(turn: TurnRecord) -> str | None:
    return SKIPPED_BY_RESET if turn.is_submission else None


def _reset(turn: TurnRecord) -> _Ending:
    """A reset skips a pending turn and aborts a running one."""
    if turn.status is Status.PENDING:
        return Status.SKIPPED, _skip_error(turn)
    return Status.ABORTED, None


def _after_abort(
    services: Services, agent: AgentHooks, turn: TurnRecord, reason: str | None
) -> None:
    if turn.status is Status.RUNNING:  # its executor stops within a chunk and ends the stream
        settings = services.settings
        flags.set_revocation(
            services.redis, services.keys, agent.address, turn.id, reason,
            ttl_s=settings.revocation_ttl_s,
        )  # fmt: skip
        events.status_changed(agent, turn, Status.ABORTED, reason)
        return
    _announce_end(services, agent, turn, Status.ABORTED, reason)
    handoff.after_cancelled(
        services, turn.agent_id, agent.address, is_submission=turn.is_submission
    )


def _announce_end(
    services: Services, agent: AgentHooks, turn: TurnRecord, status: Status, error: str | None
) -> None:
    """A turn that never ran still ends its stream, so followers do not wait forever (and an
    earlier attempt that wakes up later can add nothing to it)."""
    ref = StreamRef(agent.address, turn.request_id, turn.id)
    try:
        end = StoredEnd(status, error, None)
        seal_from_store(
            services.redis, services.keys, ref, end, ttl_s=services.settings.stream_ttl_s
        )
    except BrokerUnavailableError as problem:
        log.warning("end of stream %s not written (readers see it in the database): %s",
                    turn.request_id, problem)  # fmt: skip
    events.status_changed(agent, turn, status, error)
