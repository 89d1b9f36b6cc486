"""Turn ids are never reused on SQLite: ``think_turns.id`` becomes ``AUTOINCREMENT``.

A turn's id names its stream, its state and its revocation flag in Redis. Without
``AUTOINCREMENT`` SQLite gives a new row the largest id in the table plus one, so a turn
admitted after the newest one was deleted got the deleted turn's id, and with it whatever of
that turn Redis still held (its stream ended or sealed, its revocation flag): the new turn's
stream could show the old one's events, or end before it began. PostgreSQL's ids come from a
sequence and are never reused: nothing changes there.

On SQLite the table is rebuilt (copied into a new one with the same columns, constraints and
indexes; the copy holds the database's write lock for as long as it takes, about a second per
few hundred thousand turns). From then on ids only grow, starting after the largest id the
table holds.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    _rebuild(autoincrement=True)


def downgrade() -> None:
    _rebuild(autoincrement=False)


def _rebuild(*, autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    options = {"sqlite_autoincrement": autoincrement}
    with op.batch_alter_table("think_turns", recreate="always", table_kwargs=options):
        pass
