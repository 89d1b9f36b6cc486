"""The schema. Alembic migrations in ``migrations/`` own it; this module mirrors it for queries.

Four tables:

- ``think_agents``: one row per agent (type + name). It carries the admission counter that
  numbers turns (``admitted``) and the execution lease (``lease_token``/``lease_expires_at``):
  at most one process holds an agent's lease, and only the holder runs a turn.
- ``think_turns``: every admitted turn, durable submissions and blocking calls alike, in
  admission order (``seq`` per agent). Ordering is a property of this table: the next turn of
  an agent is its lowest ``seq`` that is pending or running.
- ``think_messages``: the conversation, in insertion order (``id``), unique per message id.
- ``think_approvals``: tool calls waiting for (or answered by) a human; each names the turn
  whose model made the call and the continuation turn that goes on once all are answered.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

VERSION_TABLE = "think_jobs_alembic_version"
ID = BigInteger().with_variant(Integer(), "sqlite")

# The rows of the partial index of cancelled (aborted) turns, ``ix_think_turns_aborted``: few,
# so indexing them costs nothing on the common path. A literal (``Status.ABORTED``), so that a
# query spelling the same predicate uses the index under a generic plan too.
ABORTED_TURNS = "status = 'aborted'"


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, on SQLite (naive text) and PostgreSQL (timestamptz)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("datetimes stored by think-jobs must be timezone-aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class AgentRow(Base):
    __tablename__ = "think_agents"
    __table_args__ = (UniqueConstraint("agent_type", "agent_name", name="uq_think_agents_name"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    agent_type: Mapped[str] = mapped_column(String(200))
    agent_name: Mapped[str] = mapped_column(String(200))
    admitted: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None]
    last_body: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]


class TurnRow(Base):
    __tablename__ = "think_turns"
    __table_args__ = (
        UniqueConstraint("agent_id", "seq", name="uq_think_turns_seq"),
        UniqueConstraint("agent_id", "request_id", name="uq_think_turns_request"),
        UniqueConstraint("agent_id", "idempotency_key", name="uq_think_turns_idempotency"),
        Index("ix_think_turns_queue", "agent_id", "status", "seq"),
        Index("ix_think_turns_listing", "agent_id", "kind", "created_at", "request_id"),
        Index(
            "ix_think_turns_status_listing",
            *("agent_id", "kind", "status", "created_at", "request_id"),
        ),
        Index("ix_think_turns_completed", "agent_id", "kind", "completed_at"),
        Index("ix_think_turns_status", "status", "agent_id"),
        Index("ix_think_turns_finished", "completed_at"),
        Index("ix_think_turns_followup_due", "followup_due_at"),
        Index(
            "ix_think_turns_aborted",
            "completed_at",
            postgresql_where=text(ABORTED_TURNS),
            sqlite_where=text(ABORTED_TURNS),
        ),
        # a deleted turn's id is never given to a new turn: it names the turn's keys in Redis
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("think_agents.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(BigInteger)
    request_id: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))
    trigger: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    idempotency_key: Mapped[str | None] = mapped_column(String(512))
    messages: Mapped[list[Any] | None] = mapped_column(JSON)
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    body: Mapped[dict[str, Any] | None]
    continuation: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    recoveries: Mapped[int] = mapped_column(Integer, default=0)
    recovered_at_seq: Mapped[int | None] = mapped_column(BigInteger)
    assistant_message_id: Mapped[str | None] = mapped_column(String(255))
    messages_applied: Mapped[bool] = mapped_column(Boolean, default=False)
    caller_expires_at: Mapped[datetime | None]
    trace_context: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    followup: Mapped[dict[str, Any] | None]
    followup_due_at: Mapped[datetime | None]
    awaiting_approval: Mapped[bool] = mapped_column(Boolean, default=False)
    extends: Mapped[dict[str, Any] | None]


class MessageRow(Base):
    __tablename__ = "think_messages"
    __table_args__ = (
        UniqueConstraint("agent_id", "message_id", name="uq_think_messages_id"),
        Index("ix_think_messages_agent", "agent_id", "id"),
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("think_agents.id", ondelete="CASCADE"))
    message_id: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    turn_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime]


class ApprovalRow(Base):
    __tablename__ = "think_approvals"
    __table_args__ = (
        UniqueConstraint("approval_id", name="uq_think_approvals_id"),
        Index("ix_think_approvals_agent", "agent_id", "status", "created_at"),
        Index("ix_think_approvals_open", "status", "created_at"),
        Index("ix_think_approvals_continuation", "continuation_turn_id"),
        Index("ix_think_approvals_turn", "turn_id"),
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    approval_id: Mapped[str] = mapped_column(String(64))
    agent_id: Mapped[int] = mapped_column(ForeignKey("think_agents.id", ondelete="CASCADE"))
    turn_id: Mapped[int] = mapped_column(BigInteger)
    request_id: Mapped[str] = mapped_column(String(255))
    continuation_turn_id: Mapped[int] = mapped_column(BigInteger)
    continuation_id: Mapped[str] = mapped_column(String(255))
    tool_name: Mapped[str] = mapped_column(String(255))
    tool_call_id: Mapped[str] = mapped_column(String(255))
    input: Mapped[Any] = mapped_column(JSON, nullable=True)  # a tool call may have none
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]


agents = cast(Table, AgentRow.__table__)
turns = cast(Table, TurnRow.__table__)
messages = cast(Table, MessageRow.__table__)
approvals = cast(Table, ApprovalRow.__table__)
