"""How the pool treats PostgreSQL connections: one that died while resting is pinged and
replaced on checkout; none is left open by a close() or by threads that first use a database
together."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.conftest import _pg_admin
from tests.support.pg_sessions import left_idle_until_ended
from think_jobs import StorageUnavailableError
from think_jobs.db import engine as engine_module
from think_jobs.db.engine import Database

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def backend_pid(database: Database) -> int:
    with database.read() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate(pid: int) -> None:
    with _pg_admin() as admin:
        # With a timeout, PostgreSQL returns only once the backend has exited.
        ended = admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    assert ended == (True,)


def test_a_rested_connection_that_died_is_replaced(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.0)  # every checkout has rested
    database = Database(database_url, pool_size=1)
    try:
        first = backend_pid(database)
        terminate(first)
        second = backend_pid(database)  # no error: the ping found it dead, the pool reconnected
    finally:
        database.close()
    assert second != first


def test_a_connection_that_died_in_use_fails_one_operation_then_recovers(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 3600.0)  # never pinged
    database = Database(database_url, pool_size=1)
    try:
        first = backend_pid(database)
        terminate(first)
        with pytest.raises(StorageUnavailableError, match="database unavailable"):
            backend_pid(database)
        second = backend_pid(database)
    finally:
        database.close()
    assert second != first


def test_a_connection_in_use_when_the_database_closes_is_closed_when_it_comes_back(
    database_url: str,
) -> None:
    """A heartbeat or a request on another thread may hold a connection while the runtime
    closes: it is closed on its way back, not left open in the disposed pool until the
    garbage collector finds it (psycopg's "deleted while still open" ResourceWarning)."""
    database = Database(database_url, pool_size=1)
    with database.read() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        database.close()
        conn.execute(text("SELECT 1"))  # still usable until it comes back
        assert not raw.closed
    assert raw.closed
    assert backend_pid(database) > 0  # and the database still works after close()
    database.close()


def test_a_connection_taken_after_the_database_closed_is_closed_when_it_comes_back(
    database_url: str,
) -> None:
    """A straggler (a lease renewal still in flight, a request a server thread finishes) may
    use the database after the runtime closed it: its connection is not pooled, where nothing
    would ever close it."""
    database = Database(database_url, pool_size=1)
    backend_pid(database)
    database.close()
    with database.read() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        conn.execute(text("SELECT 1"))
    assert raw.closed


def test_threads_that_first_use_the_database_together_share_one_pool(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's sweeper and its start-up check touch a new ``Database`` at the same moment:
    one engine must come of it, or the losing engine's pool is dropped with its connection
    still open (the psycopg "deleted while still open" ResourceWarning of the browser tests,
    and a server connection left open until the garbage collector finds it)."""
    made = engine_module.create_db_engine

    def slow_to_make(url: str, **options: Any) -> Engine:  # as on a loaded machine
        time.sleep(0.05)
        return made(url, **options)

    monkeypatch.setattr(engine_module, "create_db_engine", slow_to_make)
    database = Database(database_url, pool_size=8)
    start = threading.Barrier(8)
    engines: set[int] = set()

    def first_use() -> None:
        start.wait()
        with database.read() as conn:
            engines.add(id(conn.engine))

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    database.close()
    assert engines == {id(database.engine)}


def test_sessions_ask_postgresql_to_end_them_when_idle_in_a_transaction(
    database_url: str,
) -> None:
    """``db_idle_transaction_timeout_s`` reaches every session as
    ``idle_in_transaction_session_timeout``, beside any ``options`` the URL sets; a
    transaction left idle past it is ended by the server, and the next operation fails with
    the package's error, then the pool goes on with a new connection."""
    url = f"{database_url}?options=-c%20statement_timeout%3D5000"
    database = Database(url, pool_size=1, idle_transaction_timeout_s=0.2)
    try:
        with database.read() as conn:
            shown = [
                conn.exec_driver_sql(f"SHOW {name}").scalar()
                for name in ("idle_in_transaction_session_timeout", "statement_timeout")
            ]
        assert shown == ["200ms", "5s"]
        left_idle_until_ended(database.read())
        with database.read() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        database.close()
