"""Fault tests of issue 5 with real processes and real signals (bounded, repeatable)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.apps.agents import Support
from tests.support.builders import user, wait_for_status, wait_until
from tests.support.faults import (
    Report,
    check,
    kill_workers_while_running,
    recovered_replies,
    submit_load,
    unfinished,
)
from tests.support.processes import WorkerProcess, private_postgres
from think_jobs import StorageUnavailableError, ThinkJobs
from think_jobs.testing import worker


@pytest.mark.slow
@pytest.mark.timeout(240)  # 20 kills and their recoveries: its own wait allows 180 s
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_sigkill_workers_mid_stream_loses_nothing(
    make_jobs: Callable[..., ThinkJobs], settings_env: dict[str, str]
) -> None:
    env = {**settings_env, "THINK_JOBS_LEASE_TTL_S": "1.5", "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}
    jobs = make_jobs(lease_ttl_s=1.5)
    admitted = submit_load(jobs, agents=10, per_agent=20, words=12, delay_s=0.01)

    def spawn() -> WorkerProcess:
        return WorkerProcess(env, app="tests.apps.agents:jobs", concurrency=2, pool="threads")

    workers = [spawn(), spawn()]
    for process in workers:
        process.wait_ready()
    try:
        kills = kill_workers_while_running(
            jobs, env, admitted, kills=20, spawn=spawn, workers=workers
        )
        wait_until(lambda: unfinished(jobs, admitted) == 0, 180)
    finally:
        for process in workers:
            process.stop()
    report = check(jobs, admitted, Report("SIGKILL worker mid-stream", faults=kills))
    assert report.problems == []
    assert (report.lost, report.duplicated, report.order_violations, report.overlaps) == (
        0,
        0,
        0,
        0,
    )
    assert report.completed + report.section_9_errors == 200
    recovered = recovered_replies(jobs, admitted)
    assert recovered, "no kill hit a running turn"
    full = " ".join(f"w{i}" for i in range(12))
    assert all(text.endswith(full) for _, _, text in recovered)
    assert any(len(text) > len(full) for _, _, text in recovered)  # partial, then continuation


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_database_outage_during_submits_gives_clear_errors_and_loses_nothing(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    with private_postgres() as server:
        jobs = make_jobs(database_url=server.url)
        jobs.migrate()
        agent = jobs.get_agent(Support, "a")
        accepted: list[str] = []
        refused: list[StorageUnavailableError] = []
        with worker(jobs):
            for i in range(10):
                accepted.append(agent.submit_messages([user(str(i), f"m{i}")]).submission_id)
            server.stop()
            for i in range(10, 15):
                try:
                    accepted.append(agent.submit_messages([user(str(i), f"m{i}")]).submission_id)
                except StorageUnavailableError as error:
                    refused.append(error)
            server.start()
            for i in range(15, 20):
                accepted.append(agent.submit_messages([user(str(i), f"m{i}")]).submission_id)
            for submission_id in accepted:
                wait_for_status(agent, submission_id, "completed", timeout_s=60)
        user_ids = [m.id for m in agent.get_messages() if m.role == "user"]
    assert user_ids == [f"m{i}" for i in [*range(10), *range(15, 20)]]
    assert len(refused) == 5
    assert all("database unavailable" in str(e) for e in refused)
    assert all(e.__cause__ is not None for e in refused)
    assert len(accepted) == 15
