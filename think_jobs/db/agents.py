"""Named operations on ``think_agents``: identity, admission counter, lease, remembered body."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    bindparam,
    case,
    func,
    literal,
    null,
    or_,
    select,
    text,
    union,
    update,
)

from think_jobs.db.dialect import db_now, db_now_plus, insert_ignoring_conflicts, seconds_param
from think_jobs.db.tables import ABORTED_TURNS, agents, turns
from think_jobs.db.turns import record_of_row
from think_jobs.domain.records import TurnRecord
from think_jobs.domain.status import Status
from think_jobs.reports import AgentCounts


def ensure_agent(conn: Connection, agent_type: str, agent_name: str) -> int:
    """The agent's row id, creating the row on first use (safe under concurrent callers)."""
    conn.execute(
        insert_ignoring_conflicts(conn, agents).values(
            agent_type=agent_type, agent_name=agent_name, admitted=0, created_at=db_now()
        )
    )
    found = find_agent_id(conn, agent_type, agent_name)
    assert found is not None
    return found


def find_agent_id(conn: Connection, agent_type: str, agent_name: str) -> int | None:
    query = select(agents.c.id).where(
        agents.c.agent_type == agent_type, agents.c.agent_name == agent_name
    )
    return conn.execute(query).scalar_one_or_none()


def agent_identity(conn: Connection, agent_id: int) -> tuple[str, str] | None:
    row = conn.execute(
        select(agents.c.agent_type, agents.c.agent_name).where(agents.c.id == agent_id)
    ).one_or_none()
    return None if row is None else (row.agent_type, row.agent_name)


@dataclass(frozen=True)
class Admitted:
    """The number a new turn gets, whether the agent's lease was live at that moment, and the
    database server's time then."""

    seq: int
    lease_held: bool
    now: datetime


_LEASE_LIVE = func.coalesce(agents.c.lease_expires_at > db_now(), False)

_NEXT_ADMISSION = (
    update(agents)
    .where(agents.c.id == bindparam("agent_id"))
    .values(admitted=agents.c.admitted + 1)
    .returning(agents.c.admitted, _LEASE_LIVE, db_now())
)


def next_admission(conn: Connection, agent_id: int) -> Admitted:
    """Increment and return the agent's admission counter; locks the agent row until commit.

    Every admission goes through this row lock, so turn numbers are handed out in commit order
    per agent, and concurrent admissions with the same idempotency key serialise here.
    """
    row = conn.execute(_NEXT_ADMISSION, {"agent_id": agent_id}).one()
    return Admitted(int(row[0]), bool(row[1]), row[2])


@dataclass(frozen=True)
class Held:
    """A lease taken or renewed: the agent's admission count (the highest seq handed out so
    far) and the database server's time as it was written."""

    admitted: int
    now: datetime


_EXPIRES = db_now_plus(seconds_param("ttl_s"))

_ACQUIRE = (
    update(agents)
    .where(
        agents.c.id == bindparam("agent_id"),
        or_(agents.c.lease_token.is_(None), agents.c.lease_expires_at < db_now()),
    )
    .values(lease_token=bindparam("token"), lease_expires_at=_EXPIRES)
    .returning(agents.c.admitted, db_now())
)


_TAKE_FREE = _ACQUIRE.where(agents.c.lease_token.is_(None))
_TAKE_LAPSED = _ACQUIRE.where(agents.c.lease_token.is_not(None))


@dataclass(frozen=True)
class Taken:
    """A lease taken: the renewal's figures, and whether it was taken over from a holder
    whose lease lapsed (a process that died or lost the database holding it) rather than
    found free."""

    held: Held
    lapsed: bool


def take_lease(conn: Connection, agent_id: int, token: str, *, ttl_s: float) -> Taken | None:
    """``try_acquire_lease``, telling a free lease from a lapsed one (a second statement only
    when the lease was not free); None when someone else holds it."""
    values = {"agent_id": agent_id, "token": token, "ttl_s": ttl_s}
    for statement, lapsed in ((_TAKE_FREE, False), (_TAKE_LAPSED, True)):
        row = conn.execute(statement, values).one_or_none()
        if row is not None:
            return Taken(Held(int(row[0]), row[1]), lapsed)
    return None


