"""The statements that differ between SQLite and PostgreSQL: INSERT ... ON CONFLICT.

Each is built once per (dialect, table) and reused: building a statement costs more CPU than
executing a cached one.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert


def _module(dialect: str) -> Any:
    return postgresql if dialect == "postgresql" else sqlite


@cache
def _ignoring(dialect: str, table: Table) -> Insert:
    statement: Insert = _module(dialect).insert(table).on_conflict_do_nothing()
    return statement


@cache
def _upserting(
    dialect: str, table: Table, keys: tuple[str, ...], update: tuple[str, ...]
) -> Insert:
    statement = _module(dialect).insert(table)
    changes = {column: statement.excluded[column] for column in update}
    upsert_statement: Insert = statement.on_conflict_do_update(
        index_elements=list(keys), set_=changes
    )
    return upsert_statement


def insert_ignoring_conflicts(conn: Connection, table: Table) -> Insert:
    """An INSERT that silently skips rows violating a unique constraint (execute it with the
    rows as parameters)."""
    return _ignoring(conn.dialect.name, table)


def upsert(
    conn: Connection,
    table: Table,
    values: dict[str, Any],
    *,
    keys: Sequence[str],
    update: Sequence[str],
) -> None:
    """INSERT ``values``, or UPDATE the ``update`` columns of the row with the same ``keys``."""
    statement = _upserting(conn.dialect.name, table, tuple(keys), tuple(update))
    conn.execute(statement, values)
