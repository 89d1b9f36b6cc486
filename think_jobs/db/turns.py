"""Named operations on ``think_turns``: the queue of admitted turns and the submission registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Boolean,
    Connection,
    Float,
    Integer,
    Row,
    Select,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    null,
    or_,
    select,
    tuple_,
    union_all,
    update,
)

from think_jobs.db.dialect import db_now, db_now_plus, seconds_param
from think_jobs.db.tables import turns
from think_jobs.domain import status as domain_status
from think_jobs.domain.records import Ended, HeadBrief, NewTurn, TurnRecord
from think_jobs.domain.status import Kind, Status
from think_jobs.limits import MAX_JSON_DEPTH_CAP, json_depth

ACTIVE = tuple(sorted(status.value for status in domain_status.ACTIVE))
TERMINAL = tuple(sorted(status.value for status in domain_status.TERMINAL))


def _record(row: Row[Any]) -> TurnRecord:
    return record_of_row(row._mapping)


def record_of_row(values: Mapping[Any, Any]) -> TurnRecord:
    """The record of a turn row read back (every column of ``think_turns``, by name)."""
    status, kind = Status(values["status"]), Kind(values["kind"])
    metadata = _readable_metadata(values["metadata"])
    return TurnRecord(**{**values, "status": status, "kind": kind, "metadata": metadata})


def _readable_metadata(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored metadata, or a note in its place when it is nested deeper than can be read
    back (a row stored before the input limits): a listing must not fail over one old row."""
    if not metadata:
        return metadata
    depth = json_depth(metadata)
    if depth <= MAX_JSON_DEPTH_CAP:
        return metadata
    note = (
        f"nested {depth} levels deep, more than {MAX_JSON_DEPTH_CAP} can be read back; "
        "stored before the input limits: delete the submission"
    )
    return {"unreadable_metadata": note}


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
    "trace_context": None,
    "extends": None,
    "started_at": None,
    "completed_at": None,
}
_CALLER_TTL = seconds_param("caller_ttl_s")


def get_turn_by_id(conn: Connection, turn_id: int) -> TurnRecord | None:
    row = conn.execute(select(turns).where(turns.c.id == turn_id)).one_or_none()
    return None if row is None else _record(row)


def get_turn(conn: Connection, agent_id: int, request_id: str) -> TurnRecord | None:
    query = select(turns).where(turns.c.agent_id == agent_id, turns.c.request_id == request_id)
    row = conn.execute(query).one_or_none()
    return None if row is None else _record(row)


def last_applied(conn: Connection, agent_id: int) -> TurnRecord | None:
    """The agent's latest turn whose messages were applied: the one that ran last (turns run
    in order), or None. Locked until ``conn``'s transaction ends (PostgreSQL): a status
    change in flight commits first and is read, or waits for this transaction."""
    query = (
        select(turns)
        .where(turns.c.agent_id == agent_id, turns.c.messages_applied.is_(True))
        .order_by(turns.c.seq.desc())
        .limit(1)
        .with_for_update()
    )
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


def head_query(*columns: Any, agent_param: str = "agent_id") -> Select[Any]:
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

    pending, running = lowest(Status.PENDING), lowest(Status.RUNNING)
    both = union_all(select(pending), select(running)).subquery()
    return select(both).order_by(both.c.seq).limit(1)


_HEAD = head_query(*turns.c)
_HEAD_BRIEF = head_query(
    turns.c.seq, turns.c.kind, turns.c.status, turns.c.messages_applied, turns.c.awaiting_approval
)


def _insert_statement() -> Any:
    """INSERT a turn, RETURNING its id, its database-clock times and the seq of the agent's
    head (active turn of lowest seq). Read by a statement of its own, so PostgreSQL takes its
    snapshot after the caller locked the agent row: a turn finished and released before that
    lock is seen as finished. ``caller_ttl_s`` (blocking turns) sets the caller's liveness."""
    head = head_query(turns.c.seq, agent_param="head_of").subquery()
    head_seq = select(head.c.seq).scalar_subquery().label("head_seq")
    unset = cast(_CALLER_TTL, Float).is_(None)  # typed: PostgreSQL must know the NULL's type
    caller_expires = case((unset, null()), else_=db_now_plus(_CALLER_TTL))
    return (
        turns.insert()
        .values(created_at=db_now(), caller_expires_at=caller_expires)
        .returning(turns.c.id, turns.c.created_at, turns.c.caller_expires_at, head_seq)
    )