def try_acquire_lease(conn: Connection, agent_id: int, token: str, *, ttl_s: float) -> Held | None:
    """Take the agent's lease if it is free or expired (by the database server's clock);
    None when someone else holds it."""
    values = {"agent_id": agent_id, "token": token, "ttl_s": ttl_s}
    row = conn.execute(_ACQUIRE, values).one_or_none()
    return None if row is None else Held(int(row[0]), row[1])


# The fences also make part of db.final_write's one statement: their agent is ``agent_row``, a
# name no table has as a column (SQLAlchemy turns an execution parameter named like a column
# of an UPDATE into a SET of that column, in every part of a statement).
RENEW = (
    update(agents)
    .where(agents.c.id == bindparam("agent_row"), agents.c.lease_token == bindparam("token"))
    .values(lease_expires_at=_EXPIRES)
    .returning(agents.c.admitted, db_now().label("now"))
)


def renew_lease(conn: Connection, agent_id: int, token: str, *, ttl_s: float) -> Held | None:
    """Extend a lease we hold, and lock the agent row until commit (so nobody can take the
    lease before this transaction ends); None if the lease was lost (taken, or released)."""
    values = {"agent_row": agent_id, "token": token, "ttl_s": ttl_s}
    row = conn.execute(RENEW, values).one_or_none()
    return None if row is None else Held(int(row[0]), row[1])


_RENEWED = RENEW.cte("renewed")
_HEARTBEAT = select(_RENEWED.c.admitted, _RENEWED.c.now, *turns.c).select_from(
    _RENEWED.outerjoin(turns, turns.c.id == bindparam("watched_turn"))
)


def renew_reading_turn(
    conn: Connection, agent_id: int, token: str, *, ttl_s: float, turn_id: int
) -> tuple[Held, TurnRecord | None] | None:
    """``renew_lease`` and the turn's row (None: deleted) in one statement, for a connection
    in autocommit (PostgreSQL): it commits as it ends, so a process frozen or cut off around it
    leaves no transaction holding the agent's row. The turn is read from the statement's
    snapshot, taken before the renewal waited for the row, if it did: a status set meanwhile
    shows at the next heartbeat. None if the lease was lost."""
    values = {"agent_row": agent_id, "token": token, "ttl_s": ttl_s, "watched_turn": turn_id}
    row = conn.execute(_HEARTBEAT, values).one_or_none()
    if row is None:
        return None
    found = row._mapping
    turn = None if found[turns.c.id] is None else record_of_row({c.name: found[c] for c in turns.c})
    return Held(int(found[_RENEWED.c.admitted]), found[_RENEWED.c.now]), turn


RELEASE = (
    update(agents)
    .where(agents.c.id == bindparam("agent_row"), agents.c.lease_token == bindparam("token"))
    .values(lease_token=null(), lease_expires_at=null())
    .returning(agents.c.admitted)
)


def release_lease(conn: Connection, agent_id: int, token: str) -> int | None:
    """Give a lease we hold back and lock the agent row; None if it was not ours any more.

    Returns the agent's admission count as the release wrote the row: the latest version,
    read after the lock, so every admission that committed before the release is counted
    (even in a statement whose snapshot is older)."""
    admitted: int | None = conn.execute(
        RELEASE, {"agent_row": agent_id, "token": token}
    ).scalar_one_or_none()
    return admitted


_LAPSE = (
    update(agents)
    .where(agents.c.id == bindparam("agent_row"), agents.c.lease_token == bindparam("token"))
    .values(lease_expires_at=db_now())
)


def lapse_lease(conn: Connection, agent_id: int, token: str) -> None:
    """End a lease we hold now, keeping its token: the next taker finds it lapsed, not free
    (``take_lease``), as if this holder had died, and does what a take-over does."""
    conn.execute(_LAPSE, {"agent_row": agent_id, "token": token})


def lease_is_live(conn: Connection, agent_id: int) -> bool:
    query = select(_LEASE_LIVE).where(agents.c.id == agent_id)
    return bool(conn.execute(query).scalar_one_or_none())


def set_last_body(conn: Connection, agent_id: int, body: dict[str, Any] | None) -> None:
    conn.execute(update(agents).where(agents.c.id == agent_id).values(last_body=body))


def get_last_body(conn: Connection, agent_id: int) -> dict[str, Any] | None:
    query = select(agents.c.last_body).where(agents.c.id == agent_id)
    return conn.execute(query).scalar_one_or_none()


