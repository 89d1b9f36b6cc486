"""PostgreSQL failing over to a server that refuses writes, then writable again: a session
on a read-only server (a standby, a primary demoted by a failover) stays read-only for its
whole life, even once a writable primary is back. Such a session counts as a lost connection:
the operation fails with ``StorageUnavailableError`` (nothing written) and the pool is
discarded, so the next transaction connects again. Before, a worker kept its read-only
sessions for good: every drain failed with an unexpected ``InternalError`` and the agent's
turns waited for ever once the database took writes again.

The failover is emulated on the test's own database: ``default_transaction_read_only`` set
(what every new session of the demoted server reports) and its sessions ended (as the
demotion ends them); back, the setting is cleared and nothing ends the sessions made
meanwhile."""

from __future__ import annotations

import pytest

from tests.apps.agents import Recorder, read_events
from tests.support.builders import directive, wait_for_status
from tests.support.pg_failover import read_only
from tests.support.processes import WorkerProcess, worker_processes
from think_jobs import StorageUnavailableError, Think, ThinkJobs
from think_jobs.messages import message_text
from think_jobs.replay import assemble
from think_jobs.testing import wait_until

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def refusal(agent: Think, label: str) -> str:
    """Why a submission is refused (it must be)."""
    try:
        agent.submit_messages([directive(f"m-{label}", label=label)])
    except StorageUnavailableError as error:
        return str(error)
    raise AssertionError("a read-only database accepted a submission")


def test_a_failover_to_a_read_only_server_and_back_loses_nothing_and_strands_nothing(
    fault_jobs: ThinkJobs, fault_env: dict[str, str], database_url: str
) -> None:
    jobs, env = fault_jobs, fault_env
    agent = jobs.get_agent(Recorder, "failover")
    database = database_url.rsplit("/", 1)[1]
    with worker_processes(env, count=1) as [worker]:
        running = agent.submit_messages([directive("m-1", label="a", text="w " * 60, delay_s=0.05)])
        wait_for_status(agent, running.submission_id, "running")
        with read_only(database):
            said = wait_until(lambda: _read_only_refusal(agent), 30)
            assert "read-only transaction" in said
            wait_until(lambda: _met_read_only(worker), 30)
        wait_for_status(agent, running.submission_id, "completed")
        after = agent.submit_messages([directive("m-2", label="b")])
        wait_for_status(agent, after.submission_id, "completed")
    assert not worker.lines("raised unexpected"), "".join(worker.output[-40:])
    stored = [m.id for m in agent.get_messages() if m.role == "user"]
    assert stored == ["m-1", "m-2"]  # none of the refused submissions


def test_a_final_write_refused_by_a_failover_goes_in_once_the_database_takes_writes(
    fault_jobs: ThinkJobs, fault_env: dict[str, str], database_url: str
) -> None:
    """The model has finished (the journal says ``holding``: its call returns 0.5 s later,
    then the final write) when the database fails over, shorter than the 6 s lease: the
    worker tries its final write again until it goes in, so the turn ends on its first
    attempt, its stream ended by that attempt and rebuilding the reply. Before 2026-12-06
    the write failed once, Celery retried the drain, and the turn waited for its lease to
    lapse and was finished by a recovery (attempt 2); a turn cancelled meanwhile lost what
    it had streamed since its last stored partial."""
    env = {**fault_env, "THINK_JOBS_LEASE_TTL_S": "6"}
    agent = fault_jobs.get_agent(Recorder, "final-write")
    text = " ".join(f"w{i}" for i in range(20))
    with worker_processes(env, count=1) as [worker]:
        submitted = agent.submit_messages(
            [directive("m-1", label="a", text=text, delay_s=0.01, hold_s=0.5)]
        )
        wait_until(lambda: _holding(fault_jobs, "a"), 30, interval_s=0.01)
        with read_only(database_url.rsplit("/", 1)[1]):
            wait_until(lambda: worker.lines("final write of request"), 15)
        wait_until(lambda: _answers(agent, submitted.submission_id), 10)  # our own pool, too
        found = wait_for_status(agent, submitted.submission_id, "completed")
        events = list(agent.stream(submitted.submission_id, timeout_s=10))
    assert found.attempt == 1, "".join(worker.output[-40:])
    assert events[-1].done and events[-1].attempt == 1  # the attempt ended its own stream
    (reply,) = [m for m in agent.get_messages() if m.role == "assistant"]
    assert message_text(reply) == text
    chunks = [e.chunk for e in events if e.chunk is not None]
    assert assemble(chunks, reply.id).parts == reply.parts


def _answers(agent: Think, submission_id: str) -> bool:
    """The database answers this process again (the failover ended its sessions too)."""
    try:
        agent.inspect_submission(submission_id)
    except StorageUnavailableError:
        return False
    return True


def _holding(jobs: ThinkJobs, label: str) -> bool:
    """The model call of ``label`` streamed its last word and waits before returning."""
    return any(e["what"] == "holding" and e["label"] == label for e in read_events(jobs))


def _read_only_refusal(agent: Think) -> str | None:
    """A submission's refusal that names the read-only server (the first may name the
    session the failover ended instead)."""
    said = refusal(agent, "refused")
    return said if "read-only" in said else None


def _met_read_only(worker: WorkerProcess) -> bool:
    """The worker tried to write on a read-only session (its heartbeat, a drain)."""
    return bool(worker.lines("read-only transaction"))
