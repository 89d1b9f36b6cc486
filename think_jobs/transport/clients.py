"""The Redis clients of one process, and how many connections each may open.

``redis`` is the client of every other command and of stream readers' subscriptions (a 10 s
socket timeout). A turn's stream is written through the *stream pool*, whose commands time out
after ``publish_timeout_s`` — a Redis that hangs delays a chunk that long (it is sent later,
never dropped), never the lease, which only the database decides.

**Both pools are bounded, and sized from the worker.** redis-py's default pool refuses the
101st connection at once ("Too many connections"); ours are ``BlockingConnectionPool``s, where
a command that finds every connection in use waits for one (2 s for ``redis``,
``publish_timeout_s`` for streams). Each running turn holds one stream connection for the
whole turn (``turn_stream``; no pool round trip per chunk) and gives it back at its end
(``release``); the client, with its connection, serves the next turn (kept idle meanwhile,
counted as held). The stream pool has ``stream_connections`` connections or, unset, the worker's
concurrency plus ``STREAM_HEADROOM`` (``size_for_concurrency``, called when a worker starts;
never fewer than 100), so every slot of a worker has its own. The pool never lends its last
few (``_reserve``) for a whole turn: should every other one be held (a smaller configured
size, turns run by blocking callers besides the worker's slots), further turns write through
a shared client that takes one of those per command, waiting up to ``publish_timeout_s``;
their chunks may come late, never lost (the stream writer keeps what it could not send and
sends it with the next chunk), and it is counted (``think_jobs_stream_connection_waits``) and
logged once. Nothing connects until first used.

Every connection of ours tells Redis what it is (``CLIENT SETINFO``) with one identity built
per process (``_IDENTITY``): redis-py 8, left to itself, reads its own version from the
installed package's metadata for each connection it makes, ~1 ms of CPU each (a worker
warming up 500 turn connections spent half a second on it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis import BlockingConnectionPool, ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from think_jobs.errors import BrokerUnavailableError
from think_jobs.observe import metrics

__all__ = ["STREAM_HEADROOM", "Redis", "RedisClients", "broker_errors"]

log = logging.getLogger(__name__)

STREAM_HEADROOM = 8  # stream connections beyond the worker's slots (blocking callers, hooks)
DEFAULT_STREAM_CONNECTIONS = 100  # outside a worker, with no size configured


def _identity() -> dict[str, Any]:
    """The connection keyword that carries our identity, where redis-py has it (8: a
    ``DriverInfo``; before 8 the version was read once, at import)."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return {}
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


_IDENTITY = _identity()


# A server answering READONLY is a replica — a primary demoted by a failover, which keeps the
# connections it had — and stays one: the connection is dropped and the command sent once more
# on a new one, to whichever server the URL's host leads now (a DNS name moved to the new
# primary). The refused command did nothing, so sending it again is safe; a connection error
# is not retried (a command may have run before it).
_RECONNECT = {"retry": Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ReadOnlyError,))}


