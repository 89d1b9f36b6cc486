"""A private ``redis-server`` for ``think-jobs demo`` / ``dev`` when no Redis is reachable."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from think_jobs.errors import BrokerUnavailableError


def reachable(url: str, timeout_s: float = 1.0) -> bool:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=timeout_s).ping()
    except redis.RedisError:
        return False
    return True


def masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def private_redis_server() -> Iterator[str]:
    """Run ``redis-server`` on a free loopback port in a temp dir; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise BrokerUnavailableError(
            "no Redis is reachable and redis-server is not installed "
            "(Debian/Ubuntu: apt-get install redis-server)"
        )
    port = _free_port()
    directory = tempfile.mkdtemp(prefix="think-jobs-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", directory],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_until_reachable(url)
        yield url
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_reachable(url: str) -> None:
    deadline = time.monotonic() + 10
    while not reachable(url, 0.2):
        if time.monotonic() > deadline:
            raise BrokerUnavailableError(f"private redis-server at {url} did not start")
        time.sleep(0.05)
