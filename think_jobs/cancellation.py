"""Stopping turns from any process: the database status first, then a Redis revocation flag.

The status is the record (a cancelled submission is ``aborted`` from that moment, and no later
write overwrites it); the flag is how the executor learns within one chunk. If Redis is down
the executor still sees the status at its next heartbeat.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis
from sqlalchemy import Connection

from think_jobs import followups
from think_jobs.db import turns as turn_ops
from think_jobs.db.turns import TurnRecord
from think_jobs.streaming import StoredEnd, StreamRef, seal_from_store

if TYPE_CHECKING:
    from think_jobs.agent import Think

log = logging.getLogger(__name__)

SKIPPED_BY_RESET = "Submission was skipped by turn reset."


def cancel_turn(
    agent: Think, request_id: str, reason: str | None, *, submissions_only: bool
) -> None:
    """Abort a pending or running turn; unknown or finished turns are left alone."""
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    with agent.jobs.db.write() as conn:
        turn = turn_ops.get_turn(conn, agent_id, request_id)
        if turn is None or turn.status not in turn_ops.ACTIVE:
            return
        if submissions_only and not turn.is_submission:
            return
        ended = turn_ops.end_turn(conn, turn.id, status="aborted", error=reason)
    if ended is not None:
        followups.send_after_end(agent.jobs, turn.id, ended)
        _after_abort(agent, turn, reason)


def abort_running(agent: Think, reason: str | None) -> None:
    """Abort every running turn of the agent (``abort_all_requests``)."""
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    with agent.jobs.db.write() as conn:
        running = [t for t in turn_ops.active_turns(conn, agent_id) if t.status == "running"]
        ended = [
            (t, turn_ops.end_turn(conn, t.id, status="aborted", error=reason)) for t in running
        ]
    for turn, end in ended:
        if end is not None:
            followups.send_after_end(agent.jobs, turn.id, end)
            _after_abort(agent, turn, reason)


def reset_turns(agent: Think) -> None:
    """Skip every queued turn and abort the running one (``reset_turn_state``)."""
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    with agent.jobs.db.write() as conn:
        active = turn_ops.active_turns(conn, agent_id)
        skipped = [t for t in active if t.status == "pending" and _skip(conn, t)]
        aborted = [
            t
            for t in active
            if t.status == "running"
            and turn_ops.end_turn(conn, t.id, status="aborted", error=None) is not None
        ]
    for turn in skipped:
        error = SKIPPED_BY_RESET if turn.is_submission else None
        _announce_end(agent, turn, "skipped", error)
    for turn in aborted:
        _after_abort(agent, turn, None)
    followups.send_due(agent.jobs)


def _skip(conn: Connection, turn: TurnRecord) -> bool:
    error = SKIPPED_BY_RESET if turn.is_submission else None
    ended = turn_ops.end_turn(
        conn, turn.id, status="skipped", error=error, from_statuses=("pending",)
    )
    return ended is not None


def _after_abort(agent: Think, turn: TurnRecord, reason: str | None) -> None:
    if turn.status == "running":
        set_revocation_flag(agent, turn, reason)
        aborted = turn_ops.replace_record(turn, status="aborted", error=reason)
        agent._notify_submission(aborted, "aborted")
        return
    _announce_end(agent, turn, "aborted", reason)
    if turn.is_submission:
        agent.jobs.dispatch.enqueue_drain(turn.agent_id)
    agent.jobs.dispatch.wake_callers(agent.address)


def _announce_end(agent: Think, turn: TurnRecord, status: str, error: str | None) -> None:
    """A turn that never ran still ends its stream, so followers do not wait forever (and an
    earlier attempt that wakes up later can add nothing to it)."""
    jobs = agent.jobs
    ref = StreamRef(agent.address, turn.request_id, turn.id)
    try:
        end = StoredEnd(status, error, None)
        seal_from_store(jobs.redis, jobs.keys, ref, end, ttl_s=jobs.settings.stream_ttl_s)
    except redis.RedisError as error_:
        log.warning("end of stream %s not written (readers see it in the database): %s",
                    turn.request_id, error_)  # fmt: skip
    agent._notify_submission(turn_ops.replace_record(turn, status=status, error=error), status)


def set_revocation_flag(agent: Think, turn: TurnRecord, reason: str | None) -> None:
    jobs = agent.jobs
    key = jobs.keys.revoked(agent.address, turn.id)
    try:
        jobs.redis.set(key, reason or "", ex=jobs.settings.revocation_ttl_s)
    except redis.RedisError as error:
        log.warning("revocation flag not set (the heartbeat will see the status): %s", error)
