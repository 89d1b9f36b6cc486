"""PostgreSQL sessions as the server sees them (``pg_stat_activity``)."""

from __future__ import annotations

from contextlib import AbstractContextManager

import pytest
from sqlalchemy import Connection

from tests.conftest import _pg_admin
from think_jobs import StorageUnavailableError
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
