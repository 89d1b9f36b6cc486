"""Blocking turns (``save_messages``, ``chat``, ``continue_last_turn``) run in the caller.

The caller admits its turn at the tail of the agent's queue like any other, then waits for it
to reach the head. While waiting it helps: a durable submission ahead of it is run right here
if no worker has taken it, so a parent agent calling ``child.chat()`` from a worker with a
single slot never waits for a slot that it is itself occupying. Callables, callbacks and abort
signals work because the turn runs in the process that holds them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from think_jobs import execution, queueing, tracing
from think_jobs.callbacks import ChatStartEvent, call_optional
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.turns import TurnRecord
from think_jobs.errors import NestedTurnError, ThinkJobsError
from think_jobs.execution import INTERRUPTED, CallerTurn, MessagesFunction, TurnResult
from think_jobs.streaming import open_pubsub

if TYPE_CHECKING:
    from redis.client import PubSub

    from think_jobs.agent import Think
    from think_jobs.runtime import ThinkJobs

log = logging.getLogger(__name__)


def nested_turn_message(trigger: str) -> str:
    return (
        f"Think turn admission ({trigger}) cannot be called from inside an active turn; "
        "use submit_messages() instead"
    )


@dataclass(frozen=True)
class BlockingRequest:
    trigger: str
    payload: MessagesFunction | None
    static_messages: list[dict[str, Any]] | None
    body: dict[str, Any] | None
    continuation: bool
    metadata: dict[str, Any] | None
    caller: CallerTurn


def run_blocking(agent: Think, request: BlockingRequest) -> TurnResult:
    """Admit the caller's turn, wait for it (helping with work ahead), run it, return."""
    if execution.in_active_turn(agent.address):
        raise NestedTurnError(nested_turn_message(request.trigger))
    request_id = str(uuid.uuid4())
    if request.caller.callback is not None:
        call_optional(request.caller.callback, "on_start", ChatStartEvent(request_id))
    wakeups = _Wakeups(agent.jobs, agent.address)  # subscribe before admitting: no lost wake-up
    try:
        turn = _admit(agent, request, request_id)
        return _Waiter(agent, turn, request.caller).run(wakeups)
    finally:
        wakeups.close()


def _admit(agent: Think, request: BlockingRequest, request_id: str) -> TurnRecord:
    jobs = agent.jobs
    agent_id = jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    with jobs.db.write() as conn:
        admission = queueing.admit(
            conn,
            agent_id,
            request_id=request_id,
            kind="blocking",
            trigger=request.trigger,
            status="pending",
            messages=request.static_messages,
            body=request.body,
            continuation=request.continuation,
            metadata=request.metadata,
            caller_ttl_s=jobs.settings.lease_ttl_s,
            trace_context=tracing.carrier(),
        )
    return admission.turn


class _Waiter:
    def __init__(self, agent: Think, turn: TurnRecord, caller: CallerTurn) -> None:
        self.agent = agent
        self.jobs: ThinkJobs = agent.jobs
        self.turn = turn
        self.caller = caller
        self.next_refresh = time.monotonic() + self.jobs.settings.heartbeat_interval_s

    def run(self, wakeups: _Wakeups) -> TurnResult:
        while True:
            result = self._step()
            if result is not None:
                return result
            self._keep_alive()
            wakeups.wait(self.jobs.settings.caller_poll_interval_s)

    def _step(self) -> TurnResult | None:
        """Try once: run our turn, or help with the submission ahead; None means keep waiting."""
        agent = queueing.AgentRef(self.turn.agent_id, self.agent.agent_type, self.agent.name)
        claimed = execution.claim(self.jobs, agent, caller_turn_id=self.turn.id)
        if isinstance(claimed, execution.Claimed):
            if claimed.claim.turn.id == self.turn.id:
                result = execution.execute(self.jobs, claimed, self.caller)
                return None if self._owner_goes_on(result) else result
            execution.execute(self.jobs, claimed)
            return None
        with self.jobs.db.read() as conn:
            mine = turn_ops.get_turn_by_id(conn, self.turn.id)
        if mine is None or mine.status not in turn_ops.ACTIVE:
            return _ended_without_running(mine, self.turn)
        return None

    def _owner_goes_on(self, result: TurnResult) -> bool:
        """Our attempt lost the lease (this process was paused or cut off): another attempt
        owns the turn. ``chat`` returns (its callback got ``on_interrupted``); the others wait
        for the turn's end and return the owner's result."""
        lost = result.status == INTERRUPTED and result.interruption == "lease_lost"
        return lost and self.caller.callback is None

    def _keep_alive(self) -> None:
        if time.monotonic() < self.next_refresh:
            return
        settings = self.jobs.settings
        self.next_refresh = time.monotonic() + settings.heartbeat_interval_s
        with self.jobs.db.write() as conn:
            turn_ops.refresh_caller(conn, self.turn.id, ttl_s=settings.lease_ttl_s)


