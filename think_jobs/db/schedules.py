"""``think_schedules``: each agent's scheduled tasks and the next occurrence beat will fire.

The row is the whole state of a schedule, so any number of beat processes can share it: an
occurrence is claimed by moving ``next_run_at`` forward with a conditional UPDATE (only the
beat whose UPDATE still sees the old value wins), and code changes are applied with set-based
statements per agent type that touch only the rows that differ.

The table is declared on the same ``Base`` as ``tables.py`` so the metadata Alembic compares
against sees it; migration ``0002`` creates it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    ForeignKey,
    Index,
    Row,
    String,
    Table,
    UniqueConstraint,
    delete,
    exists,
    literal,
    select,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from think_jobs.db.dialect import insert_ignoring_conflicts
from think_jobs.db.tables import ID, Base, UTCDateTime, agents
from think_jobs.keys import agent_address


class ScheduleRow(Base):
    __tablename__ = "think_schedules"
    __table_args__ = (
        UniqueConstraint("agent_id", "task_id", name="uq_think_schedules_task"),
        Index("ix_think_schedules_due", "next_run_at"),
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    agent_id: Mapped[int] = mapped_column(ID, ForeignKey("think_agents.id", ondelete="CASCADE"))
    task_id: Mapped[str] = mapped_column(String(255))
    schedule: Mapped[str] = mapped_column(String(255))
    timezone: Mapped[str | None] = mapped_column(String(64))
    next_run_at: Mapped[datetime]
    last_scheduled_for: Mapped[datetime | None]
    last_fired_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


schedules = cast(Table, ScheduleRow.__table__)


@dataclass(frozen=True)
class ScheduleSpec:
    """What the code wants for one task: its phrase as written, its resolved zone (None for
    intervals) and, when it has to be armed now, its first occurrence."""

    task_id: str
    schedule: str
    timezone: str | None
    next_run_at: datetime


@dataclass(frozen=True)
class StoredSchedule:
    """A row of ``think_schedules`` with its agent's identity."""

    id: int
    agent_id: int
    agent_type: str
    agent_name: str
    task_id: str
    schedule: str
    timezone: str | None
    next_run_at: datetime
    last_scheduled_for: datetime | None
    last_fired_at: datetime | None

    @property
    def address(self) -> str:
        """``<type>:<name>`` of the agent."""
        return agent_address(self.agent_type, self.agent_name)


_COLUMNS = (
    schedules.c.id,
    schedules.c.agent_id,
    agents.c.agent_type,
    agents.c.agent_name,
    schedules.c.task_id,
    schedules.c.schedule,
    schedules.c.timezone,
    schedules.c.next_run_at,
    schedules.c.last_scheduled_for,
    schedules.c.last_fired_at,
)


def _stored(row: Row[Any]) -> StoredSchedule:
    return StoredSchedule(**row._asdict())


def _select_stored() -> Any:
    return select(*_COLUMNS).join(agents, agents.c.id == schedules.c.agent_id)


def _agents_of_type(agent_type: str) -> Any:
    return select(agents.c.id).where(agents.c.agent_type == agent_type)


# -- arming ------------------------------------------------------------------------------------


def insert_missing(
    conn: Connection, agent_id: int, specs: Sequence[ScheduleSpec], *, now: datetime
) -> None:
    """Arm the agent's tasks that have no row yet (concurrent callers are harmless)."""
    if not specs:
        return
    rows = [
        {
            "agent_id": agent_id,
            "task_id": spec.task_id,
            "schedule": spec.schedule,
            "timezone": spec.timezone,
            "next_run_at": spec.next_run_at,
            "created_at": now,
            "updated_at": now,
        }
        for spec in specs
    ]
    conn.execute(insert_ignoring_conflicts(conn, schedules), rows)


def arm_missing_for_type(
    conn: Connection, agent_type: str, spec: ScheduleSpec, *, now: datetime
) -> int:
    """Arm ``spec`` for every agent of ``agent_type`` that lacks it; returns how many."""
    missing = ~exists().where(
        schedules.c.agent_id == agents.c.id, schedules.c.task_id == spec.task_id
    )
    source = select(
        agents.c.id,
        literal(spec.task_id, String()),
        literal(spec.schedule, String()),
        literal(spec.timezone, String()),
        literal(spec.next_run_at, UTCDateTime()),
        literal(now, UTCDateTime()),
        literal(now, UTCDateTime()),
    ).where(agents.c.agent_type == agent_type, missing)
    names = ["agent_id", "task_id", "schedule", "timezone", "next_run_at"]
    statement = insert_ignoring_conflicts(conn, schedules).from_select(
        [*names, "created_at", "updated_at"], source
    )
    # An INSERT's row count is only kept when asked for (PostgreSQL reports -1 otherwise).
    return int(conn.execute(statement.execution_options(preserve_rowcount=True)).rowcount)


