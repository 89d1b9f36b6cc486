"""The Celery broker transport: kombu's Redis transport with one publishing client per pool.

kombu builds a new ``redis.Redis`` for every message it publishes (``Channel._create_client``
through ``conn_or_acquire``); with redis-py 8 that alone costs about 0.1 ms of CPU, a fifth of
sending a drain, because each client fills its table of response callbacks. A client holds no
state of its own beyond its connection pool and is safe to share between threads, so a channel
here keeps the one it built and builds another only when its pool was replaced (kombu drops
its pools after a fork). Consuming (``asynchronous=True``) is kombu's own code, unchanged.

A channel whose connection was lost raises ``redis.ConnectionError`` when asked for a client
(a late ack during the consumer's restart), where kombu's own raises an AttributeError that
Celery treats as fatal.

Used for ``redis://`` brokers only (``transport_for``); ``rediss://``, Sentinel and other
brokers keep kombu's transport as their URL names it.

``restore_options`` sizes kombu's redelivery of unacknowledged messages (any Redis broker)
from the visibility timeout, so that shortening it is enough.
"""

from __future__ import annotations

import math
from typing import Any, Final

import redis
from kombu.transport import redis as kombu_redis

from think_jobs.transport.celery_messages import is_plain_redis

TRANSPORT: Final = "think_jobs.transport.celery_redis:Transport"

# kombu 5's own values: a restore scan every 10 s x 10 calls, its lock held at most 300 s.
_KOMBU_SCAN_PERIOD_S: Final = 100
_KOMBU_MUTEX_EXPIRE_S: Final = 300


class Channel(kombu_redis.Channel):
    _publishing: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        transport = self.connection
        if transport is None or transport.client is None:
            # kombu would fail here with AttributeError ("'NoneType' object has no attribute
            # 'hostname'"): a task acked (acks_late) on the channel of a connection lost
            # meanwhile, as the consumer restarts. Celery logs a broker error there and goes
            # on; the AttributeError instead stopped the worker ("Unrecoverable error", exit 0).
            raise redis.ConnectionError("the broker channel is closed: its connection was lost")
        client = self._publishing
        if client is None or client.connection_pool is not self.pool:
            client = self._publishing = super()._create_client()  # type: ignore[no-untyped-call]
        return client

    def close(self) -> None:
        """kombu's close, then the pools dropped once more: its last step gives unacknowledged
        messages back to their queue through a client it builds on a new pool, its own pools
        dropped already, and nothing closed that one's connection (a consumer restarting on a
        lost connection left one open each time; the suite's check of unclosed sockets found
        it as a test worker stopped with a drain delivered and not yet acknowledged)."""
        super().close()  # type: ignore[no-untyped-call]
        self._disconnect_pools()  # type: ignore[no-untyped-call]
        self._publishing = None


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str) -> str | None:
    """The transport to name in Celery's ``broker_transport`` for ``broker_url`` (None: the
    one its scheme names)."""
    return TRANSPORT if is_plain_redis(broker_url) else None


def restore_options(visibility_timeout_s: float) -> dict[str, Any]:
    """kombu's broker transport options for redelivering unacknowledged messages, sized from
    the visibility timeout.

    kombu looks for messages unacked past the timeout every ``unacked_restore_interval`` times
    ``unacked_restore_throttle`` seconds (100 s) and takes a lock for each look that expires
    after ``unacked_mutex_expire`` (300 s): a worker killed holding it stops every worker's
    restores until then. Both are fine for the six-hour default and dwarf a shortened timeout,
    so each is brought down to a tenth of the timeout (scans, at least 1 s apart) and to the
    timeout itself (the lock). Two workers restoring at once is harmless: kombu moves each
    message back in a transaction on the unacked hash, so only one of them moves it.
    """
    period_s = max(1, min(_KOMBU_SCAN_PERIOD_S, int(visibility_timeout_s / 10)))
    options: dict[str, Any] = {
        "visibility_timeout": visibility_timeout_s,
        "unacked_mutex_expire": max(1, min(_KOMBU_MUTEX_EXPIRE_S, math.ceil(visibility_timeout_s))),
    }
    if period_s < _KOMBU_SCAN_PERIOD_S:
        options |= {"unacked_restore_interval": period_s, "unacked_restore_throttle": 1}
    return options
