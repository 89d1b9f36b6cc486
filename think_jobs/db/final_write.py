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

from sqlalchemy import Connection, Select, bindparam, cast, exists, select, true
from sqlalchemy.dialects.postgresql import insert

from think_jobs.db import agents as agent_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.dialect import db_now
from think_jobs.db.tables import messages
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


@cache
def _statement(*, releasing: bool, reply: bool) -> Select[Any]:
    fence = (agent_ops.RELEASE if releasing else agent_ops.RENEW).cte("fenced")
    matched = exists(select(fence.c.admitted))
    finished = turn_ops.FINISH.where(matched).cte("finished")
    parts: list[Any] = [finished]
    if reply:
        types = [messages.c[name].type for name in _REPLY_COLUMNS]
        values = [cast(bindparam(p, type_=t), t) for p, t in zip(_REPLY_PARAMS, types, strict=True)]
        stored = insert(messages).from_select(
            [*_REPLY_COLUMNS, "created_at"], select(*values, db_now()).where(matched)
        )
        upsert = stored.on_conflict_do_update(
            index_elements=["agent_id", "message_id"], set_={"data": stored.excluded.data}
        )
        parts.append(upsert.cte("reply"))
    now = fence.c.now if not releasing else None
    columns = [fence.c.admitted, *([now] if now is not None else [])]
    return (
        select(*columns, finished.c.completed_at, finished.c.followup)
        .select_from(fence.outerjoin(finished, true()))
        .add_cte(*parts)
    )


def write_final(
    conn: Connection,
    turn: TurnRecord,
    *,
    token: str,
    ttl_s: float,
    status: str,
    error: str | None,
    reply: dict[str, Any] | None,
    releasing: bool,
) -> FinalWritten | None:
    """The final write of ``turn`` in one statement (``conn`` in autocommit, PostgreSQL);
    None when the lease was not ours any more (nothing written). ``reply``: the reply in
    wire form, if it has content."""
    values: dict[str, Any] = {
        "agent_row": turn.agent_id,
        "token": token,
        "ttl_s": ttl_s,
        "turn_id": turn.id,
        "current_attempt": turn.attempt,
        "status": status,
        "error": error,
    }
    if reply is not None:
        values.update(message_id=reply["id"], role=reply["role"], data=reply)
    statement = _statement(releasing=releasing, reply=reply is not None)
    row = conn.execute(statement, values).one_or_none()
    if row is None:
        return None
    fields = row._mapping
    ended = None if fields["completed_at"] is None else Ended(row.completed_at, row.followup)
    return FinalWritten(int(fields["admitted"]), fields.get("now"), ended)
