"""Redis failing over under load, as a managed Redis does: the replica promoted, the old
primary demoted to a replica of it — keeping every connection it had and answering their
writes with READONLY — and the name clients connect through moved to the new primary.

Every client must leave the demoted server: the workers' Celery consumers (a blocked BRPOP
is answered UNBLOCKED, then kombu's writes READONLY) and think-jobs' own connection pools
(stream appends, drains, revocation flags), whose connections used to answer READONLY for
as long as they lived — every stream stopped growing and no drain was sent again, so the
agents waited until something closed those connections. Judged as the other fault tests
are: every submission completed once, in order, no overlap, each stream its stored reply."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.faults import Report, submit_load
from tests.support.fencing_faults import busy_worker, finish, workers
from tests.support.redis_failover import failover_pair
from think_jobs import ThinkJobs

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]


def test_a_redis_failover_under_load_loses_nothing_and_strands_nothing(
    make_jobs: Callable[..., ThinkJobs],
    settings_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = str(tmp_path / "journal.jsonl")
    monkeypatch.setenv("TJ_TEST_JOURNAL", journal)
    with failover_pair() as pair:
        fast = {"THINK_JOBS_LEASE_TTL_S": "2", "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}
        env = {**settings_env, **fast, "THINK_JOBS_REDIS_URL": pair.url, "TJ_TEST_JOURNAL": journal}
        jobs = make_jobs(redis_url=pair.url, lease_ttl_s=2, sweep_interval_s=0.5)
        admitted = submit_load(jobs, agents=4, per_agent=4, words=40, delay_s=0.03)
        with workers([env, env]) as processes:
            assert busy_worker(jobs, processes, lambda call: call["chunks"] >= 5, admitted)
            pair.fail_over()
            report = finish(jobs, admitted, Report("Redis failover", faults=1))
            exited = [p.process.pid for p in processes if p.process.poll() is not None]
        said = "".join(line for p in processes for line in p.output[-20:])
    assert report.problems == [], "\n".join(report.problems)
    assert report.anomalies == (0, 0, 0, 0, 0, 0)
    assert report.completed == report.submissions == 16
    assert exited == [], said
    assert not any(p.lines("Unrecoverable error") for p in processes), said
