"""Scheduled tasks: one row per (agent, task) holding the next occurrence beat will fire.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "think_schedules",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column(
            "agent_id", ID, sa.ForeignKey("think_agents.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("schedule", sa.String(255), nullable=False),
        sa.Column("timezone", sa.String(64)),
        sa.Column("next_run_at", WHEN, nullable=False),
        sa.Column("last_scheduled_for", WHEN),
        sa.Column("last_fired_at", WHEN),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("updated_at", WHEN, nullable=False),
        sa.UniqueConstraint("agent_id", "task_id", name="uq_think_schedules_task"),
    )
    op.create_index("ix_think_schedules_due", "think_schedules", ["next_run_at"])


def downgrade() -> None:
    op.drop_index("ix_think_schedules_due", table_name="think_schedules")
    op.drop_table("think_schedules")
