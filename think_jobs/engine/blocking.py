"""Blocking turns (``save_messages``, ``chat``, ``continue_last_turn``) run in the caller.

The caller admits its turn at the tail of the agent's queue like any other, then waits for it
to reach the head. While waiting it helps: a durable submission ahead of it is run right here
if no worker has taken it, so a parent agent calling ``child.chat()`` from a worker with a
single slot never waits for a slot that it is itself occupying. Callables, callbacks and abort
signals work because the turn runs in the process that holds them. A caller whose attempt lost
the lease (it was paused or cut off) waits for the turn's new owner and returns its result.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from think_jobs.callbacks import ChatStartEvent, call_optional
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.domain.records import AgentRef, NewTurn, Released, TurnRecord
from think_jobs.domain.status import INTERRUPTED, Kind, Status, StopKind
from think_jobs.engine import execution, handoff, queueing
from think_jobs.engine.execution import CallerTurn, MessagesFunction, TurnResult
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.errors import NestedTurnError, ThinkJobsError
from think_jobs.observe import tracing
from think_jobs.transport.wakeups import Wakeups

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


def run_blocking(services: Services, agent: AgentHooks, request: BlockingRequest) -> TurnResult:
    """Admit the caller's turn, wait for it (helping with work ahead), run it, return."""
    if execution.in_active_turn(agent.address):
        raise NestedTurnError(nested_turn_message(request.trigger))
    request_id = str(uuid.uuid4())
    if request.caller.callback is not None:
        call_optional(request.caller.callback, "on_start", ChatStartEvent(request_id))
    wakeups = Wakeups(services.redis, services.keys, agent.address)  # before admitting
    try:
        turn = _admit(services, agent, request, request_id)
        return _Waiter(services, agent, turn, request.caller).run(wakeups)
    finally:
        wakeups.close()


def _admit(
    services: Services, agent: AgentHooks, request: BlockingRequest, request_id: str
) -> TurnRecord:
    agent_id = services.agents.agent_id_of(agent, create=True)
    assert agent_id is not None
    new = NewTurn(
        request_id=request_id,
        kind=Kind.BLOCKING,
        trigger=request.trigger,
        messages=request.static_messages,
        body=request.body,
        continuation=request.continuation,
        metadata=request.metadata,
        caller_ttl_s=services.settings.lease_ttl_s,
        trace_context=tracing.carrier(),
    )
    with services.db.write() as conn:
        return queueing.admit(conn, agent_id, new).turn


class _Waiter:
    def __init__(
        self, services: Services, agent: AgentHooks, turn: TurnRecord, caller: CallerTurn
    ) -> None:
        self.services = services
        self.agent = agent
        self.turn = turn
        self.caller = caller
        self.next_refresh = time.monotonic() + services.settings.heartbeat_interval_s

    def run(self, wakeups: Wakeups) -> TurnResult:
        while True:
            result = self._step()
            if result is not None:
                return result
            self._keep_alive()
            wakeups.wait(self.services.settings.caller_poll_interval_s)

    def _step(self) -> TurnResult | None:
        """Try once: run our turn, or help with the submission ahead; None means keep waiting."""
        agent = AgentRef(self.turn.agent_id, self.agent.agent_type, self.agent.name)
        claimed = execution.claim(self.services, agent, caller_turn_id=self.turn.id)
        if isinstance(claimed, execution.Claimed):
            if claimed.claim.turn.id == self.turn.id:
                result = execution.execute(self.services, claimed, self.caller)
                return None if self._owner_goes_on(result) else result
            with self._alive_meanwhile():
                execution.execute(self.services, claimed)
            return None
        with self.services.db.read() as conn:
            mine = turn_ops.get_turn_by_id(conn, self.turn.id)
        if mine is None or not mine.active:
            return _ended_without_running(mine, self.turn)
        return None

    def _owner_goes_on(self, result: TurnResult) -> bool:
        """Our attempt lost the lease (this process was paused or cut off): another attempt
        owns the turn. ``chat`` returns (its callback got ``on_interrupted``); the others wait
        for the turn's end and return the owner's result."""
        lost = result.status == INTERRUPTED and result.interruption is StopKind.LEASE_LOST
        return lost and self.caller.callback is None

    def _keep_alive(self) -> None:
        if time.monotonic() < self.next_refresh:
            return
        self.next_refresh = time.monotonic() + self.services.settings.heartbeat_interval_s
        self._refresh()

    def _refresh(self) -> None:
        with self.services.db.write() as conn:
            turn_ops.refresh_caller(conn, self.turn.id, ttl_s=self.services.settings.lease_ttl_s)

    @contextmanager
    def _alive_meanwhile(self) -> Iterator[None]:
        """While this caller runs the turn ahead of its own, a thread keeps its liveness
        fresh: that turn may last longer than a lease TTL, and the moment its end releases
        the lease another claimer may look at ours — it took our lapsed liveness for a caller
        gone and aborted our turn ("The caller went away before its turn started")."""
        stop = threading.Event()
        interval_s = self.services.settings.heartbeat_interval_s

        def refresh() -> None:
            while not stop.wait(interval_s):
                try:
                    self._refresh()
                except ThinkJobsError as error:  # the next one may get through
                    log.warning("caller of %s not kept alive: %s", self.turn.request_id, error)

        thread = threading.Thread(target=refresh, name="think-jobs-caller-alive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _ended_without_running(stored: TurnRecord | None, turn: TurnRecord) -> TurnResult:
    """Our turn was skipped (reset) or cancelled before it started."""
    if stored is None:
        return TurnResult(turn.request_id, Status.SKIPPED, None, None)
    return TurnResult(turn.request_id, stored.status, stored.error, None)


def delete_history(services: Services, agent: AgentHooks) -> None:
    """Delete the conversation while holding the agent's lease, so no turn runs meanwhile.

    Called after a reset: the aborted turn, if any, stops within a chunk and releases the
    lease; its partial reply is stored before the history is deleted, never after. Called
    from inside a turn of the agent (a tool), that turn is the one the reset aborted: it
    stores no reply at all.
    """
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return
    lease = execution.active_lease(agent.address)
    if lease is not None:  # inside our own turn (a tool, a hook): fenced by its lease
        with lease.write("clear_messages") as conn:
            conversation_ops.delete_conversation(conn, agent_id)
        lease.reply_dropped = True  # its final write, still to come, must not add it back
        return
    wakeups = Wakeups(services.redis, services.keys, agent.address)
    try:
        released = _delete_under_lease(services, agent_id, wakeups)
    finally:
        wakeups.close()
    handoff.released(services, AgentRef(agent_id, agent.agent_type, agent.name), released)


def _delete_under_lease(services: Services, agent_id: int, wakeups: Wakeups) -> Released:
    settings = services.settings
    deadline = time.monotonic() + max(30.0, 2 * settings.lease_ttl_s)
    token = uuid.uuid4().hex
    while True:
        with services.db.write() as conn:
            taken = agent_ops.try_acquire_lease(conn, agent_id, token, ttl_s=settings.lease_ttl_s)
            if taken is not None:
                conversation_ops.delete_conversation(conn, agent_id)
                agent_ops.release_lease(conn, agent_id, token)
                return Released(turn_ops.head_brief(conn, agent_id))
        if time.monotonic() > deadline:
            raise ThinkJobsError("clear_messages: the running turn did not stop; try again")
        wakeups.wait(settings.caller_poll_interval_s)
