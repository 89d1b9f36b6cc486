"""Admission of a submission in one statement (PostgreSQL): bump the counter, insert the turn.

The general path (``agents.next_admission`` then ``turns.insert_turn``) takes two round trips:
it locks the agent row first so that the INSERT's own snapshot, taken after the lock, sees
every transaction that held the row before it (a turn finished and released just before is
seen as finished, and a duplicate committed just before is found). One statement has one
snapshot, taken *before* it waits for the row lock, so this one only goes ahead when no one
changed the agent row between its snapshot and its lock:

- the UPDATE's condition compares the row version's ``xmin`` with the one the statement's
  snapshot saw. When another transaction updated the row meanwhile (a claim, a release, an
  admission), PostgreSQL re-checks the condition on the new version, it fails, and nothing is
  written: the caller takes the general path in a transaction of its own;
- the ids the caller gave (a submission id, an idempotency key) must name no turn in the
  snapshot; when one does, nothing is written and the caller reads the turns they name and
  applies the rules of duplicates (``queueing.existing_submission``). A duplicate committed
  after the snapshot bumped the agent row, so the first condition catches it.

The transactions an admission waits for are those holding the agent row (claims, releases,
admissions: each updates it); the guard makes sure the statement never acts on a snapshot
older than one of them, so it sees what the two-statement path would. A transaction that
changes a turn without the agent row (cancelling a pending one) races with an admission the
same way on both paths. A row version the guard cannot match (frozen by VACUUM in between,
say) only sends the admission down the general path. SQLite has no data-modifying CTE; its
writers are serialised by the database lock anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, cast, exists, literal_column, or_, select, true

from think_jobs.db.dialect import db_now
from think_jobs.db.tables import agents, turns
from think_jobs.db.turns import NEW_TURN_COLUMNS, head_query, new_turn_row, record_of_insert
from think_jobs.domain.records import NewTurn, TurnRecord
from think_jobs.domain.status import Kind


@dataclass(frozen=True)
class AtTail:
    """A turn admitted in one statement: its row, and whether it is the agent's head with its
    lease free (someone must be nudged)."""

    turn: TurnRecord
    is_head: bool


_ROW_COLUMNS = (
    "agent_id",
    "status",
    "attempt",
    "recoveries",
    "messages_applied",
    *NEW_TURN_COLUMNS,
)


def _statement() -> Any:
    agent = bindparam("agent_id", type_=agents.c.id.type)
    seen = select(literal_column("xmin")).where(agents.c.id == agent).scalar_subquery()
    named = exists().where(
        turns.c.agent_id == agent,
        or_(
            turns.c.request_id == bindparam("request_id"),
            turns.c.idempotency_key == bindparam("idempotency_key"),
        ),
    )
    lease_live = agents.c.lease_expires_at.is_not(None) & (agents.c.lease_expires_at > db_now())
    bumped = (
        agents.update()
        .where(agents.c.id == agent, literal_column("xmin") == seen, ~named)
        .values(admitted=agents.c.admitted + 1)
        .returning(agents.c.admitted.label("seq"), lease_live.label("lease_live"))
        .cte("bumped")
    )
    names = [*_ROW_COLUMNS, "created_at", "seq"]
    values = [cast(bindparam(name, type_=turns.c[name].type), turns.c[name].type) for name in
              _ROW_COLUMNS]  # fmt: skip
    inserted = (
        turns.insert()
        .from_select(names, select(*values, db_now(), bumped.c.seq))
        .returning(turns.c.id, turns.c.created_at)
        .cte("inserted")
    )
    head = head_query(turns.c.seq, agent_param="agent_id").subquery()
    head_seq = select(head.c.seq).scalar_subquery()  # the snapshot does not hold our row
    return select(
        inserted.c.id, inserted.c.created_at, bumped.c.seq, bumped.c.lease_live,
        head_seq.label("head_seq"),
    ).select_from(inserted.join(bumped, true()))  # fmt: skip


_STATEMENT = _statement()


def admit_at_tail(conn: Connection, agent_id: int, new: NewTurn) -> AtTail | None:
    """Admit a durable submission in one round trip, or None when the general path must do it
    (SQLite, a concurrent change of the agent row, or an id that already names a turn)."""
    if conn.dialect.name != "postgresql" or new.kind is not Kind.SUBMISSION:
        return None
    row = new_turn_row(agent_id, seq=0, new=new)
    params = {name: row[name] for name in _ROW_COLUMNS}
    found = conn.execute(_STATEMENT, params).one_or_none()
    if found is None:
        return None
    turn = record_of_insert({**row, "seq": int(found.seq)}, found, caller_expires_at=None)
    is_head = found.head_seq is None and not found.lease_live
    return AtTail(turn, is_head=is_head)
