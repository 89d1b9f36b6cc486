"""The broker transport (``transport.celery_redis``): kombu's Redis transport, publishing
through one client per channel instead of building one for every message."""

from __future__ import annotations

import json

import pytest

from think_jobs import ThinkJobs
from think_jobs.transport import celery_redis
from think_jobs.transport.dispatch import DRAIN_TASK


def test_only_plain_redis_urls_get_the_transport() -> None:
    assert celery_redis.transport_for("redis://localhost:6379/0") == celery_redis.TRANSPORT
    assert celery_redis.transport_for("rediss://localhost:6380/0") is None
    assert celery_redis.transport_for("sentinel://localhost:26379") is None


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_drains_are_published_through_one_client_per_channel(jobs: ThinkJobs) -> None:
    queue = jobs.settings.queue
    with jobs.celery.connection_for_write() as connection:
        assert isinstance(connection.transport, celery_redis.Transport)
        channel = connection.default_channel
        first = channel._create_client()
        producer = jobs.celery.amqp.Producer(channel)
        for agent_id in (7, 8):
            jobs.celery.send_task(DRAIN_TASK, args=[agent_id], queue=queue, producer=producer)
        assert channel._create_client() is first
    sent = [json.loads(raw)["headers"] for raw in jobs.redis.lrange(queue, 0, -1)]
    assert sorted(h["argsrepr"] for h in sent) == ["[7]", "[8]"]
    assert {h["task"] for h in sent} == {DRAIN_TASK}
