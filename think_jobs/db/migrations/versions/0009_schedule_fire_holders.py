"""Who fires a kept occurrence: ``think_schedule_fires.run_token``.

A worker takes a kept occurrence by writing its token and holds it while it fires
(``engine.fire_holds``); beat clears the token when it sends an occurrence again after a
hold lapsed. Rows kept before this revision have no holder: the first worker to get their
message takes them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("think_schedule_fires") as batch:
        batch.add_column(sa.Column("run_token", sa.String(36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("think_schedule_fires") as batch:
        batch.drop_column("run_token")
