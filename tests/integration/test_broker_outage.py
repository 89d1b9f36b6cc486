"""Accepted even when the broker is down: the row is the record, the sweeper enqueues it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from tests.apps.agents import Support
from tests.support.builders import user, wait_for_status
from tests.support.processes import free_port
from think_jobs import ThinkJobs
from think_jobs.testing import worker


def test_submission_is_accepted_while_the_broker_is_down_and_runs_later(
    make_jobs: Callable[..., ThinkJobs], caplog: pytest.LogCaptureFixture
) -> None:
    dead_broker = f"redis://127.0.0.1:{free_port()}/0"
    producer = make_jobs(broker_url=dead_broker)
    with caplog.at_level(logging.WARNING, logger="think_jobs.transport.dispatch"):
        result = producer.get_agent(Support, "a").submit_messages([user("hello")])
    assert (result.accepted, result.status) == (True, "pending")
    warned = [record.getMessage() for record in caplog.records]
    assert any("could not enqueue work for Support:a (the sweeper will)" in m for m in warned)

    consumer = make_jobs()  # a worker on the working broker: its sweeper finds the row
    assert consumer.redis.llen(consumer.settings.queue) == 0
    with worker(consumer):
        wait_for_status(consumer.get_agent(Support, "a"), result.submission_id, "completed")