_INSERT = _insert_statement()


@dataclass(frozen=True)
class Inserted:
    turn: TurnRecord
    is_head: bool  # no active turn of the agent comes before it


def new_turn_row(agent_id: int, *, seq: int, new: NewTurn) -> dict[str, Any]:
    """The column values of a new (pending) turn row, but those the database sets."""
    return {
        **_INSERT_DEFAULTS,
        "agent_id": agent_id,
        "seq": seq,
        "status": Status.PENDING.value,
        **{name: getattr(new, name) for name in NEW_TURN_COLUMNS},
    }


def insert_turn(conn: Connection, *, agent_id: int, seq: int, new: NewTurn) -> Inserted:
    """Insert a turn row (pending), and say whether it is the agent's head (one round trip)."""
    row = new_turn_row(agent_id, seq=seq, new=new)
    params = {**row, "head_of": agent_id, "caller_ttl_s": new.caller_ttl_s}
    inserted = conn.execute(_INSERT, params).one()
    turn = record_of_insert(row, inserted, caller_expires_at=inserted.caller_expires_at)
    # SQLite's RETURNING may already see the new row; PostgreSQL's does not.
    return Inserted(turn, is_head=inserted.head_seq is None or inserted.head_seq >= turn.seq)


NEW_TURN_COLUMNS = (
    "request_id",
    "kind",
    "trigger",
    "messages",
    "idempotency_key",
    "metadata",
    "body",
    "continuation",
    "trace_context",
    "assistant_message_id",
    "awaiting_approval",
    "extends",
)


def record_of_insert(
    row: dict[str, Any], inserted: Row[Any], *, caller_expires_at: datetime | None
) -> TurnRecord:
    """The record of a turn just inserted from ``row`` (``new_turn_row``): ``inserted`` holds
    its id and creation time."""
    values = {**row, "status": Status(row["status"]), "kind": Kind(row["kind"])}
    return TurnRecord(
        id=inserted.id,
        created_at=inserted.created_at,
        caller_expires_at=caller_expires_at,
        **values,
    )


def head_turn(conn: Connection, agent_id: int) -> TurnRecord | None:
    """The agent's next turn: its lowest seq that is pending or running."""
    row = conn.execute(_HEAD, {"agent_id": agent_id}).one_or_none()
    return None if row is None else _record(row)


def head_brief(conn: Connection, agent_id: int) -> HeadBrief | None:
    row = conn.execute(_HEAD_BRIEF, {"agent_id": agent_id}).one_or_none()
    if row is None:
        return None
    kind, status = Kind(row.kind), Status(row.status)
    return HeadBrief(row.seq, kind, status, row.messages_applied, row.awaiting_approval)


def replace_record(turn: TurnRecord, **changes: Any) -> TurnRecord:
    return replace(turn, **changes)


_START = (
    update(turns)
    .where(
        turns.c.id == bindparam("turn_id"),
        turns.c.attempt == bindparam("previous_attempt"),
        turns.c.status.in_(ACTIVE),
    )
    .values(
        status=Status.RUNNING,
        attempt=turns.c.attempt + 1,
        recoveries=turns.c.recoveries + bindparam("recovering", type_=Integer()),
        started_at=func.coalesce(turns.c.started_at, db_now()),
        assistant_message_id=func.coalesce(
            turns.c.assistant_message_id, bindparam("new_message_id")
        ),
        messages_applied=or_(turns.c.messages_applied, bindparam("applying", type_=Boolean())),
    )
    .returning(*turns.c)
)