def _reserve(size: int) -> int:
    """Stream connections never held for a whole turn: they serve, a command at a time, the
    turns that found every other one held."""
    return max(1, min(STREAM_HEADROOM // 2, size // 4))


@contextmanager
def broker_errors(doing: str) -> Iterator[None]:
    """Re-raise a Redis failure inside the block as ``BrokerUnavailableError`` saying what was
    being done: the layers above this one never see the driver's exceptions."""
    try:
        yield
    except redis.RedisError as error:
        raise BrokerUnavailableError(f"Redis unavailable ({doing}): {error}") from error


class RedisClients:
    def __init__(
        self, url: str, *, publish_timeout_s: float, stream_connections: int | None = None
    ) -> None:
        self._url = url
        self._publish_timeout_s = publish_timeout_s
        self._configured = stream_connections
        self._stream_size = stream_connections or DEFAULT_STREAM_CONNECTIONS
        self._general_size = DEFAULT_STREAM_CONNECTIONS
        self._redis: Redis | None = None
        self._stream_pool: BlockingConnectionPool | None = None
        self._shared: Redis | None = None  # takes a stream connection per command
        self._retired: list[ConnectionPool] = []
        self._holding: set[int] = set()  # ids of the turn clients holding a connection
        self._idle: list[Redis] = []  # turn clients given back, still holding theirs
        self._connecting = 0
        self._warned = False
        self._lock = threading.Lock()

    @property
    def redis(self) -> Redis:
        """The client of every other command (and of stream readers' subscriptions): a
        bounded pool of the worker's concurrency + ``STREAM_HEADROOM`` connections (at least
        100), a command waiting up to 2 s for a free one (redis-py's default pool of 100
        refuses the next at once: "Too many connections")."""
        if self._redis is None:
            with self._lock:
                if self._redis is None:
                    self._redis = Redis(connection_pool=self._general_pool())
        return self._redis

    def _general_pool(self) -> BlockingConnectionPool:
        return BlockingConnectionPool.from_url(
            self._url,
            max_connections=self._general_size,
            timeout=2,
            socket_connect_timeout=2,
            socket_timeout=10,
            health_check_interval=30,
            **_IDENTITY,
            **_RECONNECT,
        )

    def ping(self) -> None:
        """Raises ``BrokerUnavailableError`` unless Redis answers now."""
        with broker_errors("ping"):
            self.redis.ping()

    # -- the stream pool -----------------------------------------------------------------------

    @property
    def stream_connections(self) -> int:
        """The most connections the stream pool opens."""
        return self._stream_size

    def size_for_concurrency(self, concurrency: int) -> None:
        """A worker with ``concurrency`` slots starts in this process: both pools grow to one
        connection per slot plus headroom (the stream pool only if no size was configured)."""
        wanted = concurrency + STREAM_HEADROOM
        with self._lock:
            if wanted > self._general_size:
                self._general_size = wanted
                if self._redis is not None:  # what was made with the old client keeps its bound
                    self._retired.append(self._redis.connection_pool)
                    self._redis = None
            if self._configured is None and wanted > self._stream_size:
                self._stream_size = wanted
                if self._stream_pool is not None:  # turns holding one give it back there
                    self._retired.append(self._stream_pool)
                    self._stream_pool = self._shared = None
                    self._close_idle_locked()

    @property
    def stream(self) -> Redis:
        """The shared stream client: a connection per command, waiting for one up to
        ``publish_timeout_s`` (then ``redis.ConnectionError``)."""
        with self._lock:
            return self._shared_client_locked()

    def turn_stream(self) -> Redis:
        """A client holding one stream connection for one turn; give it back with ``release``.

        The pool never lends its last ``_reserve`` connections for a whole turn: when every
        other one is held, the turn gets the shared client, which takes one of those per
        command (waiting up to ``publish_timeout_s``), so no turn is left without a way to
        write. The shared client also serves a turn while Redis is down (each command fails)."""
        pool = self._pool()
        with self._lock:
            if self._idle:
                kept = self._idle.pop()
                self._holding.add(id(kept))
                return kept
            if len(self._holding) + self._connecting >= self._lendable():
                self._note_exhausted()
                return self._shared_client_locked()
            self._connecting += 1
        try:
            client: Redis | None = Redis(connection_pool=pool, single_connection_client=True)
        except redis.RedisError:
            client = None  # Redis is down: the shared client fails per command
        with self._lock:
            self._connecting -= 1
            if client is None:
                return self._shared_client_locked()
            self._holding.add(id(client))
        return client

    def _lendable(self) -> int:
        return self._stream_size - _reserve(self._stream_size)

    def _note_exhausted(self) -> None:
        metrics.STREAM_CONNECTION_WAITS.inc()
        if not self._warned:
            self._warned = True
            log.warning(
                "all %d stream connections a turn may hold are held: further turns write "
                "their streams through the %d shared ones, a command at a time (raise "
                "THINK_JOBS_REDIS_STREAM_CONNECTIONS; logged once)",
                self._lendable(), _reserve(self._stream_size),
            )  # fmt: skip

    def _shared_client_locked(self) -> Redis:
        if self._shared is None:
            self._shared = Redis(connection_pool=self._pool_locked())
        return self._shared

    def release(self, client: Redis) -> None:
        """Give back a ``turn_stream`` client. It keeps its connection for the next turn
        (building a client costs ~0.1 ms of CPU); one of a pool replaced meanwhile is closed."""
        with self._lock:
            if id(client) not in self._holding:
                return  # the shared client
            self._holding.discard(id(client))
            if client.connection_pool is self._stream_pool:
                self._idle.append(client)
                return
        client.close()

    def _pool(self) -> BlockingConnectionPool:
        pool = self._stream_pool
        if pool is None:
            with self._lock:
                pool = self._pool_locked()
        return pool

    def _pool_locked(self) -> BlockingConnectionPool:
        if self._stream_pool is None:
            timeout_s = self._publish_timeout_s
            self._stream_pool = BlockingConnectionPool.from_url(
                self._url,
                max_connections=self._stream_size,
                timeout=timeout_s,  # the wait for a free connection
                socket_connect_timeout=timeout_s,
                socket_timeout=timeout_s,
                health_check_interval=30,
                **_IDENTITY,
                **_RECONNECT,
            )
        return self._stream_pool

    def _close_idle_locked(self) -> None:
        idle, self._idle = self._idle, []
        for client in idle:
            client.close()

    # -- lifecycle -----------------------------------------------------------------------------

    def forget_inherited(self) -> None:
        """In a forked child: never reuse the parent's connections."""
        self._redis = None
        self._stream_pool = self._shared = None
        self._retired = []
        self._holding = set()
        self._idle = []  # their sockets are the parent's
        self._connecting = 0

    def close(self) -> None:
        general = None if self._redis is None else self._redis.connection_pool
        self._redis = None
        with self._lock:
            self._close_idle_locked()
        for pool in [*self._retired, general, self._stream_pool]:
            if pool is not None:
                pool.disconnect()
        self._stream_pool = self._shared = None
        self._retired = []
        self._holding = set()
        self._connecting = 0
