"""The broker transport (``transport.celery_redis``): kombu's Redis transport, publishing
through one client per channel instead of building one for every message; and the drain
messages think-jobs builds itself on such a broker (``transport.celery_messages``)."""

from __future__ import annotations

import base64
import json
import logging
import threading
from typing import Any

import pytest
import redis

from tests.apps.agents import Support
from tests.support.builders import user, wait_for_status
from think_jobs import ThinkJobs
from think_jobs.engine.schedules import FIRE_TASK
from think_jobs.testing import worker
from think_jobs.transport import celery_redis
from think_jobs.transport.dispatch import DRAIN_TASK, SWEEP_TASK


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


def _without_ids(raw: bytes | str) -> dict[str, Any]:
    """A queued message with what differs between two sends taken out (ids, reply address),
    and its body decoded."""
    message: dict[str, Any] = json.loads(raw)
    for key in ("id", "root_id"):
        message["headers"].pop(key)
    for key in ("correlation_id", "delivery_tag", "reply_to"):
        message["properties"].pop(key)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_drain_sent_directly_is_the_message_celery_sends(jobs: ThinkJobs) -> None:
    """On a plain Redis broker a drain is one LPUSH of a message think-jobs builds itself
    (``transport.celery_messages``): it must be, id for id, what Celery's own send writes."""
    queue = jobs.settings.queue
    assert jobs.dispatch.enqueue_drain(7) and jobs.dispatch.enqueue_drain(8, swept=True)
    assert jobs._celery is None  # sent without building the Celery app
    jobs.celery.send_task(DRAIN_TASK, args=[7], queue=queue, ignore_result=True)
    jobs.celery.send_task(
        DRAIN_TASK, args=[8], kwargs={"swept": True}, queue=queue, ignore_result=True
    )
    swept_by_celery, by_celery, swept, ours = jobs.redis.lrange(queue, 0, -1)  # newest first
    assert _without_ids(ours) == _without_ids(by_celery)
    assert _without_ids(swept) == _without_ids(swept_by_celery)
    headers = json.loads(ours)["headers"]
    assert headers["root_id"] == headers["id"] == json.loads(ours)["properties"]["correlation_id"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_drains_follow_a_global_keyprefix_set_on_the_celery_app(jobs: ThinkJobs) -> None:
    """kombu's ``global_keyprefix`` moves every queue to another key; a drain LPUSHed to the
    bare queue name would never be consumed (nor the sweeper's), so once the app has one,
    drains go through Celery's send."""
    prefix = f"{jobs.settings.key_prefix}-kombu:"
    jobs.celery.conf.broker_transport_options = {
        **jobs.celery.conf.broker_transport_options,
        "global_keyprefix": prefix,
    }
    agent = jobs.get_agent(Support, "prefixed")
    try:
        submission = agent.submit_messages([user("Hi")])
        assert jobs.redis.llen(jobs.settings.queue) == 0  # not under the bare queue name
        assert jobs.redis.llen(prefix + jobs.settings.queue) == 1
        with worker(jobs):
            wait_for_status(agent, submission.submission_id, "completed")
    finally:
        keys = list(jobs.redis.scan_iter(f"{prefix}*"))
        if keys:
            jobs.redis.delete(*keys)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_drain_task_has_one_result_backend_for_every_thread(jobs: ThinkJobs) -> None:
    """Celery keeps a result backend per thread and its tracer asks every task for one, so
    each new thread of a threads pool built a backend on its first drain (~1 ms of CPU each,
    a drain's results are never stored): the resultless tasks (drain, sweep, fire) share one."""
    seen: list[Any] = []

    def look() -> None:
        seen.append((jobs.celery.tasks[DRAIN_TASK].backend, jobs.celery.backend))

    threads = [threading.Thread(target=look) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    drain_backends = {id(drain) for drain, _ in seen}
    per_thread = {id(app) for _, app in seen}
    assert len(drain_backends) == 1 and len(per_thread) == 3
    assert jobs.celery.tasks[SWEEP_TASK].backend is seen[0][0]
    assert jobs.celery.tasks[FIRE_TASK].backend is seen[0][0]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_late_ack_on_a_lost_connection_is_a_broker_error_not_a_crash(jobs: ThinkJobs) -> None:
    """A task acked (acks_late) on the channel of a connection lost meanwhile, while the
    consumer restarts: kombu's channel raised AttributeError ("'NoneType' object has no
    attribute 'hostname'"), which Celery took as an unrecoverable error and stopped the worker
    (seen in bench.reliability's Redis restarts); it is a broker error Celery logs."""
    queue = jobs.settings.queue
    jobs.dispatch.enqueue_drain(7)
    connection = jobs.celery.connection_for_read()
    channel = connection.default_channel
    message = channel.basic_get(queue, no_ack=False)
    assert message is not None
    transport = channel.connection
    transport.client = None  # what the consumer's restart leaves on the old channel
    try:
        with pytest.raises(redis.ConnectionError):
            channel._create_client()
        errors = tuple(connection.connection_errors) + tuple(connection.channel_errors)
        message.ack_log_error(logging.getLogger("test"), errors)  # logged, not raised
    finally:
        transport.client = connection
        connection.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_channel_closed_with_a_message_unacknowledged_keeps_no_connection(
    jobs: ThinkJobs,
) -> None:
    """Closing a channel gives its unacknowledged messages back to their queue, through a
    client kombu builds on a new pool after it dropped its own; the channel drops that pool
    too (its connection was left open)."""
    queue = jobs.settings.queue
    assert jobs.dispatch.enqueue_drain(7)
    with jobs.celery.connection_for_read() as connection:
        channel = connection.channel()
        assert channel.basic_get(queue, no_ack=False) is not None  # delivered, not acked
        assert jobs.redis.llen(queue) == 0
        channel.close()
        assert (channel._pool, channel._async_pool) == (None, None)
    assert jobs.redis.llen(queue) == 1  # given back
