"""Who runs an agent's next turn, decided here and only here.

Every place that can leave an agent with work and nobody running it ends with one of these:
a lease given back (``released``: a worker, or the blocking caller waiting on its turn, per
``policy.next_nudge``), a drain that found a blocking turn at the head (``caller_waits``), a
pending turn cancelled (``after_cancelled``), a new submission (``admitted``). The nudges are
hints (``transport.dispatch``); the sweeper covers one that is lost.
"""

from __future__ import annotations

from think_jobs.domain import policy
from think_jobs.domain.policy import Nudge
from think_jobs.domain.records import Admission, AgentRef, Released
from think_jobs.domain.status import Status
from think_jobs.engine.ports import Services
from think_jobs.keys import agent_address


def released(services: Services, agent: AgentRef, what: Released) -> None:
    """A lease was given back: nudge whoever runs the agent's next turn."""
    nudge = policy.nudge_after_release(what)
    address = agent_address(agent.agent_type, agent.agent_name)
    if nudge is Nudge.DRAIN:
        services.dispatch.enqueue_drain(agent.id, address)
    elif nudge is Nudge.WAKE:
        services.dispatch.wake_callers(address)


def passed_on(services: Services, agent_id: int) -> None:
    """A drain reached a worker that hands its turns over (it is stopping): send it on to a
    worker that runs on, rather than claim a turn only to hand it over."""
    services.dispatch.enqueue_drain(agent_id)


def caller_waits(services: Services, agent: AgentRef) -> None:
    """The head is a blocking turn only its own caller may run: wake it."""
    services.dispatch.wake_callers(agent_address(agent.agent_type, agent.agent_name))


def after_cancelled(
    services: Services, agent_id: int, address: str, *, is_submission: bool
) -> None:
    """A pending turn was cancelled: whatever was behind it may now be the head."""
    if is_submission:
        services.dispatch.enqueue_drain(agent_id, address)
    services.dispatch.wake_callers(address)


def admitted(services: Services, admission: Admission, address: str) -> None:
    """A submission was admitted at the head (or a duplicate still waits): nudge a worker."""
    waiting = not admission.accepted and admission.turn.status is Status.PENDING
    if admission.is_head or waiting:
        services.dispatch.enqueue_drain(admission.turn.agent_id, address)
