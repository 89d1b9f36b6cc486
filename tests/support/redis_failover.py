"""A Redis failover as a managed Redis does one: two servers, the second replicating the
first, and a name clients connect through (a loopback proxy standing in for the DNS name a
managed Redis moves to the new primary). ``fail_over()`` promotes the replica, demotes the
old primary to a replica of it — which keeps the connections it had and answers READONLY to
their writes, and UNBLOCKED to a blocked BRPOP — and points the name at the new primary for
connections made from then on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

from tests.support.processes import PrivateRedis, private_redis
from tests.support.proxy import Proxy, proxy_to
from think_jobs.testing import wait_until


@dataclass
class Pair:
    name: Proxy  # what clients connect to
    primary: PrivateRedis
    replica: PrivateRedis

    @property
    def url(self) -> str:
        return self.name.url("redis://127.0.0.1:{port}/0")

    def fail_over(self) -> None:
        """Promote the replica, demote the primary to a replica of it, move the name."""
        new, old = self._client(self.replica), self._client(self.primary)
        try:
            new.replicaof("NO", "ONE")
            old.replicaof("127.0.0.1", self.replica.port)
        finally:
            new.close()
            old.close()
        self.name.target = ("127.0.0.1", self.replica.port)
        self.primary, self.replica = self.replica, self.primary

    @staticmethod
    def _client(server: PrivateRedis) -> redis.Redis:
        return redis.Redis.from_url(server.url, socket_timeout=5)


@contextmanager
def failover_pair() -> Iterator[Pair]:
    """Two Redis servers, the second a replica of the first (in sync), behind one name."""
    with private_redis() as primary, private_redis() as replica:
        client = redis.Redis.from_url(replica.url, socket_timeout=5)
        try:
            client.replicaof("127.0.0.1", primary.port)

            def synced() -> bool:
                return client.info("replication").get("master_link_status") == "up"

            wait_until(synced, 30)
        finally:
            client.close()
        with proxy_to(primary.port) as name:
            yield Pair(name, primary, replica)
