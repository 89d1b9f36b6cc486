"""Scratch services for one benchmark run: a database, a Redis namespace, worker processes.

Everything created here is removed on exit: PostgreSQL databases are named ``bench_<hex>``
and dropped, SQLite files live in a temporary directory, Redis keys share one unique prefix
and queue name on Redis database 14.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.agents import AGENT_CLASSES, ready_key, register_bare_tasks
from tests.support.processes import WorkerProcess as TestWorkerProcess
from think_jobs import ThinkJobs
from think_jobs.db.engine import Database
from think_jobs.db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("BENCH_PG_URL", "postgresql://postgres:postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
APP = "bench.apps:jobs"


def pg_url(database: str) -> str:
    """The SQLAlchemy URL of a database on the admin server."""
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{database}"


def pg_admin() -> psycopg.Connection[Any]:
    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)


def migrate(url: str) -> None:
    database = Database(url, pool_size=1)
    try:
        upgrade(database)
    finally:
        database.close()


@contextmanager
def scratch_database(backend: str, *, migrated: bool = True) -> Iterator[str]:
    """A new, empty (optionally migrated) database of ``backend``; removed on exit."""
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="tj-bench-")
        url = f"sqlite:///{directory}/bench.db"
        try:
            if migrated:
                migrate(url)
            yield url
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        if migrated:
            migrate(pg_url(name))
        yield pg_url(name)
    finally:
        with pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass(frozen=True)
class Namespace:
    """This run's Redis key prefix and Celery queue."""

    redis_url: str
    prefix: str
    queue: str

    def env(self, database_url: str) -> dict[str, str]:
        """THINK_JOBS_* settings for worker subprocesses."""
        return {
            "THINK_JOBS_DATABASE_URL": database_url,
            "THINK_JOBS_REDIS_URL": self.redis_url,
            "THINK_JOBS_QUEUE": self.queue,
            "THINK_JOBS_KEY_PREFIX": self.prefix,
        }

    def key(self, *parts: object) -> str:
        """A bench-owned key under the prefix."""
        return ":".join((self.prefix, "bench", *map(str, parts)))

    @property
    def sentinel(self) -> str:
        return self.key("sentinel")

    def check_intact(self, client: redis.Redis) -> None:
        """Raise if this run's keys vanished (another process flushed the Redis database)."""
        if not client.exists(self.sentinel):
            raise RuntimeError(
                f"the keys of this run vanished from {self.redis_url}: another process flushed "
                "that Redis database during the run; rerun (or set BENCH_REDIS_URL)"
            )


_CELERY_SHARED = (
    "_kombu.binding.celeryev",
    "_kombu.binding.celery.pidbox",
    "_kombu.binding_deadlines",
)


@contextmanager
def scratch_namespace() -> Iterator[Namespace]:
    """A unique prefix and queue; their keys are deleted on exit."""
    run = uuid.uuid4().hex[:10]
    namespace = Namespace(REDIS_URL, prefix=f"bench-{run}", queue=f"bench-q-{run}")
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    shared_before = {name for name in _CELERY_SHARED if client.exists(name)}
    client.set(namespace.sentinel, "1")
    try:
        yield namespace
    finally:
        _delete_namespace(client, namespace)
        _delete_shared_if_alone(client, shared_before)
        client.close()


def _delete_namespace(client: redis.Redis, namespace: Namespace) -> None:
    keys: list[Any] = list(client.scan_iter(f"{namespace.prefix}:*", count=1000))
    queue = namespace.queue
    keys += [queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"]
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


def _delete_shared_if_alone(client: redis.Redis, existed: set[str]) -> None:
    """Celery's shared binding keys that this run created are removed only when nothing else
    is left in the database (another user of it may be relying on them)."""
    created = [name for name in _CELERY_SHARED if name not in existed]
    remaining = {key.decode() for key in client.scan_iter(count=1000)}
    if created and remaining <= set(_CELERY_SHARED):
        client.delete(*created)


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so that every scratch resource is removed on the way out."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def settings_of(env: dict[str, str]) -> dict[str, str]:
    return {key.removeprefix("THINK_JOBS_").lower(): value for key, value in env.items()}


@dataclass(frozen=True)
class Scratch:
    """One benchmark environment: a migrated database, a Redis namespace, a ThinkJobs."""

    backend: str
    database_url: str
    namespace: Namespace
    jobs: ThinkJobs

    @property
    def env(self) -> dict[str, str]:
        return self.namespace.env(self.database_url)


def bench_jobs(env: dict[str, str], **overrides: Any) -> ThinkJobs:
    """A ThinkJobs of ``env``'s THINK_JOBS_* settings with the bench agents registered."""
    jobs = ThinkJobs(**{**settings_of(env), **overrides})
    for agent_class in AGENT_CLASSES:
        jobs.register(agent_class)
    return jobs


@contextmanager
def scratch(backend: str, **overrides: Any) -> Iterator[Scratch]:
    """A migrated database + a Redis namespace + a ThinkJobs on them (with the bench agents
    and bare tasks registered, like ``bench.apps``); all removed on exit."""
    with scratch_database(backend) as url, scratch_namespace() as namespace:
        jobs = bench_jobs(namespace.env(url), **overrides)
        register_bare_tasks(jobs.celery, jobs)
        try:
            yield Scratch(backend, url, namespace, jobs)
        finally:
            jobs.close()


class WorkerProcess(TestWorkerProcess):
    """One ``think-jobs worker --app bench.apps:jobs`` subprocess (log level WARNING, so the
    figures do not include per-task INFO logging); ready when ``bench.apps`` marks it in Redis."""

    def __init__(self, env: dict[str, str], *, concurrency: int, pool: str = "threads") -> None:
        super().__init__(
            env,
            app=APP,
            concurrency=concurrency,
            pool=pool,
            log_level="WARNING",
            name="bench",
            ready_marker="",
        )

    def wait_consuming(self, client: redis.Redis, key: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not client.sismember(key, str(self.process.pid)):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("worker did not start:\n" + "".join(self.output[-40:]))
            time.sleep(0.05)

    def cpu_s(self) -> float:
        """CPU time (user + system, all threads) the process has used so far."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def worker_processes(
    run: Scratch, *, count: int, concurrency: int, extra_env: dict[str, str] | None = None
) -> Iterator[list[WorkerProcess]]:
    """``count`` worker subprocesses on ``run``'s database and queue, ready on entry."""
    env = {**run.env, **(extra_env or {})}
    workers = [WorkerProcess(env, concurrency=concurrency) for _ in range(count)]
    try:
        for process in workers:
            process.wait_consuming(run.jobs.redis, ready_key(run.jobs))
        yield workers
    finally:
        for process in workers:
            process.stop()
        run.jobs.redis.delete(ready_key(run.jobs))
