"""A submission listing filtered by status reads its rows in order from one index range.

``ix_think_turns_status_listing`` gains ``request_id``, the listing's tie-breaker, so that
``list_submissions(status=...)`` finds each status's newest rows in index order instead of
sorting them (SQLite then preferred scanning every submission of the agent; see
``db.turns.list_submissions``). On SQLite rebuilding the index locks ``think_turns`` against
writes for as long as it takes (seconds per million rows); on PostgreSQL it is built
``CONCURRENTLY`` beside the old one, then takes its name (since 2026-12-07:
``migrate.rebuild_index``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

from think_jobs.db.migrate import rebuild_index

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_NAME = "ix_think_turns_status_listing"
_BEFORE = ["agent_id", "kind", "status", "created_at"]


def upgrade() -> None:
    rebuild_index(_NAME, "think_turns", [*_BEFORE, "request_id"])


def downgrade() -> None:
    op.drop_index(_NAME, table_name="think_turns")
    op.create_index(_NAME, "think_turns", _BEFORE)