def agents_needing_a_drain(conn: Connection, *, limit: int, after: int = 0) -> list[int]:
    """Agents with pending turns whose lease is free or expired (the sweeper enqueues them),
    the first ``limit`` by id after ``after``; a continuation waiting for an approval is
    nudged by the answer instead.

    Driven from the active turns (an index probe per status), then one primary-key probe per
    agent found for a live lease, so its cost follows the work waiting, not the number of
    agents or the size of the history (a join let PostgreSQL scan every agent row).
    """
    active = union(
        select(turns.c.agent_id).where(
            turns.c.status == Status.PENDING,
            turns.c.awaiting_approval.is_(False),
            turns.c.agent_id > after,
        ),
        select(turns.c.agent_id).where(turns.c.status == Status.RUNNING, turns.c.agent_id > after),
    ).subquery()
    leased = select(agents.c.id).where(
        agents.c.id == active.c.agent_id, agents.c.lease_expires_at >= db_now()
    )
    query = (
        select(active.c.agent_id).where(~leased.exists()).order_by(active.c.agent_id).limit(limit)
    )
    return list(conn.execute(query).scalars())


def agents_with_a_lapsed_cancel(conn: Connection, *, within_s: float, limit: int) -> list[int]:
    """Agents with a turn cancelled in the last ``within_s`` whose lease lapsed in its
    holder's hands (a process that died, or was paused or cut off, holding it): a running turn
    cancelled while its attempt was dead keeps what it streamed once someone takes the lease
    over (``queueing.Unsettled``), and the sweeper sends these agents a drain so that one
    that gets no further turn has it stored too. The agents of the ``limit`` latest such
    cancels of turns that had started (one at a time per agent: a bulk cancel of pending
    turns, say of an agent no worker serves, does not fill the batch), by id.

    Driven from the partial index of aborted turns (``ix_think_turns_aborted``), then one
    primary-key probe per agent: its cost follows the recent cancels, not the turns."""
    query = lapsed_cancels_query().limit(limit)
    found: Sequence[int] = conn.execute(query, {"within_s": within_s}).scalars().all()
    return sorted(set(found))


def lapsed_cancels_query() -> Select[Any]:
    """``agents_with_a_lapsed_cancel``'s query, without its limit (its plan is tested): the
    latest cancels first, read from the partial index in its order."""
    lapsed = select(agents.c.id).where(
        agents.c.id == turns.c.agent_id,
        agents.c.lease_token.is_not(None),
        agents.c.lease_expires_at < db_now(),
    )
    return (
        select(turns.c.agent_id)
        .where(
            text(f"{turns.name}.{ABORTED_TURNS}"),
            turns.c.completed_at >= db_now_plus(-seconds_param("within_s")),
            turns.c.started_at.is_not(None),  # it ran: a turn cancelled pending streamed nothing
            lapsed.exists(),
        )
        .order_by(turns.c.completed_at.desc())
    )


def list_agents(conn: Connection) -> list[AgentCounts]:
    """Every agent with its pending and running turn counts."""
    counts = (
        select(
            turns.c.agent_id,
            func.sum(case((turns.c.status == Status.PENDING, 1), else_=0)).label("p"),
            func.sum(case((turns.c.status == Status.RUNNING, 1), else_=0)).label("r"),
        )
        .where(turns.c.status.in_((Status.PENDING, Status.RUNNING)))
        .group_by(turns.c.agent_id)
        .subquery()
    )
    query = (
        select(agents.c.agent_type, agents.c.agent_name, counts.c.p, counts.c.r)
        .outerjoin(counts, counts.c.agent_id == agents.c.id)
        .order_by(agents.c.agent_type, agents.c.agent_name)
    )
    return [AgentCounts(r[0], r[1], int(r[2] or 0), int(r[3] or 0)) for r in conn.execute(query)]


def queue_counts(conn: Connection) -> list[tuple[str, str, int]]:
    """(agent type, status, turns) for pending and running turns (the queue gauges)."""
    query = (
        select(agents.c.agent_type, turns.c.status, func.count())
        .join(agents, agents.c.id == turns.c.agent_id)
        .where(turns.c.status.in_((Status.PENDING, Status.RUNNING)))
        .group_by(agents.c.agent_type, turns.c.status)
    )
    return [(row[0], row[1], int(row[2])) for row in conn.execute(query)]


def ping(conn: Connection) -> None:
    """A round trip (health checks)."""
    conn.execute(select(literal(1)))
