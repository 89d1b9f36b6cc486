"""The migrations, on SQLite and PostgreSQL: an empty database brought to head has exactly the
schema ``db.tables`` mirrors; 0006 (tool approvals) from revision 0005's database, 0007 (the
status listing index) from 0006's, 0008 (kept schedule occurrences) from 0007's, 0009 (who
fires a kept occurrence) from 0008's, 0010 (the aborted turns' partial index) from 0009's and
0011 (turn ids never reused on SQLite) from 0010's, each with rows stored before that read back
after. On PostgreSQL an index is built
``CONCURRENTLY`` (writes go on meanwhile; what an interrupted build left is built again) and
upgrades run at once apply each migration once."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from tests.conftest import _pg_admin, _sqlalchemy_pg
from tests.support.pg_sessions import wait_for_lock_waiter
from think_jobs.db import agents as agent_ops
from think_jobs.db import migrate
from think_jobs.db import schedules as schedule_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.engine import Database, Pooler
from think_jobs.db.migrate import current_revision, upgrade
from think_jobs.db.tables import VERSION_TABLE, Base
from think_jobs.testing import wait_until

HEAD = "0011"


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


_AGENT_SQL = (
    "INSERT INTO think_agents (agent_type, agent_name, admitted, created_at) "
    "VALUES ('T', 'a', :admitted, CURRENT_TIMESTAMP)"
)


def _turn_sql(*, seq: int, request_id: str, status: str, minute: int) -> str:
    return (
        "INSERT INTO think_turns (agent_id, seq, request_id, kind, trigger, status, "
        "continuation, attempt, recoveries, messages_applied, created_at) "
        f"VALUES (1, {seq}, '{request_id}', 'submission', 'submit', '{status}', false, 0, 0, "
        f"false, '2026-12-01 10:{minute:02d}:00')"
    )


def test_an_empty_database_brought_to_head_has_the_schema_the_code_queries(
    empty_url: str,
) -> None:
    database = Database(empty_url, pool_size=1)
    try:
        upgrade(database)
        assert current_revision(database) == HEAD
        with database.read() as conn:
            drift = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        database.close()
    drift = [d for d in drift if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)]
    assert drift == []


def test_from_an_empty_database_to_0006(empty_url: str) -> None:
    database = Database(empty_url, pool_size=1)
    try:
        upgrade(database, "0006")
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
            conn.execute(text(_AGENT_SQL), {"admitted": 1})
            conn.execute(text(_turn_sql(seq=1, request_id="r1", status="pending", minute=1)))
        upgrade(database, "0006")
        assert current_revision(database) == "0006"
        with database.read() as conn:
            row = conn.execute(text("SELECT awaiting_approval FROM think_turns")).one()
            count = conn.execute(text("SELECT count(*) FROM think_approvals")).scalar_one()
        assert bool(row.awaiting_approval) is False and count == 0
    finally:
        database.close()


def test_from_revision_0006_with_submissions_stored(empty_url: str) -> None:
    database = Database(empty_url, pool_size=1)
    stored = [("r1", "completed"), ("r2", "pending"), ("r3", "aborted"), ("r4", "pending")]
    try:
        upgrade(database, "0006")
        with database.write() as conn:
            conn.execute(text(_AGENT_SQL), {"admitted": len(stored)})
            for seq, (request_id, status) in enumerate(stored, start=1):
                sql = _turn_sql(seq=seq, request_id=request_id, status=status, minute=seq)
                conn.execute(text(sql))
        upgrade(database)
        assert current_revision(database) == HEAD
        with database.read() as conn:
            found = turn_ops.list_submissions(conn, 1, statuses=["pending", "aborted"], limit=10)
        indexes = sqlalchemy.inspect(database.engine).get_indexes("think_turns")
    finally:
        database.close()
    assert [turn.request_id for turn in found] == ["r4", "r3", "r2"]
    listing = next(i for i in indexes if i["name"] == "ix_think_turns_status_listing")
    assert listing["column_names"] == ["agent_id", "kind", "status", "created_at", "request_id"]
    assert not [i for i in indexes if str(i["name"]).endswith("_rebuilt")]  # renamed


def test_from_revision_0007_with_a_schedule_stored(empty_url: str) -> None:
    """0008 adds the kept occurrences: an armed schedule reads back, a claim keeps its
    occurrence, and removing the schedule removes what it kept."""
    database = Database(empty_url, pool_size=1)
    due = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    try:
        upgrade(database, "0007")
        with database.write() as conn:
            conn.execute(text(_AGENT_SQL), {"admitted": 0})
            spec = schedule_ops.ScheduleSpec("digest", "every 1 hour", None, due)
            schedule_ops.insert_missing(conn, 1, [spec], now=due)  # as 0007's code armed it
        upgrade(database)
        assert current_revision(database) == HEAD
        with database.write() as conn:
            [row] = schedule_ops.for_agent(conn, 1)
            taken = schedule_ops.claim(
                conn, [row.id], due_at=due, next_run_at=due + timedelta(hours=1), now=due
            )
            schedule_ops.record_fires(conn, taken, due_at=due, resend_at=due)
        with database.read() as conn:
            [overdue] = schedule_ops.overdue_fires(conn, ["T"], now=due, limit=10)
        with database.write() as conn:
            conn.execute(text("DELETE FROM think_schedules"))
        with database.read() as conn:
            left = conn.execute(text("SELECT count(*) FROM think_schedule_fires")).scalar_one()
    finally:
        database.close()
    assert (row.task_id, row.next_run_at) == ("digest", due)
    assert (overdue.address, overdue.due_at, overdue.attempt) == ("T:a", due, 1)
    assert left == 0


def test_from_revision_0008_with_an_occurrence_kept(empty_url: str) -> None:
    """0009 adds the holder of a kept occurrence: one kept before has none, so a worker can
    take it, and a second cannot."""
    database = Database(empty_url, pool_size=1)
    due = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    try:
        upgrade(database, "0008")
        with database.write() as conn:
            conn.execute(text(_AGENT_SQL), {"admitted": 0})
            spec = schedule_ops.ScheduleSpec("digest", "every 1 hour", None, due)
            schedule_ops.insert_missing(conn, 1, [spec], now=due)
            [row] = schedule_ops.for_agent(conn, 1)
            schedule_ops.record_fires(conn, [row.id], due_at=due, resend_at=due)
            conn.execute(text("UPDATE think_schedule_fires SET attempt = 2"))  # one failed
        upgrade(database)
        assert current_revision(database) == HEAD
        with database.write() as conn:
            taken = [
                schedule_ops.take_fire(conn, 1, "digest", due, attempt=2, token=token, hold_s=60)
                for token in ("first", "second")
            ]
        with database.read() as conn:
            [kept] = schedule_ops.kept_fires(conn)
    finally:
        database.close()
    assert taken == [True, False]
    assert (kept.due_at, kept.attempt) == (due, 2)
    assert kept.resend_at > due  # held: moved on by the database's clock


def test_from_revision_0010_a_deleted_turns_id_is_never_given_again(empty_url: str) -> None:
    """0011: on SQLite a turn admitted after the newest one was deleted got the deleted turn's
    id, which names its keys in Redis (PostgreSQL's sequences never reuse one). The turns
    stored before read back."""
    database = Database(empty_url, pool_size=1)
    try:
        upgrade(database, "0010")
        with database.write() as conn:
            conn.execute(text(_AGENT_SQL), {"admitted": 3})
            conn.execute(text(_turn_sql(seq=1, request_id="kept", status="completed", minute=1)))
            conn.execute(text(_turn_sql(seq=2, request_id="gone", status="completed", minute=2)))
        upgrade(database)
        assert current_revision(database) == HEAD
        with database.write() as conn:
            deleted = turn_ops.delete_terminal_submission(conn, 1, "gone")
        with database.write() as conn:
            conn.execute(text(_turn_sql(seq=3, request_id="new", status="pending", minute=3)))
        with database.read() as conn:
            kept = turn_ops.get_turn(conn, 1, "kept")
            new = turn_ops.get_turn(conn, 1, "new")
    finally:
        database.close()
    assert kept is not None and (kept.seq, kept.status) == (1, "completed")
    assert deleted is not None and new is not None and new.id > deleted


def test_from_revision_0009_a_cancel_stored_before_is_found_by_the_sweeper(empty_url: str) -> None:
    """0010 indexes the aborted turns: the sweeper's look for a recent cancel of a running
    turn whose agent's lease lapsed in its holder's hands finds one stored before, and only
    that one (b's last turn completed; c's lease is free; d's aborted turn never started)."""
    database = Database(empty_url, pool_size=1)
    agents = (("a", "'dead'"), ("b", "'dead'"), ("c", "NULL"), ("d", "'dead'"))
    now = "CURRENT_TIMESTAMP"
    turns = [(1, "aborted", now), (2, "completed", now), (3, "aborted", now)]
    turns.append((4, "aborted", "NULL"))  # cancelled before it started
    try:
        upgrade(database, "0009")
        with database.write() as conn:
            for name, token in agents:
                conn.execute(
                    text(
                        "INSERT INTO think_agents (agent_type, agent_name, admitted, lease_token,"
                        f" lease_expires_at, created_at) VALUES ('T', '{name}', 1, {token},"
                        " '2026-12-01 10:00:00', CURRENT_TIMESTAMP)"
                    )
                )
            for agent_id, status, started in turns:
                conn.execute(
                    text(
                        "INSERT INTO think_turns (agent_id, seq, request_id, kind, trigger,"
                        " status, continuation, attempt, recoveries, messages_applied,"
                        f" created_at, started_at, completed_at) VALUES ({agent_id}, 1, 'r',"
                        f" 'submission', 'submit', '{status}', false, 1, 0, true,"
                        f" CURRENT_TIMESTAMP, {started}, CURRENT_TIMESTAMP)"
                    )
                )
        upgrade(database)
        assert current_revision(database) == HEAD
        with database.read() as conn:
            found = agent_ops.agents_with_a_lapsed_cancel(conn, within_s=3600, limit=10)
            older = agent_ops.agents_with_a_lapsed_cancel(conn, within_s=-3600, limit=10)
    finally:
        database.close()
    assert (found, older) == ([1], [])


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_look_for_lapsed_cancels_can_use_the_partial_index(empty_url: str) -> None:
    """The query spells the index's predicate so that PostgreSQL can use it, even under the
    generic plan a prepared statement switches to (sequential scans off: a plan that cannot
    use the index would still show one)."""
    database = Database(empty_url, pool_size=1)
    try:
        upgrade(database)
        with database.read() as conn:
            conn.execute(text("SET enable_seqscan = off"))
            query = agent_ops.lapsed_cancels_query()
            compiled = query.compile(conn, compile_kwargs={"render_postcompile": True})
            sql = str(compiled).replace("%(within_s)s", "$1")
            conn.execute(text(f"PREPARE look(double precision) AS {sql}"))
            conn.execute(text("SET plan_cache_mode = force_generic_plan"))
            plan = conn.execute(text("EXPLAIN EXECUTE look(60)")).scalars().all()
    finally:
        database.close()
    assert any("ix_think_turns_aborted" in line for line in plan), plan


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_an_index_migration_lets_writes_to_its_table_go_on(empty_url: str) -> None:
    """0010 builds its index ``CONCURRENTLY``: while the build waits for a transaction that
    was writing to ``think_turns`` when it began, another writer's insert goes through (a
    plain ``CREATE INDEX`` would queue its lock in front of that insert). Then the index is
    valid."""
    database = Database(empty_url, pool_size=2)
    engine = sqlalchemy.create_engine(empty_url)
    upgrader = _Upgrader(database)
    try:
        upgrade(database, "0009")
        with engine.begin() as conn:
            conn.execute(text(_AGENT_SQL), {"admitted": 3})
        with engine.connect() as writing:
            writing.execute(text(_turn_sql(seq=1, request_id="r1", status="pending", minute=1)))
            upgrader.start()  # its build waits for ``writing``'s transaction to end
            wait_for_lock_waiter(engine, on="CREATE INDEX")
            with engine.connect() as other:
                other.execute(text("SET lock_timeout = '10s'"))
                other.execute(text(_turn_sql(seq=2, request_id="r2", status="aborted", minute=2)))
                other.commit()
            writing.commit()
        upgrader.join(60)
        assert (upgrader.failed, current_revision(database)) == (None, HEAD)
        assert _index_state(engine, "ix_think_turns_aborted") == [True]
    finally:
        database.close()
        engine.dispose()


_LISTING = "ix_think_turns_status_listing"
_NEW_LISTING = "(agent_id, kind, status, created_at, request_id)"
_BUILT = f"CREATE INDEX {_LISTING}_rebuilt ON think_turns {_NEW_LISTING}"


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize("pooler", ["none", "transaction"])
@pytest.mark.parametrize(
    "left",
    [
        [f"CREATE INDEX {_LISTING}_rebuilt ON think_turns {_NEW_LISTING}"],
        [
            f"DROP INDEX {_LISTING}",
            f"CREATE INDEX {_LISTING}_rebuilt ON think_turns {_NEW_LISTING}",
        ],
        [f"DROP INDEX {_LISTING}", f"CREATE INDEX {_LISTING} ON think_turns {_NEW_LISTING}"],
    ],
    ids=["built", "old-dropped", "renamed"],
)
def test_0007_stopped_at_any_step_ends_with_its_index_when_run_again(
    empty_url: str, left: list[str], pooler: Pooler
) -> None:
    """0007 builds the new listing index beside the old one, drops the old one, renames the
    new one, then the version is recorded: an upgrade stopped after any of those steps (left
    here on a 0006 database) ends, run again, with the one index on the new columns — also
    when the upgrade run again is one transaction (a process behind a pooler)."""
    database = Database(empty_url, pool_size=1, pooler=pooler)
    try:
        upgrade(database, "0006")
        with database.write() as conn:
            for statement in left:
                conn.execute(text(statement))
        upgrade(database)
        assert current_revision(database) == HEAD
        indexes = sqlalchemy.inspect(database.engine).get_indexes("think_turns")
    finally:
        database.close()
    listing = [i for i in indexes if str(i["name"]).startswith(_LISTING)]
    assert [(i["name"], i["column_names"]) for i in listing] == [
        (_LISTING, ["agent_id", "kind", "status", "created_at", "request_id"])
    ]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_0007_run_again_after_its_rename_builds_nothing(empty_url: str) -> None:
    database = Database(empty_url, pool_size=1)
    try:
        upgrade(database, "0006")
        with database.write() as conn:
            conn.execute(text(f"DROP INDEX {_LISTING}"))
            conn.execute(text(f"CREATE INDEX {_LISTING} ON think_turns {_NEW_LISTING}"))
            before = conn.execute(text(f"SELECT '{_LISTING}'::regclass::oid")).scalar_one()
        upgrade(database)
        with database.read() as conn:
            after = conn.execute(text(f"SELECT '{_LISTING}'::regclass::oid")).scalar_one()
    finally:
        database.close()
    assert after == before  # the same index: not built again


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_an_index_built_but_not_recorded_is_kept(empty_url: str, pooler: Pooler) -> None:
    """An upgrade stopped after 0010's concurrent build, before recording it: run again,
    directly or as one transaction, it keeps the index."""
    database = Database(empty_url, pool_size=1, pooler=pooler)
    try:
        upgrade(database, "0009")
        with database.write() as conn:
            conn.execute(
                text(
                    "CREATE INDEX ix_think_turns_aborted ON think_turns (completed_at) "
                    "WHERE status = 'aborted'"
                )
            )
        upgrade(database)
        assert current_revision(database) == HEAD
    finally:
        database.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_an_index_an_interrupted_build_left_invalid_is_built_again(empty_url: str) -> None:
    """A concurrent build that failed (here: a unique index of that name over duplicates, as
    an upgrade killed mid-build leaves one) leaves an index PostgreSQL marks invalid; the
    upgrade drops it and builds the migration's own."""
    database = Database(empty_url, pool_size=1)
    engine = sqlalchemy.create_engine(empty_url, isolation_level="AUTOCOMMIT")
    try:
        upgrade(database, "0009")
        with engine.connect() as conn:
            conn.execute(text(_AGENT_SQL), {"admitted": 2})
            for seq in (1, 2):
                conn.execute(
                    text(_turn_sql(seq=seq, request_id=f"r{seq}", status="aborted", minute=seq))
                )
            with pytest.raises(sqlalchemy.exc.IntegrityError):
                conn.execute(
                    text(
                        "CREATE UNIQUE INDEX CONCURRENTLY ix_think_turns_aborted "
                        "ON think_turns (agent_id)"
                    )
                )
        assert _index_state(engine, "ix_think_turns_aborted") == [False]
        upgrade(database)
        assert current_revision(database) == HEAD
        assert _index_state(engine, "ix_think_turns_aborted") == [True]
        with engine.connect() as conn:
            definition = conn.execute(
                text("SELECT pg_get_indexdef('ix_think_turns_aborted'::regclass)")
            ).scalar_one()
        assert "(completed_at) WHERE" in definition and "UNIQUE" not in definition
    finally:
        database.close()
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize(
    "poolers",
    [("none",) * 3, ("transaction",) * 3, ("none", "transaction", "none")],
    ids=["direct", "pooled", "mixed"],
)
def test_upgrades_run_at_once_apply_each_migration_once(
    empty_url: str, poolers: tuple[Pooler, ...]
) -> None:
    """Machines deploying together each run the upgrade: one applies the migrations, the
    others wait for its lock and find the schema current (without it they raced, one
    failing on a table the other had just created; waiting on the lock inside a transaction,
    they deadlocked with the index built ``CONCURRENTLY``, which waits for older ones). A
    process told it stands behind a transaction pooler takes the lock per transaction and
    applies every migration in one. Each says what it found and left, read under the lock
    (``think-jobs db upgrade`` prints it)."""
    databases = [Database(empty_url, pool_size=1, pooler=pooler) for pooler in poolers]
    upgraders = [_Upgrader(database) for database in databases]
    try:
        for upgrader in upgraders:
            upgrader.start()
        for upgrader in upgraders:
            upgrader.join(120)
        assert [u.failed for u in upgraders] == [None] * 3
        assert {current_revision(d) for d in databases} == {HEAD}
        done = [u.done for u in upgraders if u.done is not None]
        assert sorted(done, key=lambda u: u.before or "") == [  # what each says it did
            migrate.Upgraded(None, HEAD),
            migrate.Upgraded(HEAD, HEAD),
            migrate.Upgraded(HEAD, HEAD),
        ]
    finally:
        for database in databases:
            database.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_an_upgrade_waits_for_the_lock_and_names_who_holds_it(
    empty_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(migrate, "_WAIT_LOG_S", 0.0)
    database = Database(empty_url, pool_size=1)
    engine = sqlalchemy.create_engine(empty_url)
    upgrader = _Upgrader(database)
    try:
        with engine.connect() as holder, caplog.at_level(logging.WARNING, migrate.__name__):
            holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": migrate.UPGRADE_LOCK})
            holder.commit()
            pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
            holder.commit()
            upgrader.start()
            try:
                wait_until(lambda: f"(server process {pid})" in caplog.text, 30)
                assert current_revision(database) is None  # nothing applied while it waits
            finally:
                unlock = text("SELECT pg_advisory_unlock(:key)")
                holder.execute(unlock, {"key": migrate.UPGRADE_LOCK})
                holder.commit()
                upgrader.join(60)
        assert (upgrader.failed, current_revision(database)) == (None, HEAD)
    finally:
        database.close()
        engine.dispose()


class _Upgrader(threading.Thread):
    """An upgrade on a thread of its own: what it did, or what it raised."""

    def __init__(self, database: Database) -> None:
        super().__init__(daemon=True)
        self.database = database
        self.done: migrate.Upgraded | None = None
        self.failed: BaseException | None = None

    def run(self) -> None:
        try:
            self.done = upgrade(self.database)
        except BaseException as error:  # judged by the test
            self.failed = error


def _index_state(engine: sqlalchemy.Engine, name: str) -> list[bool]:
    """Whether each index called ``name`` is valid (none: [])."""
    query = text(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = :name"
    )
    with engine.connect() as conn:
        return [bool(valid) for valid in conn.execute(query, {"name": name}).scalars()]
