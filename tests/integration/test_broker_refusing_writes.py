"""A Redis that refuses writes for a while — its ``maxmemory`` reached under ``noeviction``
(the policy a Celery broker runs with), or a replica left read-only by a failover — answers
every write with an error while the connection stays up. Celery counts such errors as
unrecoverable unless ``broker_channel_error_retry`` is on: a worker that met one while
connecting or taking a message logged ``Unrecoverable error: OutOfMemoryError`` and exited,
and every worker of a fleet started under the condition did the same. A `think-jobs worker`
keeps reconnecting instead and goes on once Redis takes writes again; nothing accepted is
lost (the sweeper sends again whatever drain the refusal ate)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.apps.agents import Recorder
from tests.support.builders import directive, wait_for_status
from tests.support.processes import PrivateRedis, WorkerProcess
from think_jobs import ThinkJobs
from think_jobs.replay import rebuilds
from think_jobs.testing import wait_until

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def consumer_refused(worker: WorkerProcess) -> bool:
    """The worker's Celery consumer met a refused write and said so (whether it then waits
    or, as before, exits), or the worker exited."""
    said = worker.lines("Redis refuses writes") or worker.lines("Unrecoverable error")
    return worker.process.poll() is not None or bool(said)


def waiting_for_redis(worker: WorkerProcess) -> None:
    """Alive, and waiting for Redis to take writes again (said once, not in a storm)."""
    said = "".join(worker.output[-40:])
    assert worker.process.poll() is None, said
    assert not worker.lines("Unrecoverable error"), said
    assert len(worker.lines("Redis refuses writes")) == 1, said


@contextmanager
def memory_full(client: redis.Redis) -> Iterator[None]:
    """Redis past its ``maxmemory`` (``noeviction``): every write that may use memory is
    refused until the block ends, however much the deletes meanwhile free."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        yield
    finally:
        client.config_set("maxmemory", 0)


def test_a_worker_started_while_redis_refuses_writes_waits_and_goes_on(
    make_jobs: Callable[..., ThinkJobs],
    settings_env: dict[str, str],
    server: PrivateRedis,
    client: redis.Redis,
) -> None:
    env = {**settings_env, "THINK_JOBS_REDIS_URL": server.url, "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}
    jobs = make_jobs(redis_url=server.url, sweep_interval_s=0.5)
    agent = jobs.get_agent(Recorder, "full")
    accepted = agent.submit_messages([directive("m-1", label="before")])  # its drain is queued
    with memory_full(client):
        worker = WorkerProcess(env, app="tests.apps.agents:jobs", concurrency=2, pool="threads")
        try:
            wait_until(lambda: consumer_refused(worker), 60)
            waiting_for_redis(worker)
            found = agent.inspect_submission(accepted.submission_id)
            assert found is not None and found.status == "pending"
        except BaseException:
            worker.kill()
            raise
    try:
        wait_for_status(agent, accepted.submission_id, "completed")
        later = agent.submit_messages([directive("m-2", label="after")])
        wait_for_status(agent, later.submission_id, "completed")
        assert worker.process.poll() is None, "".join(worker.output[-40:])
    finally:
        worker.stop()
    assert not worker.lines("Unrecoverable error"), "".join(worker.output[-40:])


def test_a_running_worker_outlives_redis_refusing_writes_and_loses_nothing(
    make_jobs: Callable[..., ThinkJobs],
    settings_env: dict[str, str],
    server: PrivateRedis,
    client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One slot, busy with a turn when Redis fills up; the next agent's drain waits in the
    queue. The turn ends while writes are refused (its stream cannot be written: readers
    rebuild it from the database); kombu's bookkeeping of unacknowledged messages, as the
    worker acknowledges that drain and would take the next one, is refused too, which had
    the worker exit. Once Redis takes writes again both turns are complete and each stream,
    as a client reads it, is its stored reply."""
    journal = str(tmp_path / "journal.jsonl")  # the model's journal, off the full Redis
    monkeypatch.setenv("TJ_TEST_JOURNAL", journal)
    env = {
        **settings_env,
        "THINK_JOBS_REDIS_URL": server.url,
        "THINK_JOBS_SWEEP_INTERVAL_S": "0.5",
        "TJ_TEST_JOURNAL": journal,
    }
    jobs = make_jobs(redis_url=server.url, sweep_interval_s=0.5)
    busy, next_up = jobs.get_agent(Recorder, "busy"), jobs.get_agent(Recorder, "next")
    worker = WorkerProcess(env, app="tests.apps.agents:jobs", concurrency=1, pool="threads")
    try:
        worker.wait_ready()
        running = busy.submit_messages([directive("m-1", label="busy", hold_s=2)])
        wait_for_status(busy, running.submission_id, "running")
        waiting = next_up.submit_messages([directive("m-2", label="next")])
        with memory_full(client):
            wait_for_status(busy, running.submission_id, "completed")
            wait_until(lambda: consumer_refused(worker), 60)  # the ack, or the next drain
            waiting_for_redis(worker)
        wait_for_status(next_up, waiting.submission_id, "completed")
        assert worker.process.poll() is None, "".join(worker.output[-40:])
    finally:
        worker.stop()
    assert not worker.lines("Unrecoverable error"), "".join(worker.output[-40:])
    for agent, accepted in ((busy, running), (next_up, waiting)):
        [reply] = [m for m in agent.get_messages() if m.role == "assistant"]
        events = list(agent.stream(accepted.request_id, timeout_s=30))
        assert rebuilds([e.chunk for e in events if e.chunk is not None], reply)
