"""Migration 0006 (tool approvals), from an empty database and from revision 0005's, on SQLite
and PostgreSQL: the table and the turn column are there, and a turn stored before reads back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import text

from tests.conftest import _pg_admin, _sqlalchemy_pg
from think_jobs.db.engine import Database
from think_jobs.db.migrate import current_revision, upgrade


@pytest.fixture
def empty_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"tj_mig_{uuid.uuid4().hex[:12]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _sqlalchemy_pg(name)
    with _pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _columns(url: str, table: str) -> set[str]:
    engine = sqlalchemy.create_engine(url)
    try:
        return {column["name"] for column in sqlalchemy.inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def test_from_an_empty_database(empty_url: str) -> None:
    database = Database(empty_url, pool_size=1)
    try:
        upgrade(database)
        assert current_revision(database) == "0006"
    finally:
        database.close()
    assert {"approval_id", "continuation_id", "status", "decided_at"} <= _columns(
        empty_url, "think_approvals"
    )
    assert {"awaiting_approval", "extends"} <= _columns(empty_url, "think_turns")


def test_from_revision_0005_with_a_turn_stored(empty_url: str) -> None:
    database = Database(empty_url, pool_size=1)
    try:
        upgrade(database, "0005")
        with database.write() as conn:
            conn.execute(
                text(
                    "INSERT INTO think_agents (agent_type, agent_name, admitted, created_at) "
                    "VALUES ('T', 'a', 1, CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO think_turns (agent_id, seq, request_id, kind, trigger, status, "
                    "continuation, attempt, recoveries, messages_applied, created_at) "
                    "VALUES (1, 1, 'r1', 'submission', 'submit', 'pending', false, 0, 0, "
                    "false, CURRENT_TIMESTAMP)"
                )
            )
        upgrade(database)
        assert current_revision(database) == "0006"
        with database.read() as conn:
            row = conn.execute(text("SELECT awaiting_approval FROM think_turns")).one()
            count = conn.execute(text("SELECT count(*) FROM think_approvals")).scalar_one()
        assert bool(row.awaiting_approval) is False and count == 0
    finally:
        database.close()