def start_attempt(
    conn: Connection,
    turn: TurnRecord,
    *,
    assistant_message_id: str,
    recovering: bool,
    applying: bool = False,
) -> TurnRecord | None:
    """Mark the turn running for a new attempt (the caller holds the agent's lease);
    ``applying`` also records that its messages are being applied in this transaction.
    None when the turn changed since ``turn`` was read (look at the head again)."""
    values = {
        "turn_id": turn.id,
        "previous_attempt": turn.attempt,
        "recovering": 1 if recovering else 0,
        "new_message_id": assistant_message_id,
        "applying": applying,
    }
    row = conn.execute(_START, values).one_or_none()
    return None if row is None else _record(row)


def _start_fresh_head_statement() -> Any:
    """UPDATE that starts the agent's head iff it is a submission not yet begun, RETURNING it."""
    head = head_query(turns.c.id, turns.c.seq, agent_param="head_of").subquery()
    return (
        update(turns)
        .where(
            turns.c.id == select(head.c.id).scalar_subquery(),
            turns.c.status == Status.PENDING,
            turns.c.kind == Kind.SUBMISSION,
            turns.c.messages_applied.is_(False),
            turns.c.awaiting_approval.is_(False),
        )
        .values(
            status=Status.RUNNING,
            attempt=turns.c.attempt + 1,
            started_at=func.coalesce(turns.c.started_at, db_now()),
            assistant_message_id=func.coalesce(
                turns.c.assistant_message_id, bindparam("new_message_id")
            ),
            messages_applied=True,
        )
        .returning(*turns.c)
    )


_START_FRESH_HEAD = _start_fresh_head_statement()


def start_fresh_head(
    conn: Connection, agent_id: int, *, assistant_message_id: str
) -> TurnRecord | None:
    """The common case of a claim in one round trip: when the agent's head is a pending
    submission whose messages are not applied yet, mark it running (its messages being applied
    in this transaction) and return it. None means "look at the head" (``head_turn``): there is
    none, or it is running, blocking, or handed to recovery."""
    values = {"head_of": agent_id, "new_message_id": assistant_message_id}
    row = conn.execute(_START_FRESH_HEAD, values).one_or_none()
    return None if row is None else _record(row)


def give_up_place(conn: Connection, turn: TurnRecord) -> None:
    """A finished turn hands its number in the agent's line to its continuation (admitted
    next with ``turn.seq``): it takes its row id, negated, instead (unique, and below every
    number the line hands out; a chain of continuations gives up the same number in turn)."""
    conn.execute(update(turns).where(turns.c.id == turn.id).values(seq=-turn.id))


def lock_turn(conn: Connection, turn_id: int) -> None:
    """Lock the turn's row until ``conn``'s transaction ends (PostgreSQL; SQLite's writers
    are serialised anyway): what a transaction that holds it committed is read after this."""
    conn.execute(select(turns.c.id).where(turns.c.id == turn_id).with_for_update())


def stop_awaiting(conn: Connection, turn_id: int) -> bool:
    """The continuation's approvals are all answered: it may run (False: it was not waiting)."""
    statement = (
        update(turns)
        .where(
            turns.c.id == turn_id,
            turns.c.status == Status.PENDING,
            turns.c.awaiting_approval.is_(True),
        )
        .values(awaiting_approval=False)
    )
    return conn.execute(statement).rowcount == 1


def mark_messages_applied(conn: Connection, turn_id: int) -> None:
    conn.execute(update(turns).where(turns.c.id == turn_id).values(messages_applied=True))


# A follow-up is due as soon as its turn ends; whoever takes it for sending (the process that
# ended the turn, else a sweeper) makes it due again this much later, in case it dies before
# confirming the send.
FOLLOWUP_RESEND_AFTER_S = 10.0
_RESEND_AT = db_now_plus(literal(FOLLOWUP_RESEND_AFTER_S))

_ENDED = {
    "status": bindparam("status"),
    "error": bindparam("error"),
    "completed_at": db_now(),
    "followup_due_at": case((turns.c.followup.is_(None), null()), else_=db_now()),
}
_ENDED_RETURNING = (turns.c.completed_at, turns.c.followup)

