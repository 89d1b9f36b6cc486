"""Turns finished since a moment, across agents, by completed_at (the admin dashboard).

On PostgreSQL the index is built ``CONCURRENTLY`` (since 2026-12-07: ``migrate.build_index``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from think_jobs.db.migrate import build_index

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    build_index("ix_think_turns_finished", "think_turns", ["completed_at"])


def downgrade() -> None:
    op.drop_index("ix_think_turns_finished", table_name="think_turns")
