"""Apply the package's Alembic migrations (``think-jobs db upgrade`` / ``jobs.migrate()``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from think_jobs.db.engine import Database
from think_jobs.db.tables import VERSION_TABLE

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(database: Database) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    return config


def upgrade(database: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision`` inside one transaction."""
    config = alembic_config(database)
    with database.write() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def current_revision(database: Database) -> str | None:
    """The applied revision, or None on an empty database."""
    with database.read() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()
