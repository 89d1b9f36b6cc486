"""Named read operations behind the admin dashboard, computed from ``think_turns`` alone.

No time-series store: the history is the turns' own timestamps. Every query is bounded to a
recent window (the last hour, or 24 h for the "usual duration" of an agent type) and reaches
rows through an index:

- active turns (pending, running) through ``ix_think_turns_status (status, agent_id)``;
- turns finished since a cutoff through an index on ``completed_at`` alone (migration
  ``ix_think_turns_finished``; without it PostgreSQL scans the table, since the existing
  ``(agent_id, kind, completed_at)`` index cannot serve a time range across agents).

A turn counts as *pending* at instant ``t`` when ``created_at <= t`` and it had neither started
nor finished by ``t`` (a turn put back to pending by recovery keeps its first ``started_at``,
so it is not counted again). Latency is ``completed_at - started_at`` of turns that finished
(any final status) after starting.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Connection, Float, Select, func, select, type_coerce

from think_jobs.db.tables import agents, turns
from think_jobs.db.turns import ACTIVE, TERMINAL
from think_jobs.domain.status import Kind, Status
from think_jobs.reports import (
    DashboardData,
    DepthSeries,
    LatencyBucket,
    OldestPending,
    StuckRule,
    StuckTurn,
)

WINDOW = timedelta(hours=1)
DEPTH_STEP = timedelta(minutes=1)
LATENCY_STEP = timedelta(minutes=5)
BASELINE_WINDOW = timedelta(hours=24)


def snapshot(conn: Connection, *, now: datetime, rule: StuckRule | None = None) -> DashboardData:
    """Everything the dashboard shows, read in the caller's transaction."""
    rule = rule or StuckRule()
    return DashboardData(
        now=now,
        depth=queue_depth(conn, now=now),
        latency=turn_latency(conn, now=now),
        oldest=oldest_pending(conn),
        stuck=stuck_turns(conn, now=now, rule=rule),
        rule=rule,
    )


