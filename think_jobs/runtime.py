"""``ThinkJobs``: the runtime object. Settings, the registry of agent classes, connections.

Nothing connects when it is created: the engine, the Redis client and the Celery app are made
on first use, so importing a module that builds ``jobs = ThinkJobs()`` costs nothing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, TypeVar, overload

import redis
from redis import ConnectionPool, Redis

from think_jobs import schedules, validation
from think_jobs.agent import Think
from think_jobs.db import agents as agent_ops
from think_jobs.db import migrate as migrations
from think_jobs.db.engine import Database
from think_jobs.dispatch import Dispatcher
from think_jobs.errors import AgentNotRegisteredError, ConfigurationError
from think_jobs.keys import Keys
from think_jobs.scheduled_task import validate_scheduled_tasks
from think_jobs.settings import Settings, load_settings
from think_jobs.watch import RevocationPoller

if TYPE_CHECKING:
    from celery import Celery

AgentT = TypeVar("AgentT", bound=Think)


class ThinkJobs:
    """Everything a process needs to admit, run, stream and inspect agent turns."""

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        if settings is not None and overrides:
            raise ConfigurationError("pass either settings= or keyword overrides, not both")
        self.settings = settings if settings is not None else load_settings(**overrides)
        self.db = Database(self.settings.database_url, pool_size=self.settings.db_pool_size)
        self.keys = Keys(self.settings.key_prefix)
        self.dispatch = Dispatcher(self)
        self._classes: dict[str, type[Think]] = {}
        self._agent_ids: dict[tuple[str, str], int] = {}
        self._identities: dict[int, tuple[str, str]] = {}
        self._redis: redis.Redis | None = None
        self._stream_connections: ConnectionPool | None = None
        self._revocations: RevocationPoller | None = None
        self._celery: Celery | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"<ThinkJobs {len(self._classes)} agent classes, db={self.db.dialect}>"

    # -- registry ------------------------------------------------------------------------------

    def register(self, cls: type[AgentT]) -> type[AgentT]:
        """Make an agent class known (by its ``agent_type``); usable as a class decorator.

        Scheduled tasks are validated here, so a bad schedule fails at start-up.
        """
        if not (isinstance(cls, type) and issubclass(cls, Think)):
            raise ConfigurationError(f"{cls!r} is not a subclass of think_jobs.Think")
        known = self._classes.get(cls.agent_type)
        if known is not None and known is not cls:
            raise ConfigurationError(
                f'agent type "{cls.agent_type}" is already registered by {known.__qualname__}'
            )
        probe = cls(self, "__registration__")
        validate_scheduled_tasks(
            probe.get_scheduled_tasks(),
            default_timezone=probe.get_default_timezone(),
            owner=cls.agent_type,
        )
        self._classes[cls.agent_type] = cls
        return cls

    def agent_class(self, agent_type: str) -> type[Think]:
        try:
            return self._classes[agent_type]
        except KeyError:
            known = ", ".join(sorted(self._classes)) or "none"
            raise AgentNotRegisteredError(
                f'unknown agent type "{agent_type}" (registered: {known}); '
                "call jobs.register(YourAgent) in the module the worker imports"
            ) from None

    @property
    def agent_types(self) -> list[str]:
        return sorted(self._classes)

    @overload
    def get_agent(self, agent: type[AgentT], name: str) -> AgentT: ...
    @overload
    def get_agent(self, agent: str, name: str) -> Think: ...
    def get_agent(self, agent: type[Think] | str, name: str) -> Think:
        """The agent ``name`` of a class (registered on first use) or of a registered type."""
        name = validation.agent_name(name)  # round-trips in a URL; InvalidInputError if not
        if isinstance(agent, str):
            return self.agent_class(agent)(self, name)
        if self._classes.get(agent.agent_type) is not agent:
            self.register(agent)
        return agent(self, name)

    def instantiate(self, agent_type: str, name: str) -> Think:
        return self.agent_class(agent_type)(self, name)

    # -- connections ---------------------------------------------------------------------------

    @property
    def redis(self) -> redis.Redis:
        if self._redis is None:
            with self._lock:
                if self._redis is None:
                    self._redis = redis.Redis.from_url(
                        self.settings.redis_url,
                        socket_connect_timeout=2,
                        socket_timeout=10,
                        health_check_interval=30,
                    )
        return self._redis

    @property
    def revocations(self) -> RevocationPoller:
        """Polls the revocation flags of every attempt running in this process (one thread)."""
        if self._revocations is None:
            client = self.redis  # takes the lock itself
            with self._lock:
                if self._revocations is None:
                    poll_s = self.settings.cancel_poll_interval_s
                    self._revocations = RevocationPoller(client, poll_s)
        return self._revocations

    @property
    def stream_redis(self) -> Redis:
        """The client a turn's stream is written with, one connection kept per thread (no pool
        round trip per chunk). Its commands time out after ``broker_publish_timeout_s``: a
        Redis that hangs delays a chunk that long (it is sent later), never the lease."""
        client: Redis | None = getattr(self._local, "stream_redis", None)
        if client is None:
            try:
                client = redis.Redis(
                    connection_pool=self._stream_pool(), single_connection_client=True
                )
            except redis.RedisError:
                return redis.Redis(connection_pool=self._stream_pool())  # fails per command
            self._local.stream_redis = client
        return client

    def _stream_pool(self) -> ConnectionPool:
        if self._stream_connections is None:
            with self._lock:
                if self._stream_connections is None:
                    timeout_s = self.settings.broker_publish_timeout_s
                    self._stream_connections = ConnectionPool.from_url(
                        self.settings.redis_url,
                        socket_connect_timeout=timeout_s,
                        socket_timeout=timeout_s,
                        health_check_interval=30,
                    )
        return self._stream_connections

    @property
    def celery(self) -> Celery:
        """The Celery app (``think-jobs worker --app module:jobs`` runs it)."""
        if self._celery is None:
            with self._lock:
                if self._celery is None:
                    from think_jobs.celery_app import create_celery_app

                    self._celery = create_celery_app(self)
        return self._celery

    @property
    def turn(self) -> Any:
        """The ``think_jobs.turn`` Celery task: an agent turn as a workflow step
        (``jobs.turn.s("Support", "customer-42")`` in a chain, group or chord)."""
        from think_jobs.workflows import TURN_TASK

        return self.celery.tasks[TURN_TASK]

    def migrate(self) -> None:
        """Apply the package's Alembic migrations to ``database_url``."""
        migrations.upgrade(self.db)

    def after_fork(self) -> None:
        """In a forked child (Celery prefork): never reuse the parent's connections."""
        self.db.forget_inherited_connections()
        self._redis = None
        self._stream_connections = None
        self._local = threading.local()

    def close(self) -> None:
        self.db.close()
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self._stream_connections is not None:
            self._stream_connections.disconnect()
            self._stream_connections = None

    # -- agent rows ----------------------------------------------------------------------------

    def agent_id_of(self, agent: Think, *, create: bool) -> int | None:
        """The agent's row id; with ``create`` the row is made on first use."""
        key = (agent.agent_type, agent.name)
        found = self._agent_ids.get(key)
        if found is not None:
            return found
        if create:
            with self.db.write() as conn:
                found = agent_ops.ensure_agent(conn, *key)
            schedules.arm_agent(self, agent, found)
        else:
            with self.db.read() as conn:
                found = agent_ops.find_agent_id(conn, *key)
        if found is not None:
            self._agent_ids[key] = found
            self._identities[found] = key
        return found

    def identity_of(self, agent_id: int) -> tuple[str, str] | None:
        """``(agent_type, agent_name)`` of a row id."""
        found = self._identities.get(agent_id)
        if found is None:
            with self.db.read() as conn:
                found = agent_ops.agent_identity(conn, agent_id)
            if found is not None:
                self._identities[agent_id] = found
        return found
