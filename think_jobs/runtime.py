"""``ThinkJobs``: the runtime object. Settings, the registry of agent classes, connections.

A thin façade: it builds the ``Services`` the engine works with (``engine.ports``), is their
``AgentDirectory`` (agent rows, classes), and offers the read methods the edges need (agents,
health, live workers, the dashboard, queue depths, admin sessions) so that the web never
reaches into storage or Redis. Nothing connects when it is created: the engine, the Redis
clients and the Celery app are made on first use, so importing a module that builds
``jobs = ThinkJobs()`` costs nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar, overload

from think_jobs import validation
from think_jobs.agent import Think
from think_jobs.db import agents as agent_ops
from think_jobs.db import dashboard as dashboard_ops
from think_jobs.db import migrate as migrations
from think_jobs.db import schedules as schedule_ops
from think_jobs.db.dialect import server_now
from think_jobs.db.engine import Database
from think_jobs.domain import policy
from think_jobs.domain.agent_rows import AgentRows
from think_jobs.domain.status import Status
from think_jobs.engine import schedules
from think_jobs.engine.ports import Services
from think_jobs.errors import (
    AgentNotRegisteredError,
    BrokerUnavailableError,
    ConfigurationError,
    ThinkJobsError,
)
from think_jobs.keys import Keys
from think_jobs.limits import Limits
from think_jobs.observe import logs, metrics
from think_jobs.reports import AgentCounts, DashboardData, Health, StuckRule
from think_jobs.results import WorkerRecord
from think_jobs.scheduled_task import validate_scheduled_tasks
from think_jobs.settings import Settings, load_settings
from think_jobs.transport import presence, web_state
from think_jobs.transport.celery_messages import is_plain_redis
from think_jobs.transport.clients import Redis, RedisClients
from think_jobs.transport.dispatch import Dispatcher
from think_jobs.transport.flags import RevocationPoller

if TYPE_CHECKING:
    from celery import Celery

AgentT = TypeVar("AgentT", bound=Think)


class ThinkJobs:
    """Everything a process needs to admit, run, stream and inspect agent turns."""

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        if settings is not None and overrides:
            raise ConfigurationError("pass either settings= or keyword overrides, not both")
        self.settings = settings if settings is not None else load_settings(**overrides)
        self.db = Database(
            self.settings.database_url,
            pool_size=self.settings.db_pool_size,
            idle_transaction_timeout_s=self.settings.db_idle_transaction_timeout_s,
            pooler=self.settings.db_pooler,
        )
        self.keys = Keys(self.settings.key_prefix)
        self.clients = RedisClients(
            self.settings.redis_url,
            publish_timeout_s=self.settings.broker_publish_timeout_s,
            stream_connections=self.settings.redis_stream_connections,
        )
        self.dispatch = Dispatcher(
            lambda: self.celery,
            self.clients,
            self.keys,
            queue=self.settings.queue,
            direct=_broker_is_the_redis(self.settings),
            built=lambda: self._celery,
        )
        self._classes: dict[str, type[Think]] = {}
        self._agent_rows = AgentRows()  # bounded: one agent per user makes millions
        self._celery: Celery | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<ThinkJobs {len(self._classes)} agent classes, db={self.db.dialect}>"

    @cached_property
    def services(self) -> Services:
        """What the engine works with in this process."""
        revocations = RevocationPoller(self.clients.redis, self.settings.cancel_poll_interval_s)
        return Services(
            self.settings, self.db, self.clients, self.keys, self.dispatch, revocations, self
        )

    # -- registry ------------------------------------------------------------------------------

    def register(self, cls: type[AgentT]) -> type[AgentT]:
        """Make an agent class known (by its ``agent_type``); usable as a class decorator.

        Scheduled tasks and the class's ``stall_timeout_s``, ``turn_timeout_s`` and
        ``max_steps`` are validated here, so a bad one fails at start-up.
        """
        if not (isinstance(cls, type) and issubclass(cls, Think)):
            raise ConfigurationError(f"{cls!r} is not a subclass of think_jobs.Think")
        known = self._classes.get(cls.agent_type)
        if known is not None and known is not cls:
            raise ConfigurationError(
                f'agent type "{cls.agent_type}" is already registered by {known.__qualname__}'
            )
        _check_turn_settings(cls)
        probe = cls(self, "__registration__")
        tasks = probe.get_scheduled_tasks()
        validate_scheduled_tasks(
            tasks, default_timezone=probe.get_default_timezone(), owner=cls.agent_type
        )
        schedules.check_fire_metadata(tasks, owner=cls.agent_type, limits=Limits.of(self.settings))
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
    def redis(self) -> Redis:
        """The pooled Redis client of this process."""
        return self.clients.redis

    @property
    def celery(self) -> Celery:
        """The Celery app (``think-jobs worker --app module:jobs`` runs it)."""
        if self._celery is None:
            with self._lock:
                if self._celery is None:
                    from think_jobs.worker.app import create_celery_app  # the one lazy edge

                    self._celery = create_celery_app(self)
        return self._celery

    @property
    def turn(self) -> Any:
        """The ``think_jobs.turn`` Celery task: an agent turn as a workflow step
        (``jobs.turn.s("Support", "customer-42")`` in a chain, group or chord)."""
        from think_jobs.engine.workflows import TURN_TASK

        return self.celery.tasks[TURN_TASK]

    def migrate(self) -> None:
        """Apply the package's Alembic migrations to ``database_url``."""
        migrations.upgrade(self.db)

    def after_fork(self) -> None:
        """In a forked child (Celery prefork): never reuse the parent's connections."""
        self.db.forget_inherited_connections()
        self.clients.forget_inherited()
        self.__dict__.pop("services", None)

    def close(self) -> None:
        """Close every connection this object opened: the database pool, the Redis clients
        and the Celery app's result-backend connections (``worker.app.close_connections``).
        A call made after it still works: it connects again."""
        self.db.close()
        self.clients.close()
        if self._celery is not None:
            from think_jobs.worker.app import close_connections  # the same lazy edge

            close_connections(self._celery)

    # -- agent rows (the engine's AgentDirectory) ----------------------------------------------

    def agent_id_of(self, agent: Any, *, create: bool) -> int | None:
        """The agent's row id; with ``create`` the row is made (and its schedules armed) on
        first use."""
        key = (agent.agent_type, agent.name)
        found = self._agent_rows.id_of(key)
        if found is not None:
            return found
        if create:
            with self.db.write() as conn:
                found = agent_ops.ensure_agent(conn, *key)
            schedules.arm_agent(self.services, agent, found)
        else:
            with self.db.read() as conn:
                found = agent_ops.find_agent_id(conn, *key)
        if found is not None:
            self._agent_rows.remember(found, key)
        return found

    def identity_of(self, agent_id: int) -> tuple[str, str] | None:
        """``(agent_type, agent_name)`` of a row id."""
        found = self._agent_rows.key_of(agent_id)
        if found is None:
            with self.db.read() as conn:
                found = agent_ops.agent_identity(conn, agent_id)
            if found is not None:
                self._agent_rows.remember(agent_id, found)
        return found

    # -- reads for operators and the web -------------------------------------------------------

    def list_agents(self) -> list[AgentCounts]:
        """Every agent, with its pending and running turns."""
        with self.db.read() as conn:
            return agent_ops.list_agents(conn)

    def queue_depths(self) -> Mapping[str, tuple[int, int]]:
        """Per agent type: (pending, running) turns; 0 for a registered type with none."""
        with self.db.read() as conn:
            counts = agent_ops.queue_counts(conn)
        found = {(agent_type, status): n for agent_type, status, n in counts}
        known = {agent_type for agent_type, _, _ in counts} | set(self.agent_types)
        return {
            t: (found.get((t, Status.PENDING), 0), found.get((t, Status.RUNNING), 0)) for t in known
        }

    def overdue_fires(self) -> Mapping[str, int]:
        """Per agent type: scheduled occurrences claimed and not fired past their re-send time
        (lost fires beat sends again once a worker listens); 0 for a registered type with
        none."""
        with self.db.read() as conn:
            found = schedule_ops.overdue_counts(conn, now=server_now(conn))
        return {t: found.get(t, 0) for t in set(found) | set(self.agent_types)}

    def configure_logging(self, *, level: int | str | None = None) -> None:
        """Configure think-jobs' loggers from ``THINK_JOBS_LOG_LEVEL`` and ``THINK_JOBS_LOG_JSON``
        (as a worker, beat and the web app do); ``level`` wins over the setting."""
        logs.configure(self.settings, level=level)

    def health(self) -> Health:
        """Whether this process reaches its database and Redis right now."""
        return Health(self._database_problem(), self._redis_problem())

    def _database_problem(self) -> str | None:
        try:
            with self.db.read() as conn:
                agent_ops.ping(conn)
        except ThinkJobsError as error:
            return str(error)
        return None

    def _redis_problem(self) -> str | None:
        try:
            self.clients.ping()
        except BrokerUnavailableError as error:
            return str(error)
        return None

    def live_workers(self) -> list[WorkerRecord]:
        """The live workers and beats (their presence records); raises
        ``BrokerUnavailableError`` when Redis cannot tell."""
        return presence.live_workers(self.clients.redis, self.keys)

    def waiting_reason(
        self, agent_type: str, *, workers: list[WorkerRecord] | None = None
    ) -> str | None:
        """Why a pending turn of ``agent_type`` cannot start given the live ``workers`` (read
        from Redis when not given), or None when a live worker consumes the queue and serves
        the type."""
        found = self.live_workers() if workers is None else workers
        return policy.waiting_reason(found, queue=self.settings.queue, agent_type=agent_type)

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition of this process's think-jobs metrics plus the queue
        gauges read from the database (what the web's ``/metrics`` serves)."""
        return metrics.exposition(self)

    def dashboard(self, *, rule: StuckRule | None = None) -> DashboardData:
        """The admin dashboard's snapshot, read in one transaction."""
        with self.db.read() as conn:  # ages by the database's clock, not this host's
            return dashboard_ops.snapshot(conn, now=server_now(conn), rule=rule)

    # -- web state (admin sessions, webhook deliveries) ----------------------------------------

    def start_admin_session(self, fingerprint: str) -> str:
        ttl_s = self.settings.admin_session_ttl_s
        return web_state.start_session(self.clients.redis, self.keys, fingerprint, ttl_s=ttl_s)

    def admin_session_fingerprint(self, session_id: str) -> str | None:
        ttl_s = self.settings.admin_session_ttl_s
        client = self.clients.redis
        return web_state.session_fingerprint(client, self.keys, session_id, ttl_s=ttl_s)

    def end_admin_session(self, session_id: str) -> None:
        web_state.end_session(self.clients.redis, self.keys, session_id)

    def end_all_admin_sessions(self) -> int:
        """Log everyone out of the admin pages; returns how many sessions ended."""
        return web_state.end_all_sessions(self.clients.redis, self.keys)

    def claim_webhook_delivery(self, delivery_id: str, agent: str, *, ttl_s: int) -> str | None:
        """Bind a webhook delivery id to the first agent it reaches; the other agent's
        address when it was already delivered elsewhere."""
        client = self.clients.redis
        return web_state.claim_delivery(client, self.keys, delivery_id, agent, ttl_s=ttl_s)


def _broker_is_the_redis(settings: Settings) -> bool:
    """Whether Celery's broker is the plain ``redis://`` server and database the runtime's
    Redis client talks to (then drains are LPUSHed directly, ``transport.dispatch``)."""
    broker = settings.effective_broker_url
    return broker == settings.redis_url and is_plain_redis(broker)


def _check_turn_settings(cls: type[Think]) -> None:
    """The class attributes each of its turns reads: None or a positive value."""
    owner = cls.__qualname__
    validation.seconds_or_none(cls.stall_timeout_s, f"{owner}.stall_timeout_s")
    validation.seconds_or_none(cls.turn_timeout_s, f"{owner}.turn_timeout_s")
    validation.steps_or_none(cls.max_steps, f"{owner}.max_steps")
