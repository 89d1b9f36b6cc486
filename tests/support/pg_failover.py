"""PostgreSQL failing over to a server that refuses writes, and back, emulated on one
database: ``default_transaction_read_only`` set (what every new session of a demoted server
reports) and the database's sessions ended (as the demotion ends them); back, the setting
cleared, and nothing ends the sessions made meanwhile: they stay read-only for their life."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

ADMIN = os.environ.get("TJ_TEST_PG_URL", "postgresql://postgres:postgres@127.0.0.1:5432/test")


def admin(sql: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as connection:
        connection.execute(sql)


@contextmanager
def read_only(database: str) -> Iterator[None]:
    """The database refuses writes to every session, its sessions of before ended; after
    the block it takes writes again, and the sessions made meanwhile live on."""
    admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    )
    try:
        yield
    finally:
        admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = off')
