"""Tool calls that wait for a human: ``think_approvals``, and the continuation turn that holds
the agent's place in line until they are answered (``think_turns.awaiting_approval``) with the
reply it extends (``think_turns.extends``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("think_turns") as batch:
        batch.add_column(
            sa.Column("awaiting_approval", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("extends", sa.JSON()))
    op.create_table(
        "think_approvals",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("approval_id", sa.String(64), nullable=False),
        sa.Column(
            "agent_id",
            _ID,
            sa.ForeignKey("think_agents.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("turn_id", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.String(255), nullable=False),
        sa.Column("continuation_turn_id", sa.BigInteger(), nullable=False),
        sa.Column("continuation_id", sa.String(255), nullable=False),
        sa.Column("tool_name", sa.String(255), nullable=False),
        sa.Column("tool_call_id", sa.String(255), nullable=False),
        sa.Column("input", sa.JSON()),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("approval_id", name="uq_think_approvals_id"),
    )
    op.create_index(
        "ix_think_approvals_agent", "think_approvals", ["agent_id", "status", "created_at"]
    )
    op.create_index("ix_think_approvals_open", "think_approvals", ["status", "created_at"])
    op.create_index("ix_think_approvals_continuation", "think_approvals", ["continuation_turn_id"])
    op.create_index("ix_think_approvals_turn", "think_approvals", ["turn_id"])


def downgrade() -> None:
    op.drop_table("think_approvals")
    with op.batch_alter_table("think_turns") as batch:
        batch.drop_column("extends")
        batch.drop_column("awaiting_approval")
