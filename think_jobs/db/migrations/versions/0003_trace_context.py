"""Turns carry the W3C trace context of the call that admitted them; idempotency keys may be
up to 512 characters (schedule keys embed the agent type, name and task id).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("think_turns") as batch:
        batch.add_column(sa.Column("trace_context", sa.JSON()))
        batch.alter_column("idempotency_key", type_=sa.String(512), existing_type=sa.String(255))


def downgrade() -> None:
    with op.batch_alter_table("think_turns") as batch:
        batch.drop_column("trace_context")
        batch.alter_column("idempotency_key", type_=sa.String(255), existing_type=sa.String(512))
