"""PostgreSQL sessions as the server sees them (``pg_stat_activity``)."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection

from tests.conftest import _pg_admin
from think_jobs import StorageUnavailableError, ThinkJobs
from think_jobs.testing import wait_until


def backend_alive(pid: int) -> bool:
    with _pg_admin() as admin:
        found = admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return found is not None


def left_idle_until_ended(transaction: AbstractContextManager[Connection]) -> None:
    """Open ``transaction``, leave it idle until PostgreSQL ends its session, then go on in
    it: that fails with the package's error (and the transaction is left)."""
    with pytest.raises(StorageUnavailableError), transaction as conn:
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        wait_until(lambda: not backend_alive(pid), 10, interval_s=0.05)  # idle, then ended
        conn.exec_driver_sql("SELECT 1")


def wait_for_lock_waiter(
    jobs: ThinkJobs | sa.Engine,
    *,
    on: str = "",
    besides: str | None = None,
    deadline_s: float = 30.0,
) -> None:
    """Until a session of the database of ``jobs`` (or an engine) waits on a lock in a
    statement that names ``on`` (any statement by default) and not ``besides`` (a table
    another waiter reads)."""
    engine = jobs if isinstance(jobs, sa.Engine) else jobs.db.engine
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE :on "
        "AND (CAST(:besides AS text) IS NULL OR query NOT LIKE :besides)"
    )
    names = {"on": f"%{on}%", "besides": None if besides is None else f"%{besides}%"}
    deadline = time.monotonic() + deadline_s
    with engine.connect() as watcher:
        while watcher.execute(query, names).scalar_one() == 0:
            watcher.rollback()  # a fresh snapshot of pg_stat_activity next time
            assert time.monotonic() < deadline, f"no session waited on a lock in {on or 'any'}"
            time.sleep(0.005)