FINISH = (  # also part of db.final_write
    update(turns)
    .where(
        turns.c.id == bindparam("turn_id"),
        turns.c.status == Status.RUNNING,
        turns.c.attempt == bindparam("current_attempt"),
    )
    .values(**_ENDED)
    .returning(*_ENDED_RETURNING)
)


def _ended(row: Row[Any] | None) -> Ended | None:
    return None if row is None else Ended(row.completed_at, row.followup)


def finish_turn(
    conn: Connection, turn: TurnRecord, *, status: str, error: str | None
) -> Ended | None:
    """Write the final status iff the turn is still running this attempt (never overwrites);
    None when it was not written."""
    values = {"turn_id": turn.id, "current_attempt": turn.attempt, "status": status}
    return _ended(conn.execute(FINISH, {**values, "error": error}).one_or_none())


def end_turn(
    conn: Connection,
    turn_id: int,
    *,
    status: str,
    error: str | None,
    from_statuses: Sequence[str] = ACTIVE,
) -> Ended | None:
    """Move a turn to a terminal status iff it is currently in ``from_statuses``."""
    statement = (
        update(turns)
        .where(turns.c.id == turn_id, turns.c.status.in_(from_statuses))
        .values(**_ENDED)
        .returning(*_ENDED_RETURNING)
    )
    return _ended(conn.execute(statement, {"status": status, "error": error}).one_or_none())


def set_followup(conn: Connection, turn_id: int, followup: dict[str, Any]) -> bool:
    """Register the task message to send when the turn ends; False if it already ended."""
    statement = (
        update(turns)
        .where(turns.c.id == turn_id, turns.c.status.in_(ACTIVE))
        .values(followup=followup)
    )
    return conn.execute(statement).rowcount == 1


def due_followups(conn: Connection, *, limit: int) -> list[int]:
    """Ended turns whose follow-up is due: not taken for sending yet, or taken and not
    confirmed in time (oldest due first)."""
    query = (
        select(turns.c.id)
        .where(turns.c.followup_due_at <= db_now())
        .order_by(turns.c.followup_due_at)
        .limit(limit)
    )
    return list(conn.execute(query).scalars())


def claim_followup(conn: Connection, turn_id: int) -> dict[str, Any] | None:
    """Take a due follow-up for sending (it becomes due again later if not confirmed)."""
    statement = (
        update(turns)
        .where(turns.c.id == turn_id, turns.c.followup_due_at <= db_now())
        .values(followup_due_at=_RESEND_AT)
        .returning(turns.c.followup)
    )
    followup: dict[str, Any] | None = conn.execute(statement).scalar_one_or_none()
    return followup


def followup_sent(conn: Connection, turn_id: int) -> None:
    conn.execute(update(turns).where(turns.c.id == turn_id).values(followup_due_at=None))


def requeue_turn(conn: Connection, turn: TurnRecord) -> bool:
    """Put this attempt's running turn back to pending (for a fresh start or a continuation)."""
    statement = (
        update(turns)
        .where(
            turns.c.id == turn.id, turns.c.status == Status.RUNNING, turns.c.attempt == turn.attempt
        )
        .values(status=Status.PENDING)
    )
    return conn.execute(statement).rowcount == 1


def note_recovery(conn: Connection, turn_id: int, *, recoveries: int, at_seq: int) -> None:
    """Record a recovery attempt: the (possibly reset) count and the stream length it saw."""
    conn.execute(
        update(turns)
        .where(turns.c.id == turn_id)
        .values(recoveries=recoveries, recovered_at_seq=at_seq)
    )