def queue_depth(
    conn: Connection, *, now: datetime, window: timedelta = WINDOW, step: timedelta = DEPTH_STEP
) -> DepthSeries:
    """Pending turns at each ``step`` over the last ``window`` (both ends included)."""
    points = int(window / step)
    instants = tuple(now - window + i * step for i in range(points + 1))
    spans: dict[str, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    for agent_type, created, started, completed in _pending_candidates(conn, since=instants[0]):
        spans[agent_type].append((created, _first(started, completed)))
    by_type = {kind: _counts_at(instants, found) for kind, found in sorted(spans.items())}
    return DepthSeries(instants, by_type)


def turn_latency(
    conn: Connection, *, now: datetime, window: timedelta = WINDOW, step: timedelta = LATENCY_STEP
) -> list[LatencyBucket]:
    """p50/p95 run time of the turns that finished in each ``step`` of the last ``window``."""
    starts = [now - window + i * step for i in range(int(window / step))]
    durations: list[list[float]] = [[] for _ in starts]
    query = _finished_since(now - window).where(
        turns.c.started_at.is_not(None), turns.c.completed_at <= now
    )
    for row in conn.execute(query):
        index = min(int((row.completed_at - starts[0]) / step), len(starts) - 1)
        durations[index].append((row.completed_at - row.started_at).total_seconds())
    return [
        _bucket(start, start + step, found) for start, found in zip(starts, durations, strict=True)
    ]


def oldest_pending(conn: Connection) -> list[OldestPending]:
    """Per agent type, its oldest pending submission (and how many are pending), by type."""
    ranked = (
        select(
            agents.c.agent_type,
            agents.c.agent_name,
            turns.c.request_id,
            turns.c.created_at,
            func.count().over(partition_by=agents.c.agent_type).label("pending"),
            func.row_number()
            .over(partition_by=agents.c.agent_type, order_by=(turns.c.created_at, turns.c.id))
            .label("rank"),
        )
        .join(agents, agents.c.id == turns.c.agent_id)
        .where(turns.c.status == Status.PENDING, turns.c.kind == Kind.SUBMISSION)
        .subquery()
    )
    query = select(ranked).where(ranked.c.rank == 1).order_by(ranked.c.agent_type)
    return [
        OldestPending(row.agent_type, row.agent_name, row.request_id, row.created_at, row.pending)
        for row in conn.execute(query)
    ]


def stuck_turns(conn: Connection, *, now: datetime, rule: StuckRule) -> list[StuckTurn]:
    """Running turns past their agent type's limit (``rule``), longest-running first."""
    query = (
        select(
            agents.c.agent_type,
            agents.c.agent_name,
            turns.c.request_id,
            turns.c.kind,
            turns.c.started_at,
        )
        .join(agents, agents.c.id == turns.c.agent_id)
        .where(turns.c.status == Status.RUNNING, turns.c.started_at.is_not(None))
    )
    running = list(conn.execute(query))
    usual = usual_durations(conn, now=now, agent_types={row.agent_type for row in running})
    found = [
        StuckTurn(
            agent_type=row.agent_type,
            agent_name=row.agent_name,
            request_id=row.request_id,
            kind=row.kind,
            started_at=row.started_at,
            running_s=(now - row.started_at).total_seconds(),
            usual_s=usual.get(row.agent_type),
            limit_s=rule.limit_s(usual.get(row.agent_type)),
        )
        for row in running
    ]
    return sorted((t for t in found if t.running_s > t.limit_s), key=lambda t: -t.running_s)


def usual_durations(
    conn: Connection,
    *,
    now: datetime,
    agent_types: Iterable[str],
    window: timedelta = BASELINE_WINDOW,
) -> dict[str, float]:
    """p50 run time of each agent type's completed turns in the last ``window`` (computed by
    PostgreSQL; on SQLite from ``julianday``, so to within a millisecond)."""
    wanted = sorted(agent_types)
    if not wanted:
        return {}
    recent = (
        _finished_since(now - window)
        .where(
            turns.c.status == Status.COMPLETED,
            turns.c.started_at.is_not(None),
            agents.c.agent_type.in_(wanted),
        )
        .subquery()
    )
    seconds = _seconds_between(conn, recent.c.started_at, recent.c.completed_at)
    if conn.dialect.name == "postgresql":
        median = func.percentile_cont(0.5).within_group(seconds)
        query = select(recent.c.agent_type, median).group_by(recent.c.agent_type)
        return {row[0]: float(row[1]) for row in conn.execute(query)}
    durations: dict[str, list[float]] = defaultdict(list)
    for agent_type, value in conn.execute(select(recent.c.agent_type, seconds).order_by(seconds)):
        durations[agent_type].append(float(value))
    return {kind: quantile(found, 0.5) for kind, found in durations.items()}


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (PostgreSQL's ``percentile_cont``)."""
    if not ordered:
        raise ValueError("quantile of no values")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _finished_since(since: datetime) -> Select[tuple[str, datetime, datetime, datetime]]:
    """Turns that reached a final status after ``since`` (one index range on completed_at)."""
    return (
        select(agents.c.agent_type, turns.c.created_at, turns.c.started_at, turns.c.completed_at)
        .join(agents, agents.c.id == turns.c.agent_id)
        .where(turns.c.completed_at > since, turns.c.status.in_(TERMINAL))
    )


def _pending_candidates(
    conn: Connection, *, since: datetime
) -> list[tuple[str, datetime, datetime | None, datetime | None]]:
    """Every turn that may have been pending at some instant after ``since``."""
    active = (
        select(agents.c.agent_type, turns.c.created_at, turns.c.started_at, turns.c.completed_at)
        .join(agents, agents.c.id == turns.c.agent_id)
        .where(turns.c.status.in_(ACTIVE))
    )
    rows = [*conn.execute(active), *conn.execute(_finished_since(since))]
    return [(row[0], row[1], row[2], row[3]) for row in rows]


def _seconds_between(
    conn: Connection, start: ColumnElement[datetime], end: ColumnElement[datetime]
) -> ColumnElement[float]:
    """``end - start`` in seconds, computed by the database (no row-by-row datetime parsing)."""
    if conn.dialect.name == "postgresql":
        return type_coerce(func.extract("epoch", end - start), Float())
    return (func.julianday(end) - func.julianday(start)) * 86_400.0


def _first(*moments: datetime | None) -> datetime | None:
    found = [moment for moment in moments if moment is not None]
    return min(found) if found else None


def _counts_at(
    instants: Sequence[datetime], spans: Sequence[tuple[datetime, datetime | None]]
) -> tuple[int, ...]:
    """How many ``[created, ended)`` spans contain each instant (created inclusive)."""
    created = sorted(start for start, _ in spans)
    ended = sorted(end for _, end in spans if end is not None)
    return tuple(bisect_right(created, t) - bisect_right(ended, t) for t in instants)


def _bucket(start: datetime, end: datetime, durations: list[float]) -> LatencyBucket:
    if not durations:
        return LatencyBucket(start, end, 0, None, None)
    ordered = sorted(durations)
    return LatencyBucket(start, end, len(ordered), quantile(ordered, 0.5), quantile(ordered, 0.95))
