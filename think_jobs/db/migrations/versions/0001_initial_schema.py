"""Initial schema: agents (admission counter + lease), turns (the queue), messages.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "think_agents",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("agent_type", sa.String(200), nullable=False),
        sa.Column("agent_name", sa.String(200), nullable=False),
        sa.Column("admitted", sa.BigInteger(), nullable=False),
        sa.Column("lease_token", sa.String(64)),
        sa.Column("lease_expires_at", WHEN),
        sa.Column("last_body", sa.JSON()),
        sa.Column("created_at", WHEN, nullable=False),
        sa.UniqueConstraint("agent_type", "agent_name", name="uq_think_agents_name"),
    )
    op.create_table(
        "think_turns",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column(
            "agent_id", ID, sa.ForeignKey("think_agents.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("idempotency_key", sa.String(255)),
        sa.Column("messages", sa.JSON()),
        sa.Column("metadata", sa.JSON()),
        sa.Column("body", sa.JSON()),
        sa.Column("continuation", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("recoveries", sa.Integer(), nullable=False),
        sa.Column("recovered_at_seq", sa.BigInteger()),
        sa.Column("assistant_message_id", sa.String(255)),
        sa.Column("messages_applied", sa.Boolean(), nullable=False),
        sa.Column("caller_expires_at", WHEN),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("started_at", WHEN),
        sa.Column("completed_at", WHEN),
        sa.UniqueConstraint("agent_id", "seq", name="uq_think_turns_seq"),
        sa.UniqueConstraint("agent_id", "request_id", name="uq_think_turns_request"),
        sa.UniqueConstraint("agent_id", "idempotency_key", name="uq_think_turns_idempotency"),
    )
    op.create_index("ix_think_turns_queue", "think_turns", ["agent_id", "status", "seq"])
    op.create_index(
        "ix_think_turns_listing", "think_turns", ["agent_id", "kind", "created_at", "request_id"]
    )
    op.create_index(
        "ix_think_turns_status_listing",
        "think_turns",
        ["agent_id", "kind", "status", "created_at"],
    )
    op.create_index("ix_think_turns_completed", "think_turns", ["agent_id", "kind", "completed_at"])
    op.create_index("ix_think_turns_status", "think_turns", ["status", "agent_id"])
    op.create_table(
        "think_messages",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column(
            "agent_id", ID, sa.ForeignKey("think_agents.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("message_id", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("turn_id", sa.BigInteger()),
        sa.Column("created_at", WHEN, nullable=False),
        sa.UniqueConstraint("agent_id", "message_id", name="uq_think_messages_id"),
    )
    op.create_index("ix_think_messages_agent", "think_messages", ["agent_id", "id"])


def downgrade() -> None:
    op.drop_table("think_messages")
    op.drop_table("think_turns")
    op.drop_table("think_agents")
