"""``think-jobs beat`` and ``think-jobs worker`` as real subprocesses, on SQLite and PostgreSQL.

Beat ticks every 0.2 s (``THINK_JOBS_BEAT_TICK_INTERVAL_S``); instead of waiting for a minute
to pass, a test moves a row's ``next_run_at`` into the past (``make_due``) and waits for what
the processes do about it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta

import pytest

from tests.apps.scheduled_agents import (
    DIGEST_PROMPT,
    Janitor,
    Lingerer,
    Reporter,
    make_due,
    read_events,
    release_key,
    stored,
    submission_for,
)
from tests.support.builders import texts, wait_for_status
from tests.support.fencing_faults import skewed
from tests.support.processes import (
    ROOT,
    BeatProcess,
    WorkerProcess,
    private_redis,
    worker_processes,
)
from tests.support.processes import beat_processes as _beat_processes
from think_jobs import Think, ThinkJobs
from think_jobs.db import schedules as schedule_ops
from think_jobs.db.dialect import server_now
from think_jobs.scheduled_task import occurrence_key
from think_jobs.scheduling import next_occurrence
from think_jobs.testing import wait_until
from think_jobs.worker.beat import fire_due

APP = "tests.apps.scheduled_agents:jobs"
TICK = {"THINK_JOBS_BEAT_TICK_INTERVAL_S": "0.2", "THINK_JOBS_SCHEDULE_RETRY_BACKOFF_S": "0.2"}
CHANGED_CODE = {
    "TJ_TEST_DIGEST_SCHEDULE": "every 2 hours",
    "TJ_TEST_EXTRA_TASK": "1",
    "TJ_TEST_DROP_NUDGE": "1",
}


def beat_processes(
    env: dict[str, str], count: int = 1
) -> AbstractContextManager[list[BeatProcess]]:
    return _beat_processes(env, count, app=APP)


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "think_jobs.cli.main", *args, "--app", APP],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def output_of(processes: list[WorkerProcess] | list[BeatProcess]) -> str:
    return "".join(line for process in processes for line in list(process.output))


@pytest.fixture
def env(settings_env: dict[str, str]) -> dict[str, str]:
    return {**settings_env, **TICK}


@pytest.fixture
def local(make_jobs: Callable[..., ThinkJobs]) -> ThinkJobs:
    """This test process's view of the same database and Redis (arms agents, reads results)."""
    jobs = make_jobs(beat_tick_interval_s=0.2)
    jobs.register(Reporter)
    jobs.register(Janitor)
    jobs.register(Lingerer)
    return jobs


def test_beat_and_a_worker_fire_an_every_minute_prompt(
    local: ThinkJobs, env: dict[str, str]
) -> None:
    agent = local.get_agent(Reporter, "acme")
    agent.start()
    with worker_processes(env, count=1, app=APP), beat_processes(env) as beats:
        due = make_due(agent, "digest")
        key = occurrence_key("Reporter", "acme", "digest", due)
        found = wait_until(lambda: submission_for(agent, key), 30, message=lambda: output_of(beats))
        done = wait_for_status(agent, found.submission_id, "completed", timeout_s=30)
        wait_until(lambda: beats[0].lines("Sending due task think_jobs.sweep"), 10)  # recovery
    assert done.metadata == {
        "kind": "digest",
        "source": "scheduled-task",
        "task_id": "digest",
        "scheduled_for": due.isoformat(),
        "schedule": "every 1 minute",
    }
    assert texts(agent)[:2] == [("user", DIGEST_PROMPT), ("assistant", f"Report: {DIGEST_PROMPT}")]
    row = stored(agent)["digest"]
    assert row.next_run_at > due and (row.next_run_at.second, row.next_run_at.microsecond) == (0, 0)
    assert f"digest of Reporter:acme for {due.isoformat()}" in beats[0].fired()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize("offset", ["+90s", "-90s"])
