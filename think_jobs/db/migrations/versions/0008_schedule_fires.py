"""Claimed occurrences kept until fired: ``think_schedule_fires``.

Beat inserts a row with each claim and a worker deletes it once the occurrence has its
outcome; beat sends again what is still there past ``resend_at`` (``db.schedules``). An empty
table is all an upgrade needs: occurrences claimed before it fire as they did.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "think_schedule_fires",
        sa.Column(
            "schedule_id",
            ID,
            sa.ForeignKey("think_schedules.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("due_at", WHEN, primary_key=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("resend_at", WHEN, nullable=False),
    )
    op.create_index("ix_think_schedule_fires_resend", "think_schedule_fires", ["resend_at"])


def downgrade() -> None:
    op.drop_index("ix_think_schedule_fires_resend", table_name="think_schedule_fires")
    op.drop_table("think_schedule_fires")
