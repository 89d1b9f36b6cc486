"""A turn's final write in one statement (PostgreSQL): the fence, the final status, the reply.

The transaction path (``engine.lease``: the fence statement, then ``turns.finish_turn`` and
the reply's upsert, then COMMIT) takes four round trips. Here the same three statements are
the parts of one, each run only when the fence matched:

- ``fenced``: the lease renewed (``agents.RENEW``) or given back (``agents.RELEASE``) iff its
  token is still ours; it locks the agent row, as the transaction's first statement does;
- ``finished``: the final status, iff the turn is still running this attempt
  (``turns.FINISH``: a status set meanwhile, such as a cancellation's, is never overwritten);
- ``reply``: the reply stored, replacing a partial one with the same id.

No part reads from the statement's snapshot: the fence and the status are re-checked on the
latest row versions when a lock was waited for, and the upsert's conflict is decided on the
latest rows. When the fence matches nothing, nothing is written (the lease was lost).
SQLite has no data-modifying CTE: it keeps the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    ClauseElement,
    ColumnElement,
    Connection,
    Select,
    String,
    Text,
    TextClause,
    TextualSelect,
    bindparam,
    cast,
    exists,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

from think_jobs.db import agents as agent_ops
from think_jobs.db import claim as claim_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.dialect import db_now
from think_jobs.db.tables import UTCDateTime, messages, turns
from think_jobs.db.turns import record_of_row
from think_jobs.domain.records import Ended, TurnRecord

_REPLY_COLUMNS = ("agent_id", "message_id", "role", "data", "turn_id")
# Each bound under a name no UPDATE of the statement has as a column: SQLAlchemy would SET it.
_REPLY_PARAMS = ("agent_row", "message_id", "role", "data", "turn_id")


@dataclass(frozen=True)
class FinalWritten:
    """The fence matched: the agent's admission count as it locked the row, the database's
    time (renewing only), and the turn's ending (None: a status was set meanwhile)."""

    admitted: int
    now: datetime | None
    ended: Ended | None


def _reply_upsert(matched: ColumnElement[bool] | TextClause, *, typed_binds: bool = True) -> Insert:
    """The reply stored iff ``matched``, replacing a partial one with the same id. Without
    ``typed_binds`` the parameters are left to the ``text()`` the statement becomes part of."""
    types = [messages.c[name].type for name in _REPLY_COLUMNS]
    values = [
        cast(bindparam(p, type_=t if typed_binds else None), t)
        for p, t in zip(_REPLY_PARAMS, types, strict=True)
    ]
    stored = insert(messages).from_select(
        [*_REPLY_COLUMNS, "created_at"], select(*values, db_now()).where(matched)
    )
    return stored.on_conflict_do_update(
        index_elements=["agent_id", "message_id"], set_={"data": stored.excluded.data}
    )


@cache
def _statement(*, releasing: bool, reply: bool) -> Select[Any]:
    fence = (agent_ops.RELEASE if releasing else agent_ops.RENEW).cte("fenced")
    matched = exists(select(fence.c.admitted))
    finished = turn_ops.FINISH.where(matched).cte("finished")
    parts: list[Any] = [finished]
    if reply:
        parts.append(_reply_upsert(matched).cte("reply"))
    now = fence.c.now if not releasing else None
    columns = [fence.c.admitted, *([now] if now is not None else [])]
    return (
        select(*columns, finished.c.completed_at, finished.c.followup)
        .select_from(fence.outerjoin(finished, true()))
        .add_cte(*parts)
    )


@dataclass(frozen=True)
class Ending:
    """What a final write stores, and the lease it goes through: ``reply`` is the reply in
    wire form, if it has content."""

    turn: TurnRecord
    token: str
    ttl_s: float
    status: str
    error: str | None
    reply: dict[str, Any] | None

    def values(self) -> dict[str, Any]:
        """The statement's parameters."""
        turn, reply = self.turn, self.reply
        values: dict[str, Any] = {
            "agent_row": turn.agent_id,
            "token": self.token,
            "ttl_s": self.ttl_s,
            "turn_id": turn.id,
            "current_attempt": turn.attempt,
            "status": self.status,
            "error": self.error,
        }
        if reply is not None:
            values.update(message_id=reply["id"], role=reply["role"], data=reply)
        return values


def write_final(conn: Connection, ending: Ending, releasing: bool) -> FinalWritten | None:
    """The final write of ``ending.turn`` in one statement (``conn`` in autocommit,
    PostgreSQL); None when the lease was not ours any more (nothing written)."""
    statement = _statement(releasing=releasing, reply=ending.reply is not None)
    row = conn.execute(statement, ending.values()).one_or_none()
    if row is None:
        return None
    fields = row._mapping
    return _written(
        fields["admitted"], fields.get("now"), fields["completed_at"], fields["followup"]
    )


def _written(admitted: int, now: datetime | None, completed_at: Any, followup: Any) -> FinalWritten:
    """What the fence locked and the turn's ending (no ``completed_at``: a status set
    meanwhile was kept)."""
    ended = None if completed_at is None else Ended(completed_at, followup)
    return FinalWritten(int(admitted), now, ended)


