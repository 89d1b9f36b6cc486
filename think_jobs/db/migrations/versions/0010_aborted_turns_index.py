"""Cancelled turns by when they ended: a partial index of the aborted turns' ``completed_at``.

The sweeper looks there for an agent whose running turn was cancelled while its attempt was
dead and which got no further turn, so that the attempt's streamed partial is stored even
then (``agents.agents_with_a_lapsed_cancel``). Only aborted turns are indexed. On PostgreSQL
the index is built ``CONCURRENTLY`` (since 2026-12-07: ``migrate.build_index``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

from think_jobs.db.migrate import build_index

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_ABORTED = "status = 'aborted'"  # db.tables.ABORTED_TURNS as of this revision


def upgrade() -> None:
    build_index("ix_think_turns_aborted", "think_turns", ["completed_at"], where=_ABORTED)


def downgrade() -> None:
    op.drop_index("ix_think_turns_aborted", table_name="think_turns")
