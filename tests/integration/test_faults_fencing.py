"""Fenced execution under real faults (issue 14), against real worker processes, PostgreSQL
and Redis: workers paused past the lease TTL (SIGSTOP mid-stream, and in the window before
the final write), a worker cut from PostgreSQL alone and from Redis alone (a TCP proxy that
holds bytes, as a dropping network does), workers whose clocks are 60 s off, and a dashboard
read on a host an hour ahead.

Every check is made from outside: every submission terminal, none lost, each user message
stored once, no two model calls of one agent overlapping (a journal file no fault touches),
admission order kept, no event of a stale attempt in any stream, and each completed turn's
stream — contiguous seqs, one ``done`` — rebuilding its stored reply exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from tests.apps.agents import Recorder, read_events
from tests.support.faults import Report
from tests.support.fencing_faults import (
    Load,
    _through,
    busy_worker,
    clock_skew,
    finish,
    partition,
    skewed,
    submit,
    workers,
    zombies,
)
from tests.support.proxy import proxy_to
from think_jobs import ThinkJobs
from think_jobs.db.dialect import server_now
from think_jobs.messages import message_text
from think_jobs.testing import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]

FAST = {"THINK_JOBS_LEASE_TTL_S": "2", "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}


@pytest.fixture
def fault_env(
    settings_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    journal = str(tmp_path / "journal.jsonl")
    monkeypatch.setenv("TJ_TEST_JOURNAL", journal)  # this process reads the same journal
    return {**settings_env, **FAST, "TJ_TEST_JOURNAL": journal}


@pytest.fixture
def fault_jobs(make_jobs: Callable[..., ThinkJobs], fault_env: dict[str, str]) -> ThinkJobs:
    return make_jobs(lease_ttl_s=2, sweep_interval_s=0.5)


def assert_clean(report: Report, *, took_over: bool) -> None:
    assert report.problems == [], "\n".join(report.problems)  # each with its whole timeline
    assert report.anomalies == (0, 0, 0, 0, 0, 0)
    assert report.completed == report.submissions and report.faults > 0
    # The fault hit running turns (or, cut from Redis alone, cost no worker its lease).
    assert (report.recovered > 0) is took_over, "\n".join(report.retried)


def test_workers_paused_mid_stream_past_the_lease_write_nothing_stale(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    load = Load(agents=4, per_agent=4, words=40, delay_s=0.03)
    report = zombies(fault_jobs, fault_env, pauses=3, load=load, before_final_write=False)
    assert_clean(report, took_over=True)


def test_workers_paused_before_their_final_write_never_overwrite_the_reply(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    load = Load(agents=4, per_agent=6, words=12, delay_s=0.01, hold_s=0.5)
    report = zombies(fault_jobs, fault_env, pauses=3, load=load, before_final_write=True)
    assert_clean(report, took_over=True)


def test_a_worker_cut_from_postgresql_alone_writes_nothing_stale(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    load = Load(agents=4, per_agent=4, words=40, delay_s=0.03)
    with proxy_to(5432) as proxy:
        report = partition(
            fault_jobs, fault_env, server="postgres", proxy=proxy, cuts=2, cut_s=6, load=load
        )
    assert_clean(report, took_over=True)


def test_a_worker_cut_from_postgresql_ends_its_model_call_while_the_cut_lasts(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    """Its lease renewal hangs in the partition (the proxy holds the bytes); the watch does
    not wait for it: the model call is stopped before the lease may lapse, so it has ended
    before anyone may take the turn over, not when the network heals."""
    ttl_s = float(fault_env["THINK_JOBS_LEASE_TTL_S"])
    load = Load(agents=1, per_agent=1, words=400, delay_s=0.03)  # a 12 s model call
    admitted = submit(fault_jobs, load)
    with proxy_to(5432) as proxy, workers([_through(fault_env, "postgres", proxy)]) as cut_off:
        assert busy_worker(fault_jobs, cut_off, lambda call: call["chunks"] >= 3, admitted)
        proxy.cut()
        try:
            wait_until(lambda: any(e["what"] == "end" for e in read_events(fault_jobs)), 2 * ttl_s)
        finally:
            proxy.heal()
        report = finish(fault_jobs, admitted, Report("cut", faults=1))
    assert report.problems == [], "\n".join(report.problems)
    assert report.anomalies == (0, 0, 0, 0, 0, 0)
    assert report.completed == report.submissions == 1
    agent = fault_jobs.get_agent(Recorder, "agent-0")
    (reply,) = [message_text(m) for m in agent.get_messages() if m.role == "assistant"]
    whole = " ".join(f"w{i}" for i in range(400))
    assert reply != whole and reply.endswith(" " + whole)  # the partial, then the whole rerun


def test_a_worker_cut_from_redis_alone_keeps_its_lease_and_its_stream(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    load = Load(agents=4, per_agent=4, words=40, delay_s=0.03)
    # A 4 s lease, still shorter than the 6 s cut: a lease that needed Redis would be lost. With
    # 2 s, one turn of a full parallel run on 2 cores was re-run (its timeline was not kept),
    # most likely a heartbeat starved past the 2 s lease's margin, as in the clock test below.
    env = {**fault_env, "THINK_JOBS_LEASE_TTL_S": "4"}
    with proxy_to(6379) as proxy:
        report = partition(fault_jobs, env, server="redis", proxy=proxy, cuts=2, cut_s=6, load=load)
    assert_clean(report, took_over=False)


def test_workers_with_clocks_a_minute_off_neither_overlap_nor_misorder(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    load = Load(agents=10, per_agent=6, words=6, delay_s=0.01)
    # A 4 s lease here (±60 s is still 15 of them): once, in a full parallel run on 2 cores,
    # 2 turns were re-run with a 2 s lease and no fault of this test's kind to explain it, most
    # likely a heartbeat whose commit stalled past the 2 s lease's margin.
    env = {**fault_env, "THINK_JOBS_LEASE_TTL_S": "4"}
    assert_clean(clock_skew(fault_jobs, env, load=load), took_over=False)


def test_the_dashboard_of_a_host_whose_clock_is_an_hour_off_reads_the_databases_time(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    """The admin dashboard's ages ("running for", the windows of its charts, what counts as
    stuck) are measured from the database's clock: a web host an hour ahead (libfaketime)
    takes its snapshot at the database's now, not at its own."""
    script = "from think_jobs import ThinkJobs; print(ThinkJobs().dashboard().now.isoformat())"
    env = {**os.environ, **skewed(fault_env, "+1h")}
    before = database_now(fault_jobs)
    shown = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    after = database_now(fault_jobs)
    assert before <= datetime.fromisoformat(shown.stdout.strip()) <= after


def database_now(jobs: ThinkJobs) -> datetime:
    with jobs.db.read() as conn:
        return server_now(conn)