def test_a_beat_whose_clock_is_off_fires_by_the_databases_clock(
    local: ThinkJobs, env: dict[str, str], offset: str
) -> None:
    """Beat runs 90 s ahead of (or behind) the database server (libfaketime); an occurrence
    due 3 s from now by the database's clock fires then, not 87 s early (or 93 s late): the
    submission the fire creates is stamped by the database no earlier than the occurrence,
    and within a few of beat's 0.2 s ticks of it. (SQLite has no server clock: every process
    reads its machine's.)"""
    agent = local.get_agent(Reporter, "skewed")
    agent.start()
    with worker_processes(env, count=1, app=APP), beat_processes(skewed(env, offset)) as beats:
        with local.db.read() as conn:
            due = server_now(conn).replace(microsecond=0) + timedelta(seconds=3)
        make_due(agent, "digest", at=due)
        key = occurrence_key("Reporter", "skewed", "digest", due)
        found = wait_until(lambda: submission_for(agent, key), 30, message=lambda: output_of(beats))
    assert due <= found.created_at < due + timedelta(seconds=5)
    assert stored(agent)["digest"].next_run_at > due


def test_a_fire_lost_with_redis_restarted_empty_is_sent_again(
    make_jobs: Callable[..., ThinkJobs], env: dict[str, str]
) -> None:
    """Beat fires an occurrence while no worker runs; Redis is then restarted empty, taking
    the fire message with it. The occurrence was kept in the database until fired, so beat
    sends it again once ``schedule_fire_timeout_s`` has passed, and a worker fires it once."""
    with private_redis() as server:
        lossy = {
            **env,
            "THINK_JOBS_REDIS_URL": server.url,
            "THINK_JOBS_BROKER_URL": server.url,
            "THINK_JOBS_SCHEDULE_FIRE_TIMEOUT_S": "2",
        }
        jobs = make_jobs(redis_url=server.url, broker_url=server.url)
        jobs.register(Reporter)
        agent = jobs.get_agent(Reporter, "lost")
        agent.start()
        with beat_processes(lossy) as beats:
            due = make_due(agent, "digest")
            wait_until(lambda: fire_line("lost", due) in beats[0].fired(), 30)
            server.stop()  # the fire message was in Redis only
            server.start()
            with worker_processes(lossy, count=1, app=APP):
                key = occurrence_key("Reporter", "lost", "digest", due)
                found = wait_until(lambda: submission_for(agent, key), 30)
                wait_for_status(agent, found.submission_id, "completed", timeout_s=30)
        again = beats[0].lines(f"sent again digest of Reporter:lost for {due.isoformat()}")
    assert again  # once, or more while the worker was slow to fire it: fired once all the same
    assert [s.idempotency_key for s in agent.list_submissions()].count(key) == 1


def test_two_beats_give_one_submission_per_occurrence(
    local: ThinkJobs, env: dict[str, str]
) -> None:
    agents = [local.get_agent(Reporter, f"agent-{n}") for n in range(8)]
    for agent in agents:
        agent.start()
    with worker_processes(env, count=2, app=APP) as workers, beat_processes(env, 2) as beats:
        rounds = [fire_round(agents, beats, hours_back=hours) for hours in (0, 1, 2)]
        fire_round(agents, beats, at=rounds[0], times=2)  # the first occurrences, once more
        wait_until(lambda: output_of(workers).count(": duplicate ") >= len(agents), 30)
    fired = [line for beat in beats for line in beat.fired()]
    for times, dues in zip((2, 1, 1), rounds, strict=True):
        assert [fired.count(fire_line(name, due)) for name, due in dues.items()] == [times] * 8
    for agent in agents:
        wanted = {key_for(dues[agent.name], agent.name) for dues in rounds}
        found = [s.idempotency_key for s in agent.list_submissions(limit=100)]
        assert sorted(key for key in found if key in wanted) == sorted(wanted)
    print(f"claims per beat: {[len(beat.fired()) for beat in beats]}")


def fire_round(
    agents: Sequence[Think],
    beats: list[BeatProcess],
    *,
    hours_back: int = 0,
    at: dict[str, datetime] | None = None,
    times: int = 1,
) -> dict[str, datetime]:
    """Make one occurrence of every agent's digest due; wait until the beats have fired each
    ``times`` times in all and its submission exists. Returns the occurrences by agent name."""
    dues = {
        agent.name: make_due(
            agent, "digest", hours_back=hours_back, at=None if at is None else at[agent.name]
        )
        for agent in agents
    }

    def all_fired() -> bool:
        fired = [line for beat in beats for line in beat.fired()]
        return all(fired.count(fire_line(name, due)) >= times for name, due in dues.items())

    wait_until(all_fired, 30, message=lambda: output_of(beats)[-3000:])
    for agent in agents:
        key = key_for(dues[agent.name], agent.name)
        wait_until(lambda a=agent, k=key: submission_for(a, k), 30)  # type: ignore[misc]
    return dues


