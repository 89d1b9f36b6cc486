"""Apply the package's Alembic migrations (``think-jobs db upgrade`` / ``jobs.migrate()``).

Alembic is imported when a migration is read or applied, not with the package: it brings
Mako and Pygments, a sixth of what every worker, web process and CLI command imported at
start for a step most of them never take.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

from think_jobs.db.engine import Database
from think_jobs.db.tables import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(database: Database) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    return config


# The key of the advisory lock an upgrade of a PostgreSQL database holds ("thinkjob"), how
# often an upgrader that found it taken asks again, and how often it says it still waits.
UPGRADE_LOCK = 0x7468696E6B6A6F62
_LOCK_POLL_S = 0.2
_WAIT_LOG_S = 30.0
_HOLDER = text(
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
    "AND classid = CAST(:high AS oid) AND objid = CAST(:low AS oid) "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


@dataclass(frozen=True)
class Upgraded:
    """The revision an upgrade found (None: an empty database) and the one it left, both read
    while it held the lock: an upgrader that waited for another finds the schema current."""

    before: str | None
    after: str | None


def upgrade(database: Database, revision: str = "head") -> Upgraded:
    """Bring the schema to ``revision``, one upgrader of a PostgreSQL database at a time
    (an advisory lock; machines deployed at once apply each migration once, the later ones
    find the schema current).

    PostgreSQL: one transaction per migration, an index built outside any (``build_index``:
    ``CONCURRENTLY``, so that writes to its table go on meanwhile), while this session holds
    the lock. Behind a pooler in transaction mode (a session's lock would stay with whichever
    server session the pooler chose), and on SQLite: every migration in one transaction,
    indexes built inside it (on PostgreSQL under the transaction's own lock)."""

    config = alembic_config(database)
    if database.dialect != "postgresql":
        with database.write() as conn:
            return _upgrade_on(conn, config, revision)
    if database.pooler == "transaction":
        return _upgrade_in_one_transaction(database, config, revision)
    with database.session() as conn:
        unlocked = False
        try:
            waiting = _Waiting()
            while not _try(conn, "pg_try_advisory_lock", commit=True):
                waiting.wait(conn)
            config.attributes["transaction_per_migration"] = True
            upgraded = _upgrade_on(conn, config, revision)
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": UPGRADE_LOCK})
            conn.commit()
            unlocked = True
        finally:
            if not unlocked:
                conn.invalidate()  # the session ends, and its lock with it
    return upgraded


def _upgrade_on(conn: Connection, config: Config, revision: str) -> Upgraded:
    from alembic import command

    before = _revision_on(conn)
    if config.attributes.get("transaction_per_migration"):
        conn.commit()  # Alembic begins each migration's transaction itself
    config.attributes["connection"] = conn
    command.upgrade(config, revision)
    return Upgraded(before, _revision_on(conn))


def _upgrade_in_one_transaction(database: Database, config: Config, revision: str) -> Upgraded:
    waiting = _Waiting()
    while True:
        with database.write() as conn:
            if _try(conn, "pg_try_advisory_xact_lock", commit=False):
                return _upgrade_on(conn, config, revision)
        with database.session() as watcher:
            waiting.wait(watcher)


def _try(conn: Connection, function: str, *, commit: bool) -> bool:
    taken = bool(conn.execute(text(f"SELECT {function}(:key)"), {"key": UPGRADE_LOCK}).scalar())
    if commit:
        conn.commit()
    return taken


class _Waiting:
    """An upgrader waiting for the lock: it asks again every ``_LOCK_POLL_S`` and says every
    ``_WAIT_LOG_S`` which session holds it. No transaction stays open while it waits:
    ``CREATE INDEX CONCURRENTLY`` in the upgrade holding the lock waits for every transaction
    older than its build, so one waiting on the lock would deadlock it."""

    def __init__(self) -> None:
        self.started = self.logged = time.monotonic()

    def wait(self, conn: Connection) -> None:
        now = time.monotonic()
        if now - self.logged >= _WAIT_LOG_S:
            self.logged = now
            key = {"high": UPGRADE_LOCK >> 32, "low": UPGRADE_LOCK & 0xFFFFFFFF}
            holder = conn.execute(_HOLDER, key).scalar()
            conn.commit()
            log.warning(
                "waiting %.0f s for another upgrade of this database (server process %s)",
                now - self.started, holder,
            )  # fmt: skip
        time.sleep(_LOCK_POLL_S)


def build_index(name: str, table: str, columns: list[str], *, where: str | None = None) -> None:
    """Create an index, from a migration. When the upgrade runs one transaction per migration
    (PostgreSQL, ``upgrade``): ``CREATE INDEX CONCURRENTLY`` outside any transaction, so that
    writes to ``table`` go on while it is built, after dropping what an interrupted build of
    it left (an index PostgreSQL marks invalid); an index built before the upgrade could
    record it is kept. Otherwise a plain ``CREATE INDEX`` in the migration's transaction,
    which copes with the same leftovers (a process behind a pooler may follow one that was
    not)."""
    from alembic import op

    predicate = None if where is None else text(where)
    context = op.get_context()
    concurrently = bool(context.opts.get("transaction_per_migration"))
    if concurrently:
        log.info(
            "building index %s CONCURRENTLY: it waits for every older transaction of the database",
            name,
        )
    with context.autocommit_block() if concurrently else nullcontext():
        if _invalid_index(op.get_bind(), name):  # left by a build stopped midway
            op.drop_index(name, table_name=table, postgresql_concurrently=concurrently)
        op.create_index(  # one built but not yet recorded is kept
            name,
            table,
            columns,
            postgresql_where=predicate,
            sqlite_where=predicate,
            postgresql_concurrently=concurrently,
            if_not_exists=True,
        )


def rebuild_index(name: str, table: str, columns: list[str]) -> None:
    """Replace the index ``name`` with one on ``columns``, from a migration: as
    ``build_index`` builds one, under a second name, then the old one dropped
    (``CONCURRENTLY``) and the new one renamed, when the upgrade runs one transaction per
    migration; otherwise dropped and created in the migration's transaction. Repeating it
    after an interruption at any step ends with the index on ``columns``, built once more
    only if the interrupted one had not been built in full."""
    from alembic import op

    rebuilt = f"{name}_rebuilt"
    if not op.get_context().opts.get("transaction_per_migration"):
        op.drop_index(rebuilt, table_name=table, if_exists=True)  # a concurrent upgrade's
        op.drop_index(name, table_name=table, if_exists=True)
        op.create_index(name, table, columns)
        return
    indexes = {i["name"]: i["column_names"] for i in inspect(op.get_bind()).get_indexes(table)}
    if rebuilt not in indexes and indexes.get(name) == columns:
        return  # renamed already, by an upgrade stopped before it could record it
    build_index(rebuilt, table, columns)
    with op.get_context().autocommit_block():
        op.drop_index(name, table_name=table, postgresql_concurrently=True, if_exists=True)
        op.execute(f'ALTER INDEX "{rebuilt}" RENAME TO "{name}"')


def _invalid_index(conn: Connection, name: str) -> bool:
    """Whether PostgreSQL holds an invalid index ``name`` (left by an interrupted build)."""
    if conn.dialect.name != "postgresql":
        return False
    query = text(
        "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = :name AND pg_table_is_visible(c.oid)"
    )
    return bool(conn.execute(query, {"name": name}).scalar())


def current_revision(database: Database) -> str | None:
    """The applied revision, or None on an empty database."""
    with database.read() as conn:
        return _revision_on(conn)


def _revision_on(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()
