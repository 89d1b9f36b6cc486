"""What the engine works with: the ``Services`` of a process and the ``AgentHooks`` of an agent.

The engine is written against these, never against ``ThinkJobs`` or ``Think``: a function's
parameters say exactly what it may touch. ``ThinkJobs`` builds one ``Services`` per process
and is its ``AgentDirectory``; every ``Think`` is an ``AgentHooks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from think_jobs.callbacks import ChatStartEvent
from think_jobs.context import TurnContext
from think_jobs.db.engine import Database
from think_jobs.engine.handover import RunningTurns
from think_jobs.keys import Keys
from think_jobs.models.base import Model
from think_jobs.results import ChatResponseResult, SubmissionInspection
from think_jobs.scheduled_task import ScheduledTask
from think_jobs.settings import Settings
from think_jobs.tools import Tool
from think_jobs.transport.clients import Redis, RedisClients
from think_jobs.transport.dispatch import Dispatcher
from think_jobs.transport.flags import RevocationPoller

__all__ = ["AgentDirectory", "AgentHooks", "ChatStartEvent", "Services"]


class AgentHooks(Protocol):
    """An agent as the engine sees it: its identity and the hooks a turn calls."""

    @property
    def agent_type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def stall_timeout_s(self) -> float | None: ...
    @property
    def turn_timeout_s(self) -> float | None: ...
    @property
    def max_steps(self) -> int | None: ...

    def get_model(self) -> Model: ...
    def get_system_prompt(self) -> str: ...
    def get_tools(self) -> Mapping[str, Tool]: ...
    def get_scheduled_tasks(self) -> Mapping[str, ScheduledTask]: ...
    def get_default_timezone(self) -> str | None: ...
    def before_turn(self, ctx: TurnContext) -> None: ...
    def on_chat_response(self, result: ChatResponseResult) -> None: ...
    def on_chat_error(self, error: str) -> None: ...
    def on_submission_status(self, inspection: SubmissionInspection) -> None: ...
    def overrides(self, hook: str) -> bool:
        """Whether the agent's class overrides the hook named ``hook`` (the engine skips
        work for hooks nobody wrote)."""
        ...


class AgentDirectory(Protocol):
    """Agent rows and classes, as the runtime knows them."""

    def agent_id_of(self, agent: AgentHooks, *, create: bool) -> int | None:
        """The agent's row id (created, and its schedules armed, on first use)."""
        ...

    def identity_of(self, agent_id: int) -> tuple[str, str] | None:
        """``(agent_type, agent_name)`` of a row id."""
        ...

    def instantiate(self, agent_type: str, name: str) -> AgentHooks:
        """An agent of a registered type; raises ``AgentNotRegisteredError``."""
        ...

    @property
    def agent_types(self) -> list[str]:
        """The registered agent types, sorted."""
        ...


@dataclass(frozen=True, eq=False)
class Services:
    """Everything of a process the engine may use."""

    settings: Settings
    db: Database
    clients: RedisClients
    keys: Keys
    dispatch: Dispatcher
    revocations: RevocationPoller
    agents: AgentDirectory
    running: RunningTurns = field(default_factory=RunningTurns)

    @property
    def redis(self) -> Redis:
        return self.clients.redis