def fire_line(name: str, due: datetime) -> str:
    return f"digest of Reporter:{name} for {due.isoformat()}"


def test_a_failing_handler_is_retried_three_times_and_its_schedule_goes_on(
    local: ThinkJobs, env: dict[str, str]
) -> None:
    agent = local.get_agent(Janitor, "j")
    agent.start()
    with worker_processes(env, count=1, app=APP) as workers, beat_processes(env):
        dues = []
        for hours_back in (0, 1):  # this occurrence fails for good; the next one still fires
            made_due_at = datetime.now(UTC)
            due = make_due(agent, "flaky", hours_back=hours_back)
            key = occurrence_key("Janitor", "j", "flaky", due)
            wait_until(lambda k=key: f"({k}) failed after 3 attempts" in output_of(workers), 30)  # type: ignore[misc]
            # armed for an occurrence after the fire (not "after now": at a minute's turn the
            # next occurrence may already be now when this reads it; CI met that once)
            assert stored(agent)["flaky"].next_run_at > made_due_at
            dues.append(due)
    for due in dues:
        key = occurrence_key("Janitor", "j", "flaky", due)
        assert [e["attempt"] for e in read_events(local) if e["key"] == key] == [1, 2, 3]
    logged = output_of(workers)
    assert re.search(r"ERROR.*scheduled task flaky of Janitor:j .* failed after 3 attempts", logged)
    assert "RuntimeError: upstream down (attempt 3)" in logged


def test_a_schedule_changed_in_code_is_rearmed_when_beat_starts(
    local: ThinkJobs, env: dict[str, str]
) -> None:
    agent = local.get_agent(Reporter, "acme")
    agent.start()  # armed by the old code: every 1 minute, plus "nudge"
    changed = {**env, **CHANGED_CODE}
    started = datetime.now(UTC)
    with worker_processes(changed, count=1, app=APP), beat_processes(changed) as beats:
        rows = stored(agent)
        assert sorted(rows) == ["digest", "weekly"]
        assert rows["digest"].schedule == "every 2 hours"
        assert rows["digest"].next_run_at in {
            next_occurrence("every 2 hours", now=started),
            next_occurrence("every 2 hours", now=datetime.now(UTC)),
        }
        due = make_due(agent, "digest")
        found = wait_until(lambda: submission_for(agent, key_for(due)), 30)
    assert found.metadata["schedule"] == "every 2 hours"
    assert stored(agent)["digest"].next_run_at - due >= timedelta(hours=2)
    assert "(1 armed, 1 re-armed, 1 removed)" in output_of(beats)


def key_for(due: datetime, name: str = "acme") -> str:
    return occurrence_key("Reporter", name, "digest", due)


