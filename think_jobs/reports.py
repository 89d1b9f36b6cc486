"""What the operator-facing read methods return: an agent's queue counts, health, and the
dashboard's snapshot (queue depth over time, turn latency, the oldest pending submission per
agent type, running turns that look stuck). Plain frozen records; storage fills them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from think_jobs.errors import BrokerUnavailableError, StorageUnavailableError

Check = Literal["ok", "unavailable"]


@dataclass(frozen=True)
class AgentCounts:
    """One agent and its pending and running turns."""

    agent_type: str
    agent_name: str
    pending: int
    running: int


@dataclass(frozen=True)
class Health:
    """Whether this process reaches its database and Redis (the error text when not)."""

    database_error: str | None
    redis_error: str | None

    @property
    def database(self) -> Check:
        return "ok" if self.database_error is None else "unavailable"

    @property
    def redis(self) -> Check:
        return "ok" if self.redis_error is None else "unavailable"

    @property
    def ok(self) -> bool:
        return self.database_error is None and self.redis_error is None

    def raise_for_database(self) -> None:
        if self.database_error is not None:
            raise StorageUnavailableError(self.database_error)

    def raise_for_redis(self) -> None:
        if self.redis_error is not None:
            raise BrokerUnavailableError(self.redis_error)


@dataclass(frozen=True)
class DepthSeries:
    """Pending turns at each instant (oldest first), per agent type."""

    instants: tuple[datetime, ...]
    by_type: Mapping[str, tuple[int, ...]]

    @property
    def total(self) -> tuple[int, ...]:
        columns = zip(*self.by_type.values(), strict=True)
        return tuple(sum(column) for column in columns) or (0,) * len(self.instants)


@dataclass(frozen=True)
class LatencyBucket:
    """Turns that finished in ``[start, end)``: how many, and their p50/p95 run time."""

    start: datetime
    end: datetime
    count: int
    p50_s: float | None
    p95_s: float | None


@dataclass(frozen=True)
class OldestPending:
    """The longest-waiting pending submission of one agent type."""

    agent_type: str
    agent_name: str
    submission_id: str
    created_at: datetime
    pending: int  # pending submissions of this agent type, all agents

    def age_s(self, now: datetime) -> float:
        return (now - self.created_at).total_seconds()


@dataclass(frozen=True)
class StuckRule:
    """A running turn looks stuck past ``max(min_s, factor * usual)``, where ``usual`` is the
    p50 run time of its agent type's completed turns in the last 24 h (``min_s`` alone when
    the type completed nothing in that time)."""

    factor: float = 5.0
    min_s: float = 60.0

    def limit_s(self, usual_s: float | None) -> float:
        return self.min_s if usual_s is None else max(self.min_s, self.factor * usual_s)


@dataclass(frozen=True)
class StuckTurn:
    agent_type: str
    agent_name: str
    request_id: str
    kind: str
    started_at: datetime
    running_s: float
    usual_s: float | None
    limit_s: float


@dataclass(frozen=True)
class DashboardData:
    now: datetime
    depth: DepthSeries
    latency: list[LatencyBucket]
    oldest: list[OldestPending]
    stuck: list[StuckTurn]
    rule: StuckRule
