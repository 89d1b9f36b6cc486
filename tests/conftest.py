"""Shared fixtures: real Redis, real SQLite and PostgreSQL (migrated templates cloned per
test), real Celery workers. A service that cannot be reached fails the run loudly; run
``scripts/ensure-services redis postgres`` (scripts/test does) to start them."""

from __future__ import annotations

import gc
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from tests.support import socket_origins
from think_jobs import ThinkJobs
from think_jobs.db.engine import Database
from think_jobs.db.migrate import upgrade

socket_origins.install()  # an unclosed socket is reported with where it was made

PG_ADMIN = os.environ.get("TJ_TEST_PG_URL", "postgresql://postgres:postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("TJ_TEST_REDIS", "redis://127.0.0.1:6379")


def _worker_index(worker_id: str) -> int:
    return int(worker_id[2:]) if worker_id.startswith("gw") else 0


def _sqlalchemy_pg(database: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{database}"


def _pg_admin() -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        raise RuntimeError(
            f"PostgreSQL is not reachable at {PG_ADMIN}: {error}. "
            "Start it with scripts/ensure-services postgres."
        ) from error


@pytest.fixture(scope="session")
def redis_url(worker_id: str) -> str:
    url = f"{REDIS_BASE}/{1 + _worker_index(worker_id) % 15}"
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as error:
        raise RuntimeError(
            f"Redis is not reachable at {url}: {error}. "
            "Start it with scripts/ensure-services redis."
        ) from error
    client.close()
    return url  # shared with other test runs: every test uses its own key prefix and queue


@pytest.fixture(scope="session")
def pg_template(worker_id: str) -> Iterator[str]:
    name = f"tj_template_{worker_id}_{uuid.uuid4().hex[:8]}"  # unique per test run
    with _pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    database = Database(_sqlalchemy_pg(name), pool_size=1)
    upgrade(database)
    database.close()
    yield name
    with _pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    database = Database(f"sqlite:///{path}", pool_size=1)
    upgrade(database)
    database.close()
    return path


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A freshly migrated database of the test's backend, dropped afterwards."""
    if backend == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "think_jobs.db"
        shutil.copyfile(template, path)
        yield f"sqlite:///{path}"
        return
    template_name: str = request.getfixturevalue("pg_template")
    name = f"tj_{uuid.uuid4().hex[:12]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    yield _sqlalchemy_pg(name)
    with _pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def test_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def settings_env(database_url: str, redis_url: str, test_id: str) -> dict[str, str]:
    """The THINK_JOBS_* settings of this test, as environment variables (for subprocesses)."""
    return {
        "THINK_JOBS_DATABASE_URL": database_url,
        "THINK_JOBS_REDIS_URL": redis_url,
        "THINK_JOBS_QUEUE": f"q-{test_id}",
        "THINK_JOBS_KEY_PREFIX": f"t-{test_id}",
        "THINK_JOBS_SWEEP_INTERVAL_S": "1",
    }


@pytest.fixture
def make_jobs(settings_env: dict[str, str], redis_url: str) -> Iterator[Callable[..., ThinkJobs]]:
    """Build ThinkJobs objects on this test's database, Redis prefix and queue (like separate
    processes would). Keyword arguments override settings."""
    made: list[ThinkJobs] = []

    def factory(**overrides: Any) -> ThinkJobs:
        base = {
            key.removeprefix("THINK_JOBS_").lower(): value for key, value in settings_env.items()
        }
        jobs = ThinkJobs(**{**base, **overrides})
        made.append(jobs)
        return jobs

    yield factory
    for jobs in made:
        jobs.close()
    _clean_redis(redis_url, settings_env)


def _clean_redis(redis_url: str, settings_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(redis_url)
    prefix = settings_env["THINK_JOBS_KEY_PREFIX"]
    queue = settings_env["THINK_JOBS_QUEUE"]
    keys = list(client.scan_iter(f"{prefix}:*", count=1000))
    keys += [queue, f"_kombu.binding.{queue}"]
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    client.close()


@pytest.fixture
def jobs(make_jobs: Callable[..., ThinkJobs]) -> ThinkJobs:
    return make_jobs()


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect garbage as each test ends, so that an unclosed connection or file is reported
    (pytest turns ResourceWarning into an error) by the test that left it, not by whichever
    later test the collector happens to run in."""
    yield
    gc.collect()