def test_the_cli_lists_next_runs_and_fires_a_task_now(
    local: ThinkJobs, env: dict[str, str]
) -> None:
    agent = local.get_agent(Reporter, "acme")
    agent.start()
    rows = stored(agent)
    listed = run_cli(env, "schedules", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    by_task = {row["task_id"]: row for row in json.loads(listed.stdout)}
    assert sorted(by_task) == ["digest", "nudge"]
    nudge = by_task["nudge"]
    assert datetime.fromisoformat(nudge["next_run_at"]) == rows["nudge"].next_run_at
    local_time = datetime.fromisoformat(nudge["next_run_local"])
    assert (f"{local_time:%H:%M}", nudge["timezone"]) == ("09:00", "Europe/Paris")
    table = run_cli(env, "schedules", "list").stdout
    assert "NEXT (LOCAL)" in table and "Reporter:acme" in table and "every day at 09:00" in table

    at = "2026-06-01T09:00:00+02:00"
    fired = run_cli(env, "schedules", "run", "Reporter", "acme", "digest", "--at", at)
    assert fired.returncode == 0, fired.stderr
    submission = agent.inspect_submission(fired.stdout.strip())
    assert submission is not None and submission.metadata is not None
    assert submission.idempotency_key == key_for(datetime.fromisoformat(at))
    again = run_cli(env, "schedules", "run", "Reporter", "acme", "digest", "--at", at)
    assert (again.stdout, "already submitted" in again.stderr) == (fired.stdout, True)
    unknown = run_cli(env, "schedules", "run", "Reporter", "acme", "nope")
    assert unknown.returncode == 1 and 'no scheduled task "nope"' in unknown.stderr


def test_the_cli_lists_occurrences_claimed_and_not_fired_yet(
    local: ThinkJobs, env: dict[str, str]
) -> None:
    """No worker runs: the occurrence beat claimed and sent is kept, and the listing says so
    (when beat would send it again, and which attempt)."""
    agent = local.get_agent(Reporter, "acme")
    agent.start()
    due = make_due(agent, "digest")
    assert fire_due(local) == 1
    listed = run_cli(env, "schedules", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    by_task = {row["task_id"]: row for row in json.loads(listed.stdout)}
    [unfired] = by_task["digest"]["unfired"]
    assert (unfired["scheduled_for"], unfired["attempt"], unfired["held"]) == (
        due.isoformat(),
        1,
        False,
    )
    assert datetime.fromisoformat(unfired["resend_at"]) > due
    assert by_task["nudge"]["unfired"] == []
    table = run_cli(env, "schedules", "list").stdout
    assert "1 claimed, not fired yet" in table
    assert f"Reporter:acme digest for {due.isoformat()}: attempt 1, again at" in table


def test_a_worker_stopped_while_it_fires_loses_the_occurrence_to_another(
    local: ThinkJobs, env: dict[str, str]
) -> None:
    """SIGSTOP past ``schedule_fire_timeout_s`` while a handler runs: beat sends the occurrence
    again, a second worker fires it and forgets it; the first, resumed, finishes its handler
    (it cannot be stopped) but knows it lost the occurrence, and nothing is sent again."""
    # 3 s: renewed every second, so a loaded CI box does not let the first hold lapse early
    timed = {**env, "THINK_JOBS_SCHEDULE_FIRE_TIMEOUT_S": "3"}
    agent = local.get_agent(Lingerer, "l")
    agent.start()

    def phases() -> list[tuple[str, int]]:
        return [(e["phase"], e["pid"]) for e in read_events(local)]

    def seen(phase: str, process: WorkerProcess) -> Callable[[], bool]:
        return lambda: (phase, process.process.pid) in phases()

    def state(*processes: WorkerProcess) -> Callable[[], str]:
        return lambda: f"events {phases()}\n{output_of(list(processes))}"

    with worker_processes(timed, count=1, app=APP) as [first], beat_processes(timed):
        due = make_due(agent, "linger")
        wait_until(seen("started", first), 30, message=state(first))
        table = run_cli(timed, "schedules", "list").stdout
        assert f"Lingerer:l linger for {due.isoformat()}: attempt 1, a worker is firing it" in table
        os.killpg(first.process.pid, signal.SIGSTOP)
        try:
            with worker_processes(timed, count=1, app=APP) as [second]:
                wait_until(seen("started", second), 30, message=state(second))
                local.redis.rpush(release_key(local, second.process.pid), "go")
                wait_until(seen("ended", second), 30, message=state(second))
                wait_until(lambda: kept_count(local) == 0, 30, message=state(second))
        finally:
            os.killpg(first.process.pid, signal.SIGCONT)
        wait_until(lambda: first.lines("lost its hold"), 30, message=state(first))
        local.redis.rpush(release_key(local, first.process.pid), "go")
        wait_until(seen("ended", first), 30, message=state(first))
    stopped, resumed = first.process.pid, second.process.pid
    assert phases() == [
        ("started", stopped),
        ("started", resumed),
        ("ended", resumed),
        ("ended", stopped),
    ]
    assert kept_count(local) == 0


def kept_count(jobs: ThinkJobs) -> int:
    with jobs.db.read() as conn:
        return len(schedule_ops.kept_fires(conn))
