"""Fixtures of the integration tests: a Redis server of their own (one they may stop, restart
or fill without touching the shared one), and the gates of the hung tool
(``tests.support.hung_tools``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support import hung_tools
from tests.support.processes import PrivateRedis, private_redis


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    """A Redis server of the test's own, on a free loopback port; stopped after the test."""
    with private_redis() as running:
        yield running


@pytest.fixture
def client(server: PrivateRedis) -> Iterator[redis.Redis]:
    """A client of ``server`` that gives up within a second when it is down."""
    connection = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
    yield connection
    connection.close()


@pytest.fixture
def gates() -> Iterator[None]:
    """Fresh gates and tool runs of ``tests.support.hung_tools`` for a test; whatever happens,
    its hung call is let go."""
    with hung_tools.gates():
        yield
