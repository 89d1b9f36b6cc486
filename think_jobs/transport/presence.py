"""Who is alive and what they serve: every worker (and beat) keeps a presence record in Redis.

A record (``think_jobs.results.WorkerRecord``) says which queues a worker consumes, which
agent types it has registered, its concurrency and what it is running now (Celery's
``inspect`` is the model, without the broadcast). Its writer (``think_jobs.worker.presence``)
rewrites it every ``worker_heartbeat_interval_s`` and it expires after three intervals, so a
worker that died simply disappears. Expiry is Redis's clock: no two machines' clocks are
ever compared. Keys: ``Keys.presence_index`` (a SET of record ids) and
``Keys.presence_record`` (the JSON, with a TTL); readers drop ids whose record expired.
"""

from __future__ import annotations

import contextlib

import redis
from pydantic import ValidationError

from think_jobs.errors import BrokerUnavailableError
from think_jobs.keys import Keys
from think_jobs.results import WorkerRecord

TTL_INTERVALS = 3


def ttl_s(interval_s: float) -> int:
    """How long a record outlives its last heartbeat (whole seconds, at least 2)."""
    return max(2, round(TTL_INTERVALS * interval_s))


def live_workers(client: redis.Redis, keys: Keys) -> list[WorkerRecord]:
    """Every live record, workers first, then by name. Raises ``BrokerUnavailableError``."""
    try:
        ids = sorted(_text(member) for member in client.smembers(keys.presence_index()))
        raws = client.mget([keys.presence_record(i) for i in ids]) if ids else []
    except redis.RedisError as error:
        raise BrokerUnavailableError(f"cannot read worker presence: {error}") from error
    _forget_expired(client, keys, [i for i, raw in zip(ids, raws, strict=True) if raw is None])
    records = [record for raw in raws if (record := _parsed(raw)) is not None]
    return sorted(records, key=lambda record: (record.role != "worker", record.name))


def write(
    client: redis.Redis, keys: Keys, record_id: str, record: WorkerRecord, *, ttl_s: int
) -> None:
    """Write one record (raises ``redis.RedisError``)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.set(keys.presence_record(record_id), record.model_dump_json())
        pipe.expire(keys.presence_record(record_id), ttl_s)
        pipe.sadd(keys.presence_index(), record_id)
        pipe.execute()


def remove(client: redis.Redis, keys: Keys, record_id: str) -> None:
    """Delete one record at once (a worker shutting down); best effort."""
    with contextlib.suppress(redis.RedisError):
        client.srem(keys.presence_index(), record_id)
        client.delete(keys.presence_record(record_id))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parsed(raw: bytes | str | None) -> WorkerRecord | None:
    if raw is None:
        return None
    try:
        return WorkerRecord.model_validate_json(raw)
    except ValidationError:  # written by another version: not ours to read
        return None


def _forget_expired(client: redis.Redis, keys: Keys, record_ids: list[str]) -> None:
    if record_ids:
        with contextlib.suppress(redis.RedisError):
            client.srem(keys.presence_index(), *record_ids)