def refresh_caller(conn: Connection, turn_id: int, *, ttl_s: float) -> None:
    """The blocking caller of ``turn_id`` is alive for another ``ttl_s`` (database clock)."""
    statement = (
        update(turns)
        .where(turns.c.id == turn_id)
        .values(caller_expires_at=db_now_plus(seconds_param("ttl_s")))
    )
    conn.execute(statement, {"ttl_s": ttl_s})


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
    """Newest first (``created_at``, then ``request_id``); ``before`` is a keyset cursor.

    Each status asked for is read newest first from its own range of
    ``ix_think_turns_status_listing`` (at most ``limit`` rows each) and the ranges are merged,
    so the cost follows ``limit``, not the agent's history: one scan of the agent's
    submissions filtered by status would read all of them to find a few pending ones.
    """
    wanted = list(dict.fromkeys(statuses)) if statuses is not None else []
    values: dict[str, Any] = {"agent_id": agent_id, "limit": limit}
    values.update({f"status_{index}": status for index, status in enumerate(wanted)})
    if before is not None:
        values.update(before_created=before.created_at, before_request=before.request_id)
    query = _listing(len(wanted), paged=before is not None)
    return [_record(row) for row in conn.execute(query, values)]


@cache
def _listing(statuses: int, *, paged: bool) -> Select[Any]:
    """The listing for ``statuses`` status values (0: any status), built once (SQLAlchemy
    takes milliseconds to build a union of subqueries of this table)."""
    ranges = [_newest(index if statuses else None, paged) for index in range(max(statuses, 1))]
    if len(ranges) == 1:
        return ranges[0]
    merged = union_all(*(select(part.subquery()) for part in ranges)).subquery()
    newest = merged.c.created_at.desc(), merged.c.request_id.desc()
    return select(merged).order_by(*newest).limit(bindparam("limit"))


def _newest(status: int | None, paged: bool) -> Select[Any]:
    """The agent's submissions (of the status bound as ``status_<status>``, if given), newest
    first, older than the cursor when ``paged``."""
    query = select(turns).where(
        turns.c.agent_id == bindparam("agent_id"), turns.c.kind == Kind.SUBMISSION
    )
    if status is not None:
        query = query.where(turns.c.status == bindparam(f"status_{status}"))
    if paged:
        created, request = turns.c.created_at, turns.c.request_id
        cursor = tuple_(
            bindparam("before_created", type_=created.type),
            bindparam("before_request", type_=request.type),
        )
        query = query.where(tuple_(created, request) < cursor)
    newest = turns.c.created_at.desc(), turns.c.request_id.desc()
    return query.order_by(*newest).limit(bindparam("limit"))


def delete_terminal_submission(conn: Connection, agent_id: int, submission_id: str) -> int | None:
    """Delete the submission iff it is terminal and its follow-up (a workflow step's next
    message) was sent; its row id, or None."""
    statement = (
        delete(turns)
        .where(
            turns.c.agent_id == agent_id,
            turns.c.request_id == submission_id,
            turns.c.kind == Kind.SUBMISSION,
            turns.c.status.in_(TERMINAL),
            _NOTHING_TO_SEND,
        )
        .returning(turns.c.id)
    )
    deleted: int | None = conn.execute(statement).scalar_one_or_none()
    return deleted


def delete_terminal_submissions(
    conn: Connection,
    agent_id: int,
    *,
    statuses: Sequence[str],
    completed_before: datetime | None,
    limit: int,
) -> dict[int, str]:
    """Delete up to ``limit`` terminal submissions whose follow-up was sent, oldest completed
    first; their row ids and request ids."""
    chosen = (
        select(turns.c.id)
        .where(
            turns.c.agent_id == agent_id,
            turns.c.kind == Kind.SUBMISSION,
            turns.c.status.in_([s for s in statuses if s in TERMINAL]),
            _NOTHING_TO_SEND,
        )
        .order_by(turns.c.completed_at, turns.c.id)
        .limit(limit)
    )
    if completed_before is not None:
        chosen = chosen.where(turns.c.completed_at < completed_before)
    ids = list(conn.execute(chosen).scalars())
    if not ids:
        return {}
    statement = (
        delete(turns)
        .where(turns.c.id.in_(ids), _NOTHING_TO_SEND)
        .returning(turns.c.id, turns.c.request_id)
    )
    return {row.id: row.request_id for row in conn.execute(statement)}


# A turn whose follow-up is still to send keeps its row: the message lives only there, and
# the sweeper sends it within ``FOLLOWUP_RESEND_AFTER_S`` (deleted first, a workflow's chain
# waited for good).
_NOTHING_TO_SEND = turns.c.followup_due_at.is_(None)