def rearm_changed(conn: Connection, agent_type: str, spec: ScheduleSpec, *, now: datetime) -> int:
    """Re-arm the rows of ``spec.task_id`` whose phrase or zone differ from the code's."""
    statement = (
        update(schedules)
        .where(
            schedules.c.agent_id.in_(_agents_of_type(agent_type)),
            schedules.c.task_id == spec.task_id,
            (schedules.c.schedule != spec.schedule)
            | schedules.c.timezone.is_distinct_from(spec.timezone),
        )
        .values(
            schedule=spec.schedule,
            timezone=spec.timezone,
            next_run_at=spec.next_run_at,
            updated_at=now,
        )
    )
    return int(conn.execute(statement).rowcount)


def delete_removed(conn: Connection, agent_type: str, keep: Collection[str]) -> int:
    """Disarm the tasks of ``agent_type``'s agents that the code no longer declares."""
    statement = delete(schedules).where(
        schedules.c.agent_id.in_(_agents_of_type(agent_type)),
        schedules.c.task_id.not_in(list(keep)),
    )
    return int(conn.execute(statement).rowcount)


# -- firing ------------------------------------------------------------------------------------


def due(
    conn: Connection, agent_types: Iterable[str], *, now: datetime, limit: int
) -> list[StoredSchedule]:
    """Rows of these agent types whose next run is at or before ``now``, oldest first."""
    types = list(agent_types)
    if not types:
        return []
    query = (
        _select_stored()
        .where(schedules.c.next_run_at <= now, agents.c.agent_type.in_(types))
        .order_by(schedules.c.next_run_at, schedules.c.id)
        .limit(limit)
    )
    return [_stored(row) for row in conn.execute(query)]


def claim(
    conn: Connection,
    schedule_ids: Sequence[int],
    *,
    due_at: datetime,
    next_run_at: datetime,
    now: datetime,
) -> set[int]:
    """Take the occurrence ``due_at`` of these rows by arming ``next_run_at``; returns the ids
    taken (a row another beat moved first is not)."""
    statement = (
        update(schedules)
        .where(schedules.c.id.in_(list(schedule_ids)), schedules.c.next_run_at == due_at)
        .values(next_run_at=next_run_at, last_scheduled_for=due_at, last_fired_at=now)
        .returning(schedules.c.id)
    )
    return set(conn.execute(statement).scalars())


def unclaim(conn: Connection, schedule_id: int, *, due_at: datetime, next_run_at: datetime) -> bool:
    """Give an occurrence back (its fire could not be sent), unless the row moved since."""
    statement = (
        update(schedules)
        .where(schedules.c.id == schedule_id, schedules.c.next_run_at == next_run_at)
        .values(next_run_at=due_at)
    )
    return conn.execute(statement).rowcount == 1


def move_next_run(conn: Connection, agent_id: int, task_id: str, when: datetime) -> bool:
    """Set when a task fires next (tests move it into the past instead of waiting)."""
    statement = (
        update(schedules)
        .where(schedules.c.agent_id == agent_id, schedules.c.task_id == task_id)
        .values(next_run_at=when)
    )
    return conn.execute(statement).rowcount == 1


# -- reading -----------------------------------------------------------------------------------


def for_agent(conn: Connection, agent_id: int) -> list[StoredSchedule]:
    query = _select_stored().where(schedules.c.agent_id == agent_id).order_by(schedules.c.task_id)
    return [_stored(row) for row in conn.execute(query)]


def get(conn: Connection, agent_id: int, task_id: str) -> StoredSchedule | None:
    query = _select_stored().where(schedules.c.agent_id == agent_id, schedules.c.task_id == task_id)
    row = conn.execute(query).one_or_none()
    return None if row is None else _stored(row)


def list_all(conn: Connection) -> list[StoredSchedule]:
    """Every stored schedule, by agent type, agent name and task id."""
    query = _select_stored().order_by(agents.c.agent_type, agents.c.agent_name, schedules.c.task_id)
    return [_stored(row) for row in conn.execute(query)]
