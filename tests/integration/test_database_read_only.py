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

from tests.apps.agents import Recorder
from tests.support.builders import directive, wait_for_status
from tests.support.pg_failover import read_only
from tests.support.processes import WorkerProcess, worker_processes
from think_jobs import StorageUnavailableError, Think, ThinkJobs
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


def _read_only_refusal(agent: Think) -> str | None:
    """A submission's refusal that names the read-only server (the first may name the
    session the failover ended instead)."""
    said = refusal(agent, "refused")
    return said if "read-only" in said else None


def _met_read_only(worker: WorkerProcess) -> bool:
    """The worker tried to write on a read-only session (its heartbeat, a drain)."""
    return bool(worker.lines("read-only transaction"))
