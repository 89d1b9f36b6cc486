"""``think_schedules``: each agent's scheduled tasks and the next occurrence beat will fire.

The row is the whole state of a schedule, so any number of beat processes can share it: an
occurrence is claimed by moving ``next_run_at`` forward with a conditional UPDATE (only the
beat whose UPDATE still sees the old value wins), and code changes are applied with set-based
statements per agent type that touch only the rows that differ.

``think_schedule_fires`` holds each claimed occurrence until a worker has fired it: the claim
inserts it in the same transaction, the worker deletes it when the occurrence has its outcome,
and beat sends it again while it is still there past ``resend_at`` — so a fire message lost
with a killed beat, a killed worker or a Redis restarted empty is sent again, not lost.

The tables are declared on the same ``Base`` as ``tables.py`` so the metadata Alembic compares
against sees them; migrations ``0002`` and ``0008`` create them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Float,
    ForeignKey,
    Index,
    Integer,
    Row,
    String,
    Table,
    UniqueConstraint,
    delete,
    exists,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from think_jobs.db.dialect import db_now_plus, insert_ignoring_conflicts
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


class FireRow(Base):
    """An occurrence claimed and not yet fired: sent again by beat from ``resend_at`` on.
    ``run_token`` names the worker firing it (None: nobody yet, or its hold lapsed)."""

    __tablename__ = "think_schedule_fires"
    __table_args__ = (Index("ix_think_schedule_fires_resend", "resend_at"),)

    schedule_id: Mapped[int] = mapped_column(
        ID, ForeignKey("think_schedules.id", ondelete="CASCADE"), primary_key=True
    )
    due_at: Mapped[datetime] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    resend_at: Mapped[datetime]
    run_token: Mapped[str | None] = mapped_column(String(36))


fires = cast(Table, FireRow.__table__)


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


# -- kept occurrences ------------------------------------------------------------------------


@dataclass(frozen=True)
class KeptFire:
    """A claimed occurrence no worker has fired yet, with what its message carries. ``held``:
    a worker has taken it and is firing it (``resend_at`` is then when its hold lapses)."""

    schedule_id: int
    agent_id: int
    agent_type: str
    agent_name: str
    task_id: str
    due_at: datetime
    attempt: int
    resend_at: datetime
    held: bool = False

    @property
    def address(self) -> str:
        """``<type>:<name>`` of the agent."""
        return agent_address(self.agent_type, self.agent_name)


def record_fires(
    conn: Connection, schedule_ids: Collection[int], *, due_at: datetime, resend_at: datetime
) -> None:
    """Keep the occurrence ``due_at`` of these rows until it is fired (in the claim's
    transaction); one kept already is left as it is."""
    if not schedule_ids:
        return
    rows = [
        {"schedule_id": schedule_id, "due_at": due_at, "attempt": 1, "resend_at": resend_at}
        for schedule_id in schedule_ids
    ]
    conn.execute(insert_ignoring_conflicts(conn, fires), rows)


def _select_kept() -> Any:
    return (
        select(
            fires.c.schedule_id,
            schedules.c.agent_id,
            agents.c.agent_type,
            agents.c.agent_name,
            schedules.c.task_id,
            fires.c.due_at,
            fires.c.attempt,
            fires.c.resend_at,
            fires.c.run_token.is_not(None).label("held"),
        )
        .join(schedules, schedules.c.id == fires.c.schedule_id)
        .join(agents, agents.c.id == schedules.c.agent_id)
    )


def overdue_fires(
    conn: Connection, agent_types: Iterable[str], *, now: datetime, limit: int
) -> list[KeptFire]:
    """Kept occurrences of these agent types due to be sent again, oldest first."""
    types = list(agent_types)
    if not types:
        return []
    query = (
        _select_kept()
        .where(fires.c.resend_at <= now, agents.c.agent_type.in_(types))
        .order_by(fires.c.resend_at, fires.c.schedule_id)
        .limit(limit)
    )
    return [KeptFire(**row._asdict()) for row in conn.execute(query)]


def overdue_counts(conn: Connection, *, now: datetime) -> dict[str, int]:
    """Per agent type: kept occurrences whose ``resend_at`` has passed."""
    query = (
        select(agents.c.agent_type, func.count())
        .select_from(fires)
        .join(schedules, schedules.c.id == fires.c.schedule_id)
        .join(agents, agents.c.id == schedules.c.agent_id)
        .where(fires.c.resend_at <= now)
        .group_by(agents.c.agent_type)
    )
    return {agent_type: int(count) for agent_type, count in conn.execute(query)}


def kept_fires(conn: Connection) -> list[KeptFire]:
    """Every kept occurrence (not fired yet), by schedule and occurrence."""
    query = _select_kept().order_by(fires.c.schedule_id, fires.c.due_at)
    return [KeptFire(**row._asdict()) for row in conn.execute(query)]


def postpone_fire(conn: Connection, fire: KeptFire, *, resend_at: datetime) -> bool:
    """Take ``fire`` for sending again by moving its ``resend_at`` on; False when another beat
    took it first, or a worker fired it meanwhile. A worker that had taken it and let its
    hold lapse loses it: the message sent again may be taken."""
    statement = update(fires).where(
        fires.c.schedule_id == fire.schedule_id,
        fires.c.due_at == fire.due_at,
        fires.c.resend_at == fire.resend_at,
    )
    return conn.execute(statement.values(resend_at=resend_at, run_token=None)).rowcount == 1


def _fire_of(agent_id: int, task_id: str, due_at: datetime) -> Any:
    schedule = select(schedules.c.id).where(
        schedules.c.agent_id == agent_id, schedules.c.task_id == task_id
    )
    return (fires.c.schedule_id == schedule.scalar_subquery()) & (fires.c.due_at == due_at)


def is_kept(conn: Connection, agent_id: int, task_id: str, due_at: datetime) -> bool:
    """Whether the occurrence is still kept (not fired yet)."""
    found = conn.execute(select(fires.c.attempt).where(_fire_of(agent_id, task_id, due_at)))
    return found.first() is not None


def take_fire(
    conn: Connection,
    agent_id: int,
    task_id: str,
    due_at: datetime,
    *,
    attempt: int,
    token: str,
    hold_s: float,
) -> bool:
    """Take the kept occurrence to fire it as ``attempt``, held ``hold_s`` from now by the
    database's clock (beat sends it again only once a hold lapses); False when it is not
    kept, is kept for another attempt, or another worker holds it."""
    statement = update(fires).where(
        _fire_of(agent_id, task_id, due_at), fires.c.attempt == attempt, fires.c.run_token.is_(None)
    )
    values = {"run_token": token, "resend_at": db_now_plus(literal(hold_s, Float()))}
    return conn.execute(statement.values(**values)).rowcount == 1


def hold_fire(
    conn: Connection, agent_id: int, task_id: str, due_at: datetime, *, token: str, hold_s: float
) -> bool:
    """Hold a taken occurrence ``hold_s`` more; False when the holder lost it (its hold
    lapsed and beat sent it again) or it is gone."""
    statement = update(fires).where(_of_holder(agent_id, task_id, due_at, token))
    resend_at = db_now_plus(literal(hold_s, Float()))
    return conn.execute(statement.values(resend_at=resend_at)).rowcount == 1


def release_fire(
    conn: Connection, agent_id: int, task_id: str, due_at: datetime, *, token: str
) -> bool:
    """Give a taken occurrence back untouched (this worker cannot fire it)."""
    statement = update(fires).where(_of_holder(agent_id, task_id, due_at, token))
    return conn.execute(statement.values(run_token=None)).rowcount == 1


def retry_fire(
    conn: Connection,
    agent_id: int,
    task_id: str,
    due_at: datetime,
    *,
    token: str,
    attempt: int,
    in_s: float,
) -> bool:
    """Have beat send the occurrence again as ``attempt``, ``in_s`` from now by the database's
    clock; False when its holder lost it meanwhile."""
    statement = update(fires).where(_of_holder(agent_id, task_id, due_at, token))
    values = {
        "attempt": attempt,
        "resend_at": db_now_plus(literal(in_s, Float())),
        "run_token": None,
    }
    return conn.execute(statement.values(**values)).rowcount == 1


def forget_fire(
    conn: Connection, agent_id: int, task_id: str, due_at: datetime, *, token: str
) -> bool:
    """The occurrence has its outcome: beat sends it no more. False when its holder lost it
    meanwhile (another worker fires it now)."""
    statement = delete(fires).where(_of_holder(agent_id, task_id, due_at, token))
    return conn.execute(statement).rowcount == 1


def _of_holder(agent_id: int, task_id: str, due_at: datetime, token: str) -> Any:
    return _fire_of(agent_id, task_id, due_at) & (fires.c.run_token == token)


def forget_fires(conn: Connection, schedule_id: int, due_at: datetime) -> None:
    """Drop the kept occurrence of a claim given back (its row is due again)."""
    statement = delete(fires).where(fires.c.schedule_id == schedule_id, fires.c.due_at == due_at)
    conn.execute(statement)
