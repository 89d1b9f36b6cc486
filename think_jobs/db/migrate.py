"""Apply the package's Alembic migrations (``think-jobs db upgrade`` / ``jobs.migrate()``).

Alembic is imported when a migration is read or applied, not with the package: it brings
Mako and Pygments, a sixth of what every worker, web process and CLI command imported at
start for a step most of them never take.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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


def upgrade(database: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision`` inside one transaction."""
    from alembic import command

    config = alembic_config(database)
    with database.write() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def current_revision(database: Database) -> str | None:
    """The applied revision, or None on an empty database."""
    from alembic.runtime.migration import MigrationContext

    with database.read() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()
