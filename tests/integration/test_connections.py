"""Pooled PostgreSQL connections that died while resting: pinged and replaced on checkout."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.conftest import _pg_admin
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