# -- the final write that also claims the next turn -------------------------------------------
#
# A drain that keeps the lease for the agent's next turn, of an agent with no hook to run after
# the final write, claims that turn in the final write's statement (``db.claim``'s parts):
#
# - ``leased``: the fence (``agents.RENEW``), which locks the agent row;
# - ``finished`` and ``reply``: as above;
# - ``fresh``: the head of the statement's snapshot once this turn is set aside, if it is a
#   submission the one-statement claim can start — only when the snapshot saw every admission
#   (the agent's ``admitted`` in the snapshot is the one the fence locked: admissions bump it;
#   nobody else claims or releases while we hold the lease) and only when this turn ended here;
# - ``started`` and ``applied``: as in ``db.claim``; the applied messages are inserted after
#   the reply (they wait for it), so that the reply comes first in the conversation;
# - the conversation the next turn's model sees: the snapshot's rows with the reply in place
#   of a partial one it replaced, then the applied messages.
#
# Anything else (another kind of head, a concurrent admission, a status set meanwhile) starts
# nothing here: the caller claims the next turn on its own, under the lease it still holds.

# Fragments compiled in the ``:name`` style ``text()`` reads, with no casts after the names.
_NAMED: Dialect = PGDialect(paramstyle="named")  # type: ignore[no-untyped-call]
_GATE = text("EXISTS (SELECT 1 FROM leased)")
_SNAPSHOT_SAW_EVERY_ADMISSION = """
      AND (SELECT admitted FROM think_agents WHERE id = :agent_id) = (SELECT admitted FROM leased)
      AND EXISTS (SELECT 1 FROM finished)"""
_AFTER_THE_REPLY = "WHERE (SELECT count(*) FROM reply) >= 0\n    "  # the reply first
_WITHOUT_REPLACED = (
    f"{claim_ops.SNAPSHOT_ROWS} AND id NOT IN (SELECT id FROM reply)"
    " UNION ALL SELECT id, data FROM reply"
)
_CLAIMING_TYPES: dict[str, TypeEngine[Any]] = {
    "final_admitted": BigInteger(),
    "final_now": UTCDateTime(),
    "final_completed_at": UTCDateTime(),
    "final_followup": turns.c.followup.type,
    "claim_history": Text(),
}


def _fragment(element: ClauseElement) -> tuple[str, dict[str, Any]]:
    """A Core statement as SQL text, and the values it bound itself (its literals)."""
    compiled = element.compile(dialect=_NAMED)
    literals = {name: value for name, value in compiled.params.items() if value is not None}
    return str(compiled), literals


@cache
def _claiming_statement(*, reply: bool) -> TextualSelect:
    fence, literals = _fragment(agent_ops.RENEW)
    finish, more = _fragment(turn_ops.FINISH.where(_GATE))
    literals.update(more)
    parts = [f"leased AS ({fence})", f"finished AS ({finish})"]
    stored, after = claim_ops.SNAPSHOT_ROWS, ""
    if reply:
        upsert, more = _fragment(
            _reply_upsert(_GATE, typed_binds=False).returning(messages.c.id, messages.c.data)
        )
        literals.update(more)
        parts.append(f"reply AS ({upsert})")
        stored, after = _WITHOUT_REPLACED, _AFTER_THE_REPLY
    parts.append(
        claim_ops.fresh_cte(not_ending=" AND id <> :turn_id", guard=_SNAPSHOT_SAW_EVERY_ADMISSION)
    )
    parts.append(claim_ops.STARTED.format(after=after))
    history = claim_ops.HISTORY.format(stored=stored)
    sql = f"""WITH {", ".join(parts)}
SELECT {claim_ops.TURN_COLUMNS}, l.admitted AS final_admitted, l.now AS final_now,
    f.completed_at AS final_completed_at, f.followup AS final_followup,
    CASE WHEN s.id IS NULL THEN NULL ELSE {history} END AS claim_history
FROM leased AS l LEFT JOIN finished AS f ON true LEFT JOIN started AS s ON true"""
    values = [bindparam(name, value=str(value), type_=String()) for name, value in literals.items()]
    data = bindparam("data", type_=messages.c.data.type)
    clause = text(sql).bindparams(*values, *([data] if reply else []))
    return claim_ops.with_turn_columns(clause, _CLAIMING_TYPES)


def write_final_and_claim(
    conn: Connection, ending: Ending, assistant_message_id: str
) -> tuple[FinalWritten, claim_ops.FreshClaim | None] | None:
    """``write_final`` renewing the lease, and the agent's next turn claimed in the same
    statement when it can be (see above): the write, and the claim (None: nothing started).
    None when the lease was not ours any more (nothing written)."""
    values = {
        **ending.values(),
        "agent_id": ending.turn.agent_id,
        "new_message_id": assistant_message_id,
    }
    statement = _claiming_statement(reply=ending.reply is not None)
    row = conn.execute(statement, values).one_or_none()
    if row is None:
        return None
    fields = row._mapping
    admitted, now = int(fields["final_admitted"]), fields["final_now"]
    written = _written(admitted, now, fields["final_completed_at"], fields["final_followup"])
    if fields["id"] is None:
        return written, None
    next_turn = record_of_row({column.name: fields[column.name] for column in turns.c})
    return written, claim_ops.FreshClaim(admitted, now, next_turn, fields["claim_history"])
