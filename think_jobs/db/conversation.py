"""Named operations on ``think_messages``: an agent's conversation in order."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Text, bindparam, cast, delete, select, update

from think_jobs.db.dialect import insert_ignoring_conflicts, upsert
from think_jobs.db.tables import messages


def append_messages(
    conn: Connection,
    agent_id: int,
    wire_messages: Sequence[dict[str, Any]],
    *,
    turn_id: int | None,
    now: datetime,
) -> None:
    """Append messages (AI SDK JSON); a message whose id is already stored is a no-op."""
    rows = [
        {
            "agent_id": agent_id,
            "message_id": message["id"],
            "role": message["role"],
            "data": message,
            "turn_id": turn_id,
            "created_at": now,
        }
        for message in wire_messages
    ]
    if rows:
        conn.execute(insert_ignoring_conflicts(conn, messages), rows)


def upsert_message(
    conn: Connection,
    agent_id: int,
    wire_message: dict[str, Any],
    *,
    turn_id: int | None,
    now: datetime,
) -> None:
    """Store a message, replacing the stored one with the same id (a continued reply)."""
    values = {
        "agent_id": agent_id,
        "message_id": wire_message["id"],
        "role": wire_message["role"],
        "data": wire_message,
        "turn_id": turn_id,
        "created_at": now,
    }
    upsert(conn, messages, values, keys=("agent_id", "message_id"), update=("data",))


_LOAD_JSON = (
    select(cast(messages.c.data, Text))
    .where(messages.c.agent_id == bindparam("agent_id"))
    .order_by(messages.c.id)
)


def load_messages_json(conn: Connection, agent_id: int) -> str:
    """The conversation as one JSON array (text): validated in one pass by the caller."""
    rows = conn.execute(_LOAD_JSON, {"agent_id": agent_id}).scalars()
    return "[" + ",".join(rows) + "]"


def last_message(conn: Connection, agent_id: int) -> dict[str, Any] | None:
    query = (
        select(messages.c.data)
        .where(messages.c.agent_id == agent_id)
        .order_by(messages.c.id.desc())
        .limit(1)
    )
    return conn.execute(query).scalar_one_or_none()


def delete_last_reply(conn: Connection, agent_id: int) -> str | None:
    """Delete the conversation's last message if it is an assistant message; its id."""
    last = conn.execute(
        select(messages.c.id, messages.c.message_id, messages.c.role)
        .where(messages.c.agent_id == agent_id)
        .order_by(messages.c.id.desc())
        .limit(1)
    ).one_or_none()
    if last is None or last.role != "assistant":
        return None
    conn.execute(delete(messages).where(messages.c.id == last.id))
    message_id: str = last.message_id
    return message_id


def delete_conversation(conn: Connection, agent_id: int) -> int:
    return conn.execute(delete(messages).where(messages.c.agent_id == agent_id)).rowcount


# -- operator repairs (think_jobs.engine.repair): rows read as text, nothing parsed on the way --

_ROWS_JSON = (
    select(messages.c.message_id, cast(messages.c.data, Text))
    .where(messages.c.agent_id == bindparam("agent_id"))
    .order_by(messages.c.id)
)


def message_rows_json(conn: Connection, agent_id: int) -> list[tuple[str, str]]:
    """``(message id, JSON text)`` of every stored message of the agent, in order."""
    rows = conn.execute(_ROWS_JSON, {"agent_id": agent_id})
    return [(message_id, text) for message_id, text in rows]


def message_json(conn: Connection, agent_id: int, message_id: str) -> str | None:
    """One stored message as JSON text (None: no such message)."""
    query = select(cast(messages.c.data, Text)).where(
        messages.c.agent_id == agent_id, messages.c.message_id == message_id
    )
    return conn.execute(query).scalar_one_or_none()


def delete_message(conn: Connection, agent_id: int, message_id: str) -> bool:
    """Remove one message from the conversation; False if there was none with that id."""
    statement = delete(messages).where(
        messages.c.agent_id == agent_id, messages.c.message_id == message_id
    )
    return conn.execute(statement).rowcount > 0


def replace_message(
    conn: Connection, agent_id: int, message_id: str, wire_message: dict[str, Any]
) -> bool:
    """Overwrite a stored message's data in place (its position is kept)."""
    statement = (
        update(messages)
        .where(messages.c.agent_id == agent_id, messages.c.message_id == message_id)
        .values(data=wire_message)
    )
    return conn.execute(statement).rowcount > 0
