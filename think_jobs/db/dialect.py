"""The statements that differ between SQLite and PostgreSQL: INSERT ... ON CONFLICT."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert


def insert_ignoring_conflicts(conn: Connection, table: Table) -> Insert:
    """An INSERT that silently skips rows violating a unique constraint."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def upsert(
    conn: Connection,
    table: Table,
    values: dict[str, Any],
    *,
    keys: Sequence[str],
    update: Sequence[str],
) -> None:
    """INSERT ``values``, or UPDATE the ``update`` columns of the row with the same ``keys``."""
    module: Any = postgresql if conn.dialect.name == "postgresql" else sqlite
    statement = module.insert(table).values(**values)
    changes = {column: statement.excluded[column] for column in update}
    conn.execute(statement.on_conflict_do_update(index_elements=list(keys), set_=changes))