def _ended_without_running(stored: TurnRecord | None, turn: TurnRecord) -> TurnResult:
    """Our turn was skipped (reset) or cancelled before it started."""
    if stored is None:
        return TurnResult(turn.request_id, "skipped", None, None)
    return TurnResult(turn.request_id, stored.status, stored.error, None)


class _Wakeups:
    """Sleeps until the agent's lease is released (pub/sub), or ``timeout_s`` passes."""

    def __init__(self, jobs: ThinkJobs, address: str) -> None:
        self._pubsub: PubSub | None = None
        try:
            pubsub = open_pubsub(jobs.redis)
            pubsub.subscribe(jobs.keys.turn_released(address))
            self._pubsub = pubsub
        except redis.RedisError as error:
            log.debug("waiting by polling only: %s", error)

    def wait(self, timeout_s: float) -> None:
        if self._pubsub is None:
            time.sleep(timeout_s)
            return
        try:
            self._pubsub.get_message(timeout=timeout_s)
        except redis.RedisError:
            self._pubsub = None
            time.sleep(timeout_s)

    def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError):
                self._pubsub.close()


def delete_history(agent: Think) -> None:
    """Delete the conversation while holding the agent's lease, so no turn runs meanwhile.

    Called after a reset: the aborted turn, if any, stops within a chunk and releases the
    lease; its partial reply is stored before the history is deleted, never after.
    """
    jobs = agent.jobs
    agent_id = jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    if execution.in_active_turn(agent.address):  # inside our own turn: we hold the lease
        with jobs.db.write() as conn:
            conversation_ops.delete_conversation(conn, agent_id)
        return
    wakeups = _Wakeups(jobs, agent.address)
    try:
        released = _delete_under_lease(jobs, agent_id, wakeups)
    finally:
        wakeups.close()
    if released.needs_worker:
        jobs.dispatch.enqueue_drain(agent_id)
    elif released.next_turn is not None:
        jobs.dispatch.wake_callers(agent.address)


def _delete_under_lease(jobs: ThinkJobs, agent_id: int, wakeups: _Wakeups) -> queueing.Released:
    settings = jobs.settings
    deadline = time.monotonic() + max(30.0, 2 * settings.lease_ttl_s)
    token = uuid.uuid4().hex
    while True:
        with jobs.db.write() as conn:
            taken = agent_ops.try_acquire_lease(conn, agent_id, token, ttl_s=settings.lease_ttl_s)
            if taken is not None:
                conversation_ops.delete_conversation(conn, agent_id)
                agent_ops.release_lease(conn, agent_id, token)
                return queueing.Released(turn_ops.head_brief(conn, agent_id))
        if time.monotonic() > deadline:
            raise ThinkJobsError("clear_messages: the running turn did not stop; try again")
        wakeups.wait(settings.caller_poll_interval_s)
