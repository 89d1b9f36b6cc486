"""What a worker does with a ``drain`` message, and the sweeper that nudges stuck agents.

``drain(agent_id)`` runs at most one turn (the agent's head) and, on release, enqueues the
next drain for the agent at the back of the Celery queue: an agent with a thousand pending
turns takes one slot at a time and waits its round like everyone else.

The sweeper runs in every worker (a thread, every ``sweep_interval_s``): it enqueues a drain
for agents that have pending work but no live lease, which covers submissions accepted while
the broker was down, drain messages lost with a Redis restart, and orphaned turns whose
executor died (their lease expires, recovery takes over); and for agents whose running turn was
cancelled while its attempt was dead, once that attempt's lease lapsed, so that the partial
its stream showed is stored even when the agent gets no further turn (the drain's claim takes
the lease over and stores it: ``queueing.Unsettled``). It also expires tool approvals left
open past ``approval_timeout_s`` (``engine.approvals``). It looks at up to ``_SWEEP_BATCH``
such agents a sweep, each sweep going on from where the last one stopped (``_SweepCursor``):
agents that stay on the list (a type no worker serves, a backlog longer than a batch) cannot
keep the ones after them from ever being looked at.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from think_jobs.db import agents as agent_ops
from think_jobs.domain.records import AgentRef, Drained, Idle, NotClaimed
from think_jobs.engine import approvals, execution, followups, handoff
from think_jobs.engine.ports import Services
from think_jobs.errors import AgentNotRegisteredError, ThinkJobsError
from think_jobs.transport import flags

log = logging.getLogger(__name__)

_SWEEP_BATCH = 1000


def drain(services: Services, agent_id: int, *, swept: bool = False) -> Drained:
    """Run the agent's next turns while its time slice lasts; returns what happened.

    One turn at least; more of the same agent while ``drain_slice_s`` is not used up and turns
    were queued behind the last one (saves a Celery round trip per turn when turns are quick).
    Then the next drain goes to the back of the queue, so an agent with a long backlog takes
    its share, not the workers; a turn admitted meanwhile is handed on by the release. A drain
    the sweeper sent (``swept``) first drops its mark, so the next sweep may send another. A
    drain that reaches a worker handing its turns over (``engine.handover``) is sent on.
    """
    if swept:
        _forget_sweep_mark(services, agent_id)
    if services.running.handing_over:
        handoff.passed_on(services, agent_id)
        return Drained(0, Idle.STOPPING)
    agent = _agent_ref(services, agent_id)
    if isinstance(agent, Idle):
        return Drained(0, agent)
    deadline = time.monotonic() + services.settings.drain_slice_s
    ran = 0
    claimed = execution.claim(services, agent)
    while True:
        if isinstance(claimed, NotClaimed):
            if claimed.reason is Idle.CALLER:
                handoff.caller_waits(services, agent)
            return Drained(ran) if ran else Drained(0, claimed.reason)
        # Turns waiting and time left: keep the lease for the next one (on SQLite claimed with
        # the final write when no hook runs after it). Otherwise release now rather than look
        # again.
        keep = claimed.claim.queued_behind and time.monotonic() < deadline
        outcome = execution.run_and_release(services, claimed, keep_lease=keep)
        ran += 1
        if keep and outcome.following is not None:
            claimed = outcome.following
        elif keep and claimed.lease.locally_valid():
            claimed = execution.claim(services, agent, held=claimed.lease)
        else:
            if outcome.released is not None:
                handoff.released(services, agent, outcome.released)
            return Drained(ran)


def _agent_ref(services: Services, agent_id: int) -> AgentRef | Idle:
    identity = services.agents.identity_of(agent_id)
    if identity is None:
        return Idle.UNKNOWN_AGENT
    try:
        services.agents.instantiate(*identity)
    except AgentNotRegisteredError:
        _log_unregistered(services, identity[0])
        return Idle.UNREGISTERED
    return AgentRef(agent_id, *identity)


_REPORTED_UNREGISTERED: weakref.WeakKeyDictionary[Services, set[str]] = weakref.WeakKeyDictionary()


def _log_unregistered(services: Services, agent_type: str) -> None:
    """ERROR once per type and process (then DEBUG): the sweeper retries every few seconds."""
    reported = _REPORTED_UNREGISTERED.setdefault(services, set())
    level = logging.DEBUG if agent_type in reported else logging.ERROR
    reported.add(agent_type)
    served = ", ".join(services.agents.agent_types) or "none"
    log.log(
        level,
        "agent type %s is not registered in this worker (it serves: %s); its turns wait for a "
        "worker started with the --app that registers it",
        *(agent_type, served),
    )


class _SweepCursor:
    """The last agent id a sweep of this process looked at (0: start from the first)."""

    def __init__(self) -> None:
        self.after = 0
        self.lock = threading.Lock()


_CURSORS: weakref.WeakKeyDictionary[Services, _SweepCursor] = weakref.WeakKeyDictionary()


def sweep(services: Services, *, batch: int = _SWEEP_BATCH) -> int:
    """Enqueue a drain for the next ``batch`` agents with pending work and no live lease, and
    for those with a recent cancel whose attempt's lease lapsed; send the follow-ups of ended
    turns nobody sent, and expire tool approvals open past ``approval_timeout_s``; returns how
    many drains were enqueued. A sweep that filled its batch leaves the next one to go on
    after its last agent; one that did not, to start over."""
    cursor = _CURSORS.setdefault(services, _SweepCursor())
    with cursor.lock:
        with services.db.read() as conn:
            agent_ids = agent_ops.agents_needing_a_drain(conn, limit=batch, after=cursor.after)
            cancelled = agent_ops.agents_with_a_lapsed_cancel(
                conn, within_s=_cancel_window_s(services), limit=batch
            )
        cursor.after = agent_ids[-1] if len(agent_ids) == batch else 0
    sent = 0
    for agent_id in agent_ids + sorted(set(cancelled) - set(agent_ids)):
        if _mark_swept(services, agent_id) and services.dispatch.enqueue_drain(
            agent_id, swept=True
        ):
            sent += 1
    followups.send_due(services)
    approvals.expire_overdue(services)
    return sent


def _cancel_window_s(services: Services) -> float:
    """How far back the sweeper looks for cancels whose attempt's lease lapsed: the dead
    holder's lease lapses within a lease TTL (and a heartbeat) of the cancel, and a drain
    sent for it that got lost is sent again once its mark expires."""
    return 2 * services.settings.lease_ttl_s + 2 * _sweep_mark_ttl_s(services)


def _sweep_mark_ttl_s(services: Services) -> int:
    return max(30, int(6 * services.settings.sweep_interval_s))


def _mark_swept(services: Services, agent_id: int) -> bool:
    """Remember that the sweeper sent a drain, so it does not pile up duplicates behind a long
    queue. True if no mark was there."""
    ttl_s = _sweep_mark_ttl_s(services)
    return flags.mark_swept(services.redis, services.keys, agent_id, ttl_s=ttl_s)


def _forget_sweep_mark(services: Services, agent_id: int) -> None:
    flags.forget_sweep_mark(services.redis, services.keys, agent_id)


class Sweeper:
    """A daemon thread calling ``sweep`` every ``sweep_interval_s`` until stopped."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="think-jobs-sweeper", daemon=True)

    def start(self) -> Sweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            try:
                sweep(self._services)
            except ThinkJobsError as error:
                log.warning("sweep failed (will retry): %s", error)
            except Exception:
                log.exception("sweep failed (will retry)")
            if self._stop.wait(self._services.settings.sweep_interval_s):
                return
