"""Revocation flags: how a cancellation reaches the process running the turn within a chunk.

``cancel_submission``/``cancel_chat`` set the flag (a string with the reason and a TTL) after
writing ``aborted`` to the database, which is the record; the stream's append script reads it
with every chunk, and one ``RevocationPoller`` per process polls the flags of every attempt
running there (one MGET per ``cancel_poll_interval_s``) for a model that is slow between
chunks. If Redis is down the attempt's heartbeat still sees the status.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Protocol

import redis

from think_jobs.keys import Keys

log = logging.getLogger(__name__)


class Stoppable(Protocol):
    def stop(self, kind: str, text: str | None) -> None: ...


def set_revocation(
    client: redis.Redis, keys: Keys, agent: str, turn_id: int, reason: str | None, *, ttl_s: int
) -> None:
    """Set the turn's revocation flag; logged, not raised, when Redis is down."""
    try:
        client.set(keys.revoked(agent, turn_id), reason or "", ex=ttl_s)
    except redis.RedisError as error:
        log.warning("revocation flag not set (the heartbeat will see the status): %s", error)


def mark_swept(client: redis.Redis, keys: Keys, agent_id: int, *, ttl_s: int) -> bool:
    """Remember (with a TTL) that the sweeper sent this agent a drain; True if no mark was
    there (or Redis cannot tell: then the sweeper sends, a duplicate drain is harmless)."""
    try:
        return bool(client.set(keys.swept(agent_id), "1", nx=True, ex=ttl_s))
    except redis.RedisError:
        return True


def forget_sweep_mark(client: redis.Redis, keys: Keys, agent_id: int) -> None:
    """Drop the sweeper's mark (best effort: it expires anyway)."""
    with contextlib.suppress(redis.RedisError):
        client.delete(keys.swept(agent_id))


class RevocationPoller:
    """One thread per process polling the revocation flags of the attempts running here."""

    def __init__(self, client: redis.Redis, poll_s: float) -> None:
        self._client = client
        self._poll_s = poll_s
        self._watched: dict[str, Stoppable] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, key: str, watch: Stoppable) -> None:
        with self._lock:
            self._watched[key] = watch
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="think-jobs-revocations", daemon=True
                )
                self._thread.start()

    def forget(self, key: str) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def _loop(self) -> None:
        while True:
            time.sleep(self._poll_s)
            with self._lock:
                watched = list(self._watched.items())
            if watched:
                self._check(watched)

    def _check(self, watched: list[tuple[str, Stoppable]]) -> None:
        try:
            values = self._client.mget([key for key, _ in watched])
        except redis.RedisError:
            return  # the heartbeat's database check still sees a cancellation
        for (_, watch), value in zip(watched, values, strict=True):
            if value is not None:
                text = value.decode() if isinstance(value, bytes) else str(value)
                watch.stop("cancelled", text or None)
