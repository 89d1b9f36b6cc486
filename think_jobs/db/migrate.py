"""Apply the package's Alembic migrations (``think-jobs db upgrade`` / ``jobs.migrate()``).

Alembic is imported when a migration is read or applied, not with the package: it brings
Mako and Pygments, a sixth of what every worker, web process and CLI command imported at
start for a step most of them never take.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, text

from think_jobs.db.engine import Database
from think_jobs.db.tables import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(database: Database) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    return config


# The key of the advisory lock an upgrade of a PostgreSQL database holds ("thinkjob"), and
# how often an upgrader that found it taken asks again.
UPGRADE_LOCK = 0x7468696E6B6A6F62
_LOCK_POLL_S = 0.2


def upgrade(database: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision``.

    PostgreSQL: one transaction per migration, an index built outside any (``build_index``:
    ``CONCURRENTLY``, so that writes to its table go on meanwhile), all while this session
    holds an advisory lock another upgrader waits for (machines deployed at once apply each
    migration once; the later ones find the schema current). SQLite, and PostgreSQL behind a
    pooler in transaction mode (a session's lock would stay with whichever server session
    the pooler chose): every migration in one transaction, indexes built inside it."""
    from alembic import command

    config = alembic_config(database)
    if database.dialect != "postgresql" or database.pooler == "transaction":
        with database.write() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
        return
    with database.session() as conn:
        _lock_upgrades(conn)
        try:
            config.attributes["connection"] = conn
            config.attributes["transaction_per_migration"] = True
            command.upgrade(config, revision)
        except BaseException:
            conn.invalidate()  # the session ends, and its lock with it
            raise
        conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": UPGRADE_LOCK})
        conn.commit()


def _lock_upgrades(conn: Connection) -> None:
    """Take the upgrade lock, asking again until it is free; no transaction stays open while
    this session waits (``CREATE INDEX CONCURRENTLY`` in the upgrade holding it waits for
    every transaction older than its build, so one waiting on the lock deadlocks it)."""
    lock = text("SELECT pg_try_advisory_lock(:key)")
    while True:
        taken = bool(conn.execute(lock, {"key": UPGRADE_LOCK}).scalar_one())
        conn.commit()
        if taken:
            return
        time.sleep(_LOCK_POLL_S)


def build_index(name: str, table: str, columns: list[str], *, where: str | None = None) -> None:
    """Create an index, from a migration. When the upgrade runs one transaction per migration
    (PostgreSQL, ``upgrade``): ``CREATE INDEX CONCURRENTLY`` outside any transaction, so that
    writes to ``table`` go on while it is built, after dropping what an interrupted build of
    it left (an index PostgreSQL marks invalid); an index built before the upgrade could
    record it is kept. Otherwise a plain ``CREATE INDEX`` in the migration's transaction."""
    from alembic import op

    predicate = None if where is None else text(where)
    context = op.get_context()
    if not context.opts.get("transaction_per_migration"):
        op.create_index(name, table, columns, postgresql_where=predicate, sqlite_where=predicate)
        return
    with context.autocommit_block():
        if _invalid_index(op.get_bind(), name):
            op.drop_index(name, table_name=table, postgresql_concurrently=True)
        op.create_index(
            name,
            table,
            columns,
            postgresql_where=predicate,
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def rebuild_index(name: str, table: str, columns: list[str]) -> None:
    """Replace the index ``name`` with one on ``columns``, from a migration: as
    ``build_index`` builds one, under a second name, then the old one dropped
    (``CONCURRENTLY``) and the new one renamed, when the upgrade runs one transaction per
    migration; otherwise dropped and created in the migration's transaction. Repeating it
    after an interruption ends with the index on ``columns`` either way."""
    from alembic import op

    if not op.get_context().opts.get("transaction_per_migration"):
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns)
        return
    rebuilt = f"{name}_rebuilt"
    build_index(rebuilt, table, columns)
    with op.get_context().autocommit_block():
        op.drop_index(name, table_name=table, postgresql_concurrently=True, if_exists=True)
        op.execute(f'ALTER INDEX "{rebuilt}" RENAME TO "{name}"')


def _invalid_index(conn: Connection, name: str) -> bool:
    query = text(
        "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = :name AND pg_table_is_visible(c.oid)"
    )
    return bool(conn.execute(query, {"name": name}).scalar())


def current_revision(database: Database) -> str | None:
    """The applied revision, or None on an empty database."""
    from alembic.runtime.migration import MigrationContext

    with database.read() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()
