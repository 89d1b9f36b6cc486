"""Fixtures of the integration tests: a Redis server of their own (one they may stop, restart
or fill without touching the shared one), the gates of the hung tool
(``tests.support.hung_tools``), and the settings of the fault tests (a short lease, a quick
sweep, a journal the faults cannot touch)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.support import hung_tools
from tests.support.processes import PrivateRedis, private_redis
from think_jobs import ThinkJobs

FAST = {"THINK_JOBS_LEASE_TTL_S": "2", "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}


@pytest.fixture
def fault_env(
    settings_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The worker subprocesses' settings: the test's, a 2 s lease, a 0.5 s sweep, and the
    journal file their model calls write to (this process reads the same one)."""
    journal = str(tmp_path / "journal.jsonl")
    monkeypatch.setenv("TJ_TEST_JOURNAL", journal)
    return {**settings_env, **FAST, "TJ_TEST_JOURNAL": journal}


@pytest.fixture
def fault_jobs(make_jobs: Callable[..., ThinkJobs], fault_env: dict[str, str]) -> ThinkJobs:
    """This process's ``ThinkJobs`` with the same lease and sweep."""
    return make_jobs(lease_ttl_s=2, sweep_interval_s=0.5)


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
