"""Named operations on ``think_turns``: the queue of admitted turns and the submission registry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    Select,
    bindparam,
    delete,
    func,
    literal,
    or_,
    select,
    tuple_,
    union_all,
    update,
)

from think_jobs.db.tables import turns

ACTIVE = ("pending", "running")
TERMINAL = ("completed", "error", "aborted", "skipped")


@dataclass(frozen=True)
class TurnRecord:
    """A snapshot of one ``think_turns`` row."""

    id: int
    agent_id: int
    seq: int
    request_id: str
    kind: str
    trigger: str
    status: str
    idempotency_key: str | None
    messages: list[Any] | None
    metadata: dict[str, Any] | None
    body: dict[str, Any] | None
    continuation: bool
    error: str | None
    attempt: int
    recoveries: int
    recovered_at_seq: int | None
    assistant_message_id: str | None
    messages_applied: bool
    caller_expires_at: datetime | None
    trace_context: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    followup: dict[str, Any] | None = None
    followup_due_at: datetime | None = None

    @property
    def is_submission(self) -> bool:
        return self.kind == "submission"


def _record(row: Row[Any]) -> TurnRecord:
    return TurnRecord(**row._mapping)


_INSERT_DEFAULTS: dict[str, Any] = {
    "continuation": False,
    "attempt": 0,
    "recoveries": 0,
    "recovered_at_seq": None,
    "messages_applied": False,
    "idempotency_key": None,
    "messages": None,
    "metadata": None,
    "body": None,
    "error": None,
    "assistant_message_id": None,
    "caller_expires_at": None,
    "trace_context": None,
    "started_at": None,
    "completed_at": None,
}


def get_turn_by_id(conn: Connection, turn_id: int) -> TurnRecord | None:
    row = conn.execute(select(turns).where(turns.c.id == turn_id)).one_or_none()
    return None if row is None else _record(row)


def get_turn(conn: Connection, agent_id: int, request_id: str) -> TurnRecord | None:
    query = select(turns).where(turns.c.agent_id == agent_id, turns.c.request_id == request_id)
    row = conn.execute(query).one_or_none()
    return None if row is None else _record(row)


def find_by_request_or_key(
    conn: Connection, agent_id: int, request_id: str | None, idempotency_key: str | None
) -> list[TurnRecord]:
    """The turns matching the request id or the idempotency key (0, 1 or 2 rows)."""
    conditions = []
    if request_id is not None:
        conditions.append(turns.c.request_id == request_id)
    if idempotency_key is not None:
        conditions.append(turns.c.idempotency_key == idempotency_key)
    if not conditions:
        return []
    query = select(turns).where(turns.c.agent_id == agent_id, or_(*conditions))
    return [_record(row) for row in conn.execute(query)]


def _head_query(*columns: Any, agent_param: str = "agent_id") -> Select[Any]:
    """The lowest-seq active turn of the agent bound as ``agent_param`` (another name where
    ``agent_id`` is taken by a column of an INSERT or UPDATE): one index probe per status (a
    plain ``status IN (...) ORDER BY seq`` lets planners walk the agent's whole history)."""

    def lowest(status: str) -> Any:
        return (
            select(*columns)
            .where(turns.c.agent_id == bindparam(agent_param), turns.c.status == status)
            .order_by(turns.c.seq)
            .limit(1)
            .subquery()
        )

    pending, running = lowest("pending"), lowest("running")
    both = union_all(select(pending), select(running)).subquery()
    return select(both).order_by(both.c.seq).limit(1)


_HEAD = _head_query(*turns.c)
_HEAD_BRIEF = _head_query(turns.c.seq, turns.c.kind, turns.c.status, turns.c.messages_applied)


def _insert_statement() -> Any:
    """INSERT a turn, RETURNING its id and the seq of the agent's head (active turn of lowest
    seq). Read by a statement of its own, so PostgreSQL takes its snapshot after the caller
    locked the agent row: a turn finished and released before that lock is seen as finished."""
    head = _head_query(turns.c.seq, agent_param="head_of").subquery()
    head_seq = select(head.c.seq).scalar_subquery().label("head_seq")
    return turns.insert().returning(turns.c.id, head_seq)


_INSERT = _insert_statement()


@dataclass(frozen=True)
class Inserted:
    turn: TurnRecord
    is_head: bool  # no active turn of the agent comes before it


def insert_turn(conn: Connection, **values: Any) -> Inserted:
    """Insert a turn row, and say whether it is the agent's head (one round trip)."""
    row = {**_INSERT_DEFAULTS, **values}
    inserted = conn.execute(_INSERT, {**row, "head_of": row["agent_id"]}).one()
    turn = TurnRecord(id=inserted.id, **row)
    # SQLite's RETURNING may already see the new row; PostgreSQL's does not.
    return Inserted(turn, is_head=inserted.head_seq is None or inserted.head_seq >= turn.seq)


@dataclass(frozen=True)
class HeadBrief:
    """Just enough of an agent's next turn to decide who should run it."""

    seq: int
    kind: str
    status: str
    messages_applied: bool


def head_turn(conn: Connection, agent_id: int) -> TurnRecord | None:
    """The agent's next turn: its lowest seq that is pending or running."""
    row = conn.execute(_HEAD, {"agent_id": agent_id}).one_or_none()
    return None if row is None else _record(row)


def head_brief(conn: Connection, agent_id: int) -> HeadBrief | None:
    row = conn.execute(_HEAD_BRIEF, {"agent_id": agent_id}).one_or_none()
    return None if row is None else HeadBrief(**row._mapping)


def replace_record(turn: TurnRecord, **changes: Any) -> TurnRecord:
    return replace(turn, **changes)


_START = (
    update(turns)
    .where(turns.c.id == bindparam("turn_id"))
    .values(
        status="running",
        attempt=bindparam("attempt"),
        recoveries=bindparam("recoveries"),
        started_at=bindparam("started_at"),
        assistant_message_id=bindparam("assistant_message_id"),
        messages_applied=bindparam("messages_applied"),
    )
)


def start_attempt(
    conn: Connection,
    turn: TurnRecord,
    *,
    now: datetime,
    assistant_message_id: str,
    recovering: bool,
    applying: bool = False,
) -> TurnRecord:
    """Mark the turn running for a new attempt (the caller holds the agent's lease);
    ``applying`` also records that its messages are being applied in this transaction."""
    changes: dict[str, Any] = {
        "attempt": turn.attempt + 1,
        "recoveries": turn.recoveries + (1 if recovering else 0),
        "started_at": turn.started_at or now,
        "assistant_message_id": turn.assistant_message_id or assistant_message_id,
        "messages_applied": turn.messages_applied or applying,
    }
    conn.execute(_START, {"turn_id": turn.id, **changes})
    return replace(turn, status="running", **changes)


def _start_fresh_head_statement() -> Any:
    """UPDATE that starts the agent's head iff it is a submission not yet begun, RETURNING it."""
    head = _head_query(turns.c.id, turns.c.seq, agent_param="head_of").subquery()
    return (
        update(turns)
        .where(
            turns.c.id == select(head.c.id).scalar_subquery(),
            turns.c.status == "pending",
            turns.c.kind == "submission",
            turns.c.messages_applied.is_(False),
        )
        .values(
            status="running",
            attempt=turns.c.attempt + 1,
            started_at=func.coalesce(
                turns.c.started_at, bindparam("now", type_=turns.c.started_at.type)
            ),
            assistant_message_id=func.coalesce(
                turns.c.assistant_message_id, bindparam("new_message_id")
            ),
            messages_applied=True,
        )
        .returning(*turns.c)
    )


_START_FRESH_HEAD = _start_fresh_head_statement()


def start_fresh_head(
    conn: Connection, agent_id: int, *, now: datetime, assistant_message_id: str
) -> TurnRecord | None:
    """The common case of a claim in one round trip: when the agent's head is a pending
    submission whose messages are not applied yet, mark it running (its messages being applied
    in this transaction) and return it. None means "look at the head" (``head_turn``): there is
    none, or it is running, blocking, or handed to recovery."""
    values = {"head_of": agent_id, "now": now, "new_message_id": assistant_message_id}
    row = conn.execute(_START_FRESH_HEAD, values).one_or_none()
    return None if row is None else _record(row)


def mark_messages_applied(conn: Connection, turn_id: int) -> None:
    conn.execute(update(turns).where(turns.c.id == turn_id).values(messages_applied=True))


_FINISH = (
    update(turns)
    .where(
        turns.c.id == bindparam("turn_id"),
        turns.c.status == "running",
        turns.c.attempt == bindparam("current_attempt"),
    )
    .values(status=bindparam("status"), error=bindparam("error"), completed_at=bindparam("now"))
)


def finish_turn(
    conn: Connection, turn: TurnRecord, *, status: str, error: str | None, now: datetime
) -> bool:
    """Write the final status iff the turn is still running this attempt (never overwrites)."""
    values: dict[str, Any] = {"turn_id": turn.id, "current_attempt": turn.attempt}
    values |= {"status": status, "error": error, "now": now}
    return conn.execute(_FINISH, values).rowcount == 1


def end_turn(
    conn: Connection,
    turn_id: int,
    *,
    status: str,
    error: str | None,
    now: datetime,
    from_statuses: Sequence[str] = ACTIVE,
) -> bool:
    """Move a turn to a terminal status iff it is currently in ``from_statuses``."""
    statement = (
        update(turns)
        .where(turns.c.id == turn_id, turns.c.status.in_(from_statuses))
        .values(status=status, error=error, completed_at=now)
    )
    return conn.execute(statement).rowcount == 1


def requeue_turn(conn: Connection, turn: TurnRecord) -> bool:
    """Put this attempt's running turn back to pending (for a fresh start or a continuation)."""
    statement = (
        update(turns)
        .where(turns.c.id == turn.id, turns.c.status == "running", turns.c.attempt == turn.attempt)
        .values(status="pending")
    )
    return conn.execute(statement).rowcount == 1


def note_recovery(conn: Connection, turn_id: int, *, recoveries: int, at_seq: int) -> None:
    """Record a recovery attempt: the (possibly reset) count and the stream length it saw."""
    conn.execute(
        update(turns)
        .where(turns.c.id == turn_id)
        .values(recoveries=recoveries, recovered_at_seq=at_seq)
    )


def refresh_caller(conn: Connection, turn_id: int, *, until: datetime) -> None:
    conn.execute(update(turns).where(turns.c.id == turn_id).values(caller_expires_at=until))


def active_turns(conn: Connection, agent_id: int) -> list[TurnRecord]:
    query = (
        select(turns)
        .where(turns.c.agent_id == agent_id, turns.c.status.in_(ACTIVE))
        .order_by(turns.c.seq)
    )
    return [_record(row) for row in conn.execute(query)]


def list_submissions(
    conn: Connection,
    agent_id: int,
    *,
    statuses: Sequence[str] | None,
    limit: int,
    before: TurnRecord | None = None,
) -> list[TurnRecord]:
    """Newest first (``created_at``, then ``request_id``); ``before`` is a keyset cursor."""
    query = select(turns).where(turns.c.agent_id == agent_id, turns.c.kind == "submission")
    if statuses is not None:
        query = query.where(turns.c.status.in_(statuses))
    if before is not None:
        created, request = turns.c.created_at, turns.c.request_id
        cursor = tuple_(
            literal(before.created_at, created.type), literal(before.request_id, request.type)
        )
        query = query.where(tuple_(created, request) < cursor)
    query = query.order_by(turns.c.created_at.desc(), turns.c.request_id.desc()).limit(limit)
    return [_record(row) for row in conn.execute(query)]


def delete_terminal_submission(conn: Connection, agent_id: int, submission_id: str) -> bool:
    statement = delete(turns).where(
        turns.c.agent_id == agent_id,
        turns.c.request_id == submission_id,
        turns.c.kind == "submission",
        turns.c.status.in_(TERMINAL),
    )
    return conn.execute(statement).rowcount == 1


def delete_terminal_submissions(
    conn: Connection,
    agent_id: int,
    *,
    statuses: Sequence[str],
    completed_before: datetime | None,
    limit: int,
) -> int:
    """Delete up to ``limit`` terminal submissions, oldest completed first."""
    chosen = (
        select(turns.c.id)
        .where(
            turns.c.agent_id == agent_id,
            turns.c.kind == "submission",
            turns.c.status.in_([s for s in statuses if s in TERMINAL]),
        )
        .order_by(turns.c.completed_at, turns.c.id)
        .limit(limit)
    )
    if completed_before is not None:
        chosen = chosen.where(turns.c.completed_at < completed_before)
    ids = list(conn.execute(chosen).scalars())
    if not ids:
        return 0
    return conn.execute(delete(turns).where(turns.c.id.in_(ids))).rowcount
