"""Alembic environment for think-jobs' own tables (version table: think_jobs_alembic_version)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

import think_jobs.db.schedules  # noqa: F401  (registers think_schedules on Base.metadata)
from think_jobs.db.tables import VERSION_TABLE, Base


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,
        version_table=VERSION_TABLE,
        compare_type=True,
        # PostgreSQL, from ``migrate.upgrade``: each migration commits by itself, so that an
        # index can be built outside any transaction (``migrate.build_index``).
        transaction_per_migration=context.config.attributes.get("transaction_per_migration", False),
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)


_main()
