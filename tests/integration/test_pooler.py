"""think-jobs behind a connection pooler in transaction mode (a real PgBouncer in front of the
tests' PostgreSQL), as many deployments of several machines run it.

Such a pooler hands each transaction to whichever server session is free, so nothing may
belong to a session: it refuses (or drops) the ``options`` think-jobs sends at connect to
bound a session idle inside a transaction, and a statement psycopg prepared on one server
session is looked for on another. ``db_pooler="transaction"`` sends no ``options``,
prepares nothing, and sets the bound in each write transaction (``SET LOCAL``). Without it,
a pooler is named with the fix instead of failing as "database unavailable" — or, worse,
running with no bound, where a paused worker would hold its agent's row for good."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.apps.agents import Recorder
from tests.conftest import _pg_admin, _sqlalchemy_pg
from tests.support.builders import directive, wait_for_status
from tests.support.fencing_faults import Load, zombies
from tests.support.pg_sessions import left_idle_until_ended
from tests.support.pgbouncer import PgBouncer, pgbouncer
from tests.support.processes import worker_processes
from think_jobs import ConfigurationError, StorageUnavailableError, ThinkJobs
from think_jobs.db.engine import Database
from think_jobs.db.migrate import upgrade

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

POOLED = {"THINK_JOBS_DB_POOLER": "transaction"}


@pytest.fixture
def bouncer(database_url: str) -> Iterator[PgBouncer]:
    with pgbouncer(database_url, server_sessions=2) as running:
        yield running


def _stored_user_messages(jobs: ThinkJobs, name: str) -> list[str]:
    return [m.id for m in jobs.get_agent(Recorder, name).get_messages() if m.role == "user"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("", "unsupported startup parameter: options"),  # PgBouncer's default
        # it connects, without the bound: a paused process could then hold the rows it locked
        # for good, so the session is checked
        ("ignore_startup_parameters = options\n", "dropped the `options`"),
    ],
    ids=["refused", "dropped"],
)
def test_a_pooler_that_refuses_or_drops_the_sessions_options_is_named_with_the_fix(
    make_jobs: Callable[..., ThinkJobs], database_url: str, extra: str, said: str
) -> None:
    with pgbouncer(database_url, extra=extra) as pooler:
        agent = make_jobs(database_url=pooler.url_of(database_url)).get_agent(Recorder, "a")
        with pytest.raises(ConfigurationError, match="THINK_JOBS_DB_POOLER=transaction") as raised:
            agent.submit_messages([directive("m-1", label="a")])
    assert said in str(raised.value)
    assert _stored_user_messages(make_jobs(), "a") == []


def test_statements_prepared_on_one_server_session_are_not_looked_for_on_another(
    database_url: str,
) -> None:
    """Two clients, one server session: each runs its own statement often enough for psycopg
    to prepare it; psycopg names them alike, so the second finds the first's name taken."""
    with pgbouncer(
        database_url, server_sessions=1, extra="ignore_startup_parameters = options\n"
    ) as shared:
        url = shared.url_of(database_url)
        with pytest.raises(StorageUnavailableError, match="THINK_JOBS_DB_POOLER=transaction"):
            _each_runs_its_statement(url, pooler="none")
        assert _each_runs_its_statement(url, pooler="transaction") == [8, 9]


def _each_runs_its_statement(url: str, *, pooler: str) -> list[int]:
    """Two clients each run their own statement 8 times; the last results."""
    clients = [Database(url, pool_size=1, pooler=pooler) for _ in range(2)]  # type: ignore[arg-type]
    try:
        results = []
        for add, client in enumerate(clients, start=1):
            for i in range(8):
                with client.read() as conn:
                    value = conn.exec_driver_sql(f"SELECT %(i)s::int + {add}", {"i": i})
                    last = int(value.scalar_one())
            results.append(last)
        return results
    finally:
        for client in clients:
            client.close()


def test_write_transactions_carry_the_bound_through_the_pooler(
    database_url: str, bouncer: PgBouncer
) -> None:
    """The bound belongs to each write transaction, not to a session: a write left idle past
    it is ended by PostgreSQL (the next operation fails with the package's error and the pool
    goes on), and a session that a later client gets carries nothing of it."""
    database = Database(
        bouncer.url_of(database_url), pool_size=1, idle_transaction_timeout_s=0.3,
        pooler="transaction",
    )  # fmt: skip
    bound = "SHOW idle_in_transaction_session_timeout"
    try:
        with database.write() as conn:
            assert conn.exec_driver_sql(bound).scalar() == "300ms"
        with database.read() as conn:
            assert conn.exec_driver_sql(bound).scalar() == "0"
        left_idle_until_ended(database.write())
        with database.write() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        database.close()


def test_an_empty_database_is_migrated_through_the_pooler(backend: str) -> None:
    name = f"tj_{uuid.uuid4().hex[:12]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = _sqlalchemy_pg(name)
        with pgbouncer(url, server_sessions=1) as shared:
            database = Database(
                shared.url_of(url), pool_size=2, idle_transaction_timeout_s=60,
                pooler="transaction",
            )  # fmt: skip
            try:
                upgrade(database)
                with database.read() as conn:
                    tables = conn.exec_driver_sql(
                        "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'think_%%'"
                    ).scalar_one()
            finally:
                database.close()
        assert tables > 0
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_worker_runs_turns_through_the_pooler(
    make_jobs: Callable[..., ThinkJobs],
    settings_env: dict[str, str],
    database_url: str,
    bouncer: PgBouncer,
) -> None:
    """A worker process and a producer both through the pooler, two server sessions for all
    of them: each turn runs once, in order."""
    env = {**settings_env, **POOLED, "THINK_JOBS_DATABASE_URL": bouncer.url_of(database_url)}
    pooled = make_jobs(database_url=env["THINK_JOBS_DATABASE_URL"], db_pooler="transaction")
    agent = pooled.get_agent(Recorder, "pooled")
    with worker_processes(env, count=1):
        ids = [
            agent.submit_messages([directive(f"m-{n}", label=f"t{n}")]).submission_id
            for n in range(6)
        ]
        for submission_id in ids:
            wait_for_status(agent, submission_id, "completed")
    assert _stored_user_messages(make_jobs(), "pooled") == [f"m-{n}" for n in range(6)]


def test_workers_paused_past_the_lease_through_the_pooler_write_nothing_stale(
    fault_jobs: ThinkJobs, fault_env: dict[str, str], database_url: str, bouncer: PgBouncer
) -> None:
    """The fencing of issue 14 through the pooler: two workers sharing two server sessions,
    the one running a turn frozen mid-stream for three lease TTLs, twice. Judged from
    outside (a journal, the public API, the streams): every turn once, in order, nothing of a
    stale attempt stored or streamed."""
    env = {**fault_env, **POOLED, "THINK_JOBS_DATABASE_URL": bouncer.url_of(database_url)}
    load = Load(agents=3, per_agent=4, words=40, delay_s=0.03)
    report = zombies(fault_jobs, env, pauses=2, load=load, before_final_write=False)
    assert report.problems == [], "\n".join(report.problems)
    assert report.anomalies == (0, 0, 0, 0, 0, 0)
    assert report.completed == report.submissions and report.faults > 0
    assert report.recovered > 0
