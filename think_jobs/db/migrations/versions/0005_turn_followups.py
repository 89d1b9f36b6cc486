"""A turn may carry a follow-up: a Celery task message sent once the turn ends (a workflow
step waiting on the turn), and when it is due to be (re)sent.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("think_turns") as batch:
        batch.add_column(sa.Column("followup", sa.JSON()))
        batch.add_column(sa.Column("followup_due_at", sa.DateTime(timezone=True)))
    op.create_index("ix_think_turns_followup_due", "think_turns", ["followup_due_at"])


def downgrade() -> None:
    op.drop_index("ix_think_turns_followup_due", table_name="think_turns")
    with op.batch_alter_table("think_turns") as batch:
        batch.drop_column("followup_due_at")
        batch.drop_column("followup")
