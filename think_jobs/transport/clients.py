"""The Redis clients of one process.

``redis`` is the pooled client every command uses (a 10 s socket timeout). ``stream`` is the
client a turn's stream is written with: one connection kept per thread (no pool round trip per
chunk), from a pool of its own whose commands time out after ``publish_timeout_s`` — a Redis
that hangs delays a chunk that long (it is sent later, never dropped), never the lease, which
only the database decides. Nothing connects until first used.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis import ConnectionPool, Redis

from think_jobs.errors import BrokerUnavailableError

__all__ = ["Redis", "RedisClients", "broker_errors"]


@contextmanager
def broker_errors(doing: str) -> Iterator[None]:
    """Re-raise a Redis failure inside the block as ``BrokerUnavailableError`` saying what was
    being done: the layers above this one never see the driver's exceptions."""
    try:
        yield
    except redis.RedisError as error:
        raise BrokerUnavailableError(f"Redis unavailable ({doing}): {error}") from error


class RedisClients:
    def __init__(self, url: str, *, publish_timeout_s: float) -> None:
        self._url = url
        self._publish_timeout_s = publish_timeout_s
        self._redis: Redis | None = None
        self._stream_pool: ConnectionPool | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            with self._lock:
                if self._redis is None:
                    self._redis = Redis.from_url(
                        self._url,
                        socket_connect_timeout=2,
                        socket_timeout=10,
                        health_check_interval=30,
                    )
        return self._redis

    def ping(self) -> None:
        """Raises ``BrokerUnavailableError`` unless Redis answers now."""
        with broker_errors("ping"):
            self.redis.ping()

    @property
    def stream(self) -> Redis:
        client: Redis | None = getattr(self._local, "stream", None)
        if client is None:
            try:
                client = Redis(connection_pool=self._pool(), single_connection_client=True)
            except redis.RedisError:
                return Redis(connection_pool=self._pool())  # Redis is down: fail per command
            self._local.stream = client
        return client

    def _pool(self) -> ConnectionPool:
        if self._stream_pool is None:
            with self._lock:
                if self._stream_pool is None:
                    timeout_s = self._publish_timeout_s
                    self._stream_pool = ConnectionPool.from_url(
                        self._url,
                        socket_connect_timeout=timeout_s,
                        socket_timeout=timeout_s,
                        health_check_interval=30,
                    )
        return self._stream_pool

    def forget_inherited(self) -> None:
        """In a forked child: never reuse the parent's connections."""
        self._redis = None
        self._stream_pool = None
        self._local = threading.local()

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self._stream_pool is not None:
            self._stream_pool.disconnect()
            self._stream_pool = None
