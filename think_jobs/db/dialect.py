"""What differs between SQLite and PostgreSQL: INSERT ... ON CONFLICT, and the clock.

Each is built once per (dialect, table) and reused: building a statement costs more CPU than
executing a cached one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import BindParameter, Connection, Float, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.functions import FunctionElement

from think_jobs.db.tables import UTCDateTime


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


# -- the database server's clock ---------------------------------------------------------------
# Lease expiry, liveness and the timestamps that order a turn's life are taken from the
# database server's clock inside the statements that use them, so a worker whose own clock is
# wrong can neither steal a live lease nor keep a dead one (SQLite: all processes share one
# machine and its clock).

_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f000', 'now'{})"  # the format SQLAlchemy stores


class db_now(FunctionElement[datetime]):
    """The database server's current time (PostgreSQL: ``clock_timestamp()``)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"


class db_now_plus(FunctionElement[datetime]):
    """The database server's time ``seconds`` from now (``seconds``: a numeric expression)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now_plus"


def server_now(conn: Connection) -> datetime:
    """The database server's clock now (SQLite: this process's, which shares the machine):
    what a decision taken in Python, such as which schedules are due, compares with."""
    if conn.dialect.name == "sqlite":
        return datetime.now(UTC)
    now: datetime = conn.execute(select(db_now())).scalar_one()
    return now


@compiles(db_now, "postgresql")
def _pg_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "clock_timestamp()"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return _SQLITE_NOW.format("")


@compiles(db_now_plus, "postgresql")
def _pg_now_plus(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"(clock_timestamp() + make_interval(secs => CAST({seconds} AS DOUBLE PRECISION)))"


@compiles(db_now_plus, "sqlite")
def _sqlite_now_plus(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return _SQLITE_NOW.format(f", printf('%+.6f seconds', {seconds})")


def seconds_param(name: str) -> BindParameter[float]:
    """A bind parameter holding a duration in seconds (for ``db_now_plus``)."""
    return bindparam(name, type_=Float())
