"""The SQLAlchemy engine and the two kinds of transaction every operation runs in.

SQLite gets WAL, a busy timeout and ``BEGIN IMMEDIATE`` for write transactions: a deferred
transaction that later upgrades to a write lock can fail with "database is locked" no matter
the timeout, while an immediate one simply waits its turn. PostgreSQL runs at READ COMMITTED;
per-agent ordering comes from locking the agent row (see ``think_jobs.engine.queueing``).
Failures to reach the database surface as ``StorageUnavailableError`` with the cause chained.

A pooled PostgreSQL connection is pinged when it comes out of the pool after more than
``PING_AFTER_IDLE_S`` of rest, not on every checkout (SQLAlchemy's ``pool_pre_ping``): a ping is
a round trip, and a worker's hot path takes a connection a few times per turn. A connection that
died while in use (the server restarted under it) fails that one operation with
``StorageUnavailableError``, and SQLAlchemy then discards every connection pooled before it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url

from think_jobs.errors import ConfigurationError, StorageUnavailableError

__all__ = [
    "ConcurrentWrite",
    "Connection",
    "Database",
    "Pooler",
    "check_url",
    "create_db_engine",
]

Pooler = Literal["none", "transaction"]

_WRITE = "think_jobs_write"
# A TCP connection to a server that vanished does not fail, it hangs: bound connecting, and
# let keepalives and the unacknowledged-data timeout notice a dead peer within ~15 s.
_PG_CONNECT = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}
_RESTED_SINCE = "think_jobs_rested_since"
PING_AFTER_IDLE_S = 1.0
_NOT_MIGRATED = (
    "the think-jobs tables do not exist yet: run `think-jobs db upgrade` (or jobs.migrate())"
)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout = 30000")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _ping_rested_connections(engine: Engine) -> None:
    """Check a connection that rested in the pool before handing it out; a dead one is
    replaced (raising ``DisconnectionError`` in ``checkout`` makes the pool reconnect)."""

    @event.listens_for(engine, "checkin")
    def on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_RESTED_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        rested_since = record.info.get(_RESTED_SINCE)
        if rested_since is None or time.monotonic() - rested_since < PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise exc.DisconnectionError(f"pooled connection is dead: {error}") from error


def _pg_connect_args(
    parsed: URL, idle_transaction_timeout_s: float | None, pooler: Pooler
) -> dict[str, Any]:
    """libpq's connection parameters: the timeouts above, and the server's own bound on a
    session idle inside a transaction, added to any ``options`` the URL sets. Behind a pooler
    neither the bound nor prepared statements can belong to the session: a pooler refuses
    ``options`` at connect, and in transaction mode hands each transaction to whichever
    server session is free, where a statement psycopg prepared on another does not exist
    (the bound is then set in each write transaction: ``_bound_idle_write_transactions``)."""
    args: dict[str, Any] = dict(_PG_CONNECT)
    if pooler == "transaction":
        if parsed.get_driver_name() == "psycopg":
            args["prepare_threshold"] = None
        return args
    if idle_transaction_timeout_s is not None:
        given = parsed.query.get("options")
        own = f"-c idle_in_transaction_session_timeout={_ms(idle_transaction_timeout_s)}"
        args["options"] = f"{given} {own}" if isinstance(given, str) and given else own
    return args


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _bound_idle_write_transactions(engine: Engine, idle_transaction_timeout_s: float) -> None:
    """Behind a pooler: each write transaction asks PostgreSQL to end it when left idle past
    the bound (``SET LOCAL`` ends with the transaction, so nothing stays on a server session
    another client gets next). Reads lock no rows and one-statement writes are never idle
    inside a transaction, so they go without."""
    set_bound = f"SET LOCAL idle_in_transaction_session_timeout = {_ms(idle_transaction_timeout_s)}"

    @event.listens_for(engine, "begin")
    def on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_WRITE, False):
            conn.exec_driver_sql(set_bound)


def _check_sessions_bound(engine: Engine, idle_transaction_timeout_s: float) -> None:
    """Refuse a new session that did not take the bound from its ``options``: a pooler that
    drops the parameter (PgBouncer's ``ignore_startup_parameters = options``) would leave a
    paused process free to hold the rows it locked for good, without a word."""
    wanted = str(_ms(idle_transaction_timeout_s))

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(_SESSION_BOUND)
            found = cursor.fetchone()
        dbapi_connection.rollback()
        if found is None or str(found[0]) != wanted:
            shown = "nothing" if found is None else f"{found[0]} ms"
            raise ConfigurationError(
                f"the database session runs with idle_in_transaction_session_timeout = "
                f"{shown}, not the {wanted} ms think-jobs asked for at connect: something "
                f"between this process and PostgreSQL dropped the `options`; {_POOLER_HINT}"
            )


_SESSION_BOUND = (
    "SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'"
)


def create_db_engine(
    url: str,
    *,
    pool_size: int,
    idle_transaction_timeout_s: float | None = None,
    pooler: Pooler = "none",
) -> Engine:
    """An engine for ``url``; nothing connects until the first operation. On PostgreSQL a
    session left idle inside a transaction for ``idle_transaction_timeout_s`` is ended by the
    server (its transaction rolled back, its locks freed): a process paused or cut off
    between two statements of a transaction cannot hold the rows it locked for good.
    ``pooler="transaction"``: a connection pooler in transaction mode stands in front of
    PostgreSQL (``_pg_connect_args``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=pool_size,
            max_overflow=pool_size,
        )
        _configure_sqlite(engine)
        return engine
    engine = create_engine(
        parsed,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args=(
            _pg_connect_args(parsed, idle_transaction_timeout_s, pooler)
            if parsed.get_backend_name() == "postgresql"
            else {}
        ),
    )
    if idle_transaction_timeout_s is not None and parsed.get_backend_name() == "postgresql":
        if pooler == "transaction":
            _bound_idle_write_transactions(engine, idle_transaction_timeout_s)
        else:
            _check_sessions_bound(engine, idle_transaction_timeout_s)
    _ping_rested_connections(engine)
    _drop_read_only_sessions(engine)
    return engine


_READ_ONLY = "25006"  # read_only_sql_transaction


def _drop_read_only_sessions(engine: Engine) -> None:
    """A session that refuses writes because its server is read-only — a standby, a primary
    demoted by a failover, a database set ``default_transaction_read_only`` — stays so for
    its whole life, even once a writable primary is back: it counts as a lost connection.
    The operation fails with ``StorageUnavailableError``, SQLAlchemy discards every pooled
    connection, and the next transaction connects again (to whatever server the URL's host —
    or libpq's ``target_session_attrs=read-write`` among several hosts — leads to then)."""

    @event.listens_for(engine, "handle_error")
    def on_error(context: Any) -> None:
        if getattr(context.original_exception, "sqlstate", None) == _READ_ONLY:
            context.is_disconnect = True


def check_url(url: str) -> None:
    """Refuse, in one line, a database URL that cannot work: unparsable, an unknown dialect,
    or a driver that is not installed (what SQLAlchemy would report as a long traceback)."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise ConfigurationError(
            "the database URL (THINK_JOBS_DATABASE_URL) is not a URL; expected e.g. "
            "sqlite:///think_jobs.db or postgresql+psycopg://user:password@host/db"
        ) from error
    shown = parsed.render_as_string(hide_password=True)
    try:
        parsed.get_dialect().import_dbapi()
    except exc.NoSuchModuleError as error:
        raise ConfigurationError(
            f"database URL {shown}: SQLAlchemy knows no database {parsed.drivername!r}"
        ) from error
    except ImportError as error:
        raise ConfigurationError(
            f"database URL {shown}: its driver is not installed ({error}); install it, or use "
            "postgresql+psycopg:// with think-jobs[postgres]"
        ) from error


class ConcurrentWrite(Exception):
    """A unique constraint refused a write, because a concurrent transaction made the same
    row first: look again (the transaction was rolled back)."""


_POOLER_HINT = (
    "if a connection pooler (PgBouncer, RDS Proxy, Supavisor) stands in front of PostgreSQL, "
    "set THINK_JOBS_DB_POOLER=transaction"
)
# invalid_sql_statement_name, duplicate_prepared_statement: a statement psycopg prepared on
# one server session, looked for on another that a pooler handed over
_PREPARED_ELSEWHERE = frozenset({"26000", "42P05"})


def _prepared_elsewhere(orig: BaseException | None) -> bool:
    """Whether the driver's error is a prepared statement lost between two server sessions
    (what a pooler in transaction mode does to psycopg's prepared statements)."""
    return getattr(orig, "sqlstate", None) in _PREPARED_ELSEWHERE or "prepared statement" in str(
        orig
    )


@contextmanager
def _errors_mapped() -> Iterator[None]:
    """The package's errors for what the driver raises: a unique constraint refusing a write
    (``ConcurrentWrite``), an unreachable database, tables that were never created, a pooler
    the settings do not know about (which refuses to connect, or loses prepared statements)."""
    try:
        yield
    except exc.IntegrityError as error:
        raise ConcurrentWrite(str(error.orig)) from error
    except (exc.OperationalError, exc.InterfaceError) as error:
        if "no such table" in str(error.orig):
            raise ConfigurationError(_NOT_MIGRATED) from error
        if "unsupported startup parameter" in str(error.orig):
            raise ConfigurationError(
                f"the database refused to connect ({error.orig}); {_POOLER_HINT}"
            ) from error
        hint = f"; {_POOLER_HINT}" if _prepared_elsewhere(error.orig) else ""
        raise StorageUnavailableError(f"database unavailable: {error.orig}{hint}") from error
    except exc.ProgrammingError as error:
        if "does not exist" in str(error.orig) and "relation" in str(error.orig):
            raise ConfigurationError(_NOT_MIGRATED) from error
        if _prepared_elsewhere(error.orig):
            raise StorageUnavailableError(
                f"database unavailable: {error.orig}; {_POOLER_HINT}"
            ) from error
        raise
    except exc.DBAPIError as error:
        if error.connection_invalidated:
            raise StorageUnavailableError(f"database unavailable: {error.orig}") from error
        raise


class Database:
    """Owns the engine; hands out read and write transactions."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int,
        idle_transaction_timeout_s: float | None = None,
        pooler: Pooler = "none",
    ) -> None:
        self.url = url
        self._dialect: str | None = None
        self._pool_size = pool_size
        self._idle_transaction_timeout_s = idle_transaction_timeout_s
        self._pooler: Pooler = pooler
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._closed = False  # once closed, no connection goes back into the pool

    @property
    def engine(self) -> Engine:
        """The engine, made on first use, once: threads that start together (a worker's
        sweeper and its start-up check) must not each make one, or the pool of the engine
        that loses is dropped with its connections still open."""
        engine = self._engine
        if engine is None:
            with self._lock:
                if self._engine is None:
                    self._engine = create_db_engine(
                        self.url,
                        pool_size=self._pool_size,
                        idle_transaction_timeout_s=self._idle_transaction_timeout_s,
                        pooler=self._pooler,
                    )
                engine = self._engine
        return engine

    @property
    def dialect(self) -> str:
        if self._dialect is None:  # parsed on first use: ``check_url`` explains a bad one
            self._dialect = make_url(self.url).get_backend_name()
        return self._dialect

    @property
    def pooler(self) -> Pooler:
        """The connection pooler this process was told stands in front of PostgreSQL."""
        return self._pooler

    @property
    def one_statement_writes(self) -> bool:
        """Whether a write of several parts can be one statement that commits by itself
        (``statement()``; data-modifying CTEs): PostgreSQL yes, SQLite no."""
        return self.dialect == "postgresql"

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A transaction that will write; committed on success, rolled back on error."""
        with self._transaction(write=True) as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A transaction that only reads."""
        with self._transaction(write=False) as conn:
            yield conn

    @contextmanager
    def statement(self) -> Iterator[Connection]:
        """PostgreSQL: a connection whose every statement commits by itself (autocommit), for
        a write that is one statement and so needs no transaction round trips of its own."""
        if not self.one_statement_writes:
            raise ValueError("Database.statement() is for PostgreSQL")
        with _errors_mapped(), self._connection() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def session(self) -> Iterator[Connection]:
        """A pooled connection with no transaction begun: its user begins and commits its own
        (the migrations: one transaction per migration, some steps outside any)."""
        with _errors_mapped(), self._connection() as conn:
            yield conn

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Connection]:
        with _errors_mapped(), self._connection() as conn:
            conn.execution_options(**{_WRITE: write})
            with conn.begin():
                yield conn

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """A pooled connection. After ``close()`` a connection is closed when it comes back
        instead of being pooled, whether it was out while ``close()`` ran (a heartbeat or a
        request in flight on another thread) or taken afterwards (a straggling renewal or
        request): nothing would ever close the pool it went back to, and psycopg warns when
        such a connection is garbage-collected, leaving a server connection open until then."""
        with self.engine.connect() as conn:
            try:
                yield conn
            finally:
                if self._closed:
                    conn.invalidate()

    def forget_inherited_connections(self) -> None:
        """In a forked child: drop the parent's pooled connections without closing them."""
        if self._engine is not None:
            self._engine.dispose(close=False)

    def close(self) -> None:
        """Close pooled connections, each one in use elsewhere when it comes back, and each
        one a straggler takes later (the database still answers, unpooled)."""
        self._closed = True
        if self._engine is not None:
            self._engine.dispose()
