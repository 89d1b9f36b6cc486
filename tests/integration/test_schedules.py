"""SPEC §8 in one process: arming, reconciling, claiming and firing scheduled tasks, on SQLite
and PostgreSQL, with real Redis and real (in-process) Celery workers.

The clock is controlled through the data: a test moves a row's ``next_run_at`` into the past
and the code under test fires it, instead of waiting for the occurrence to come."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from tests.apps.scheduled_agents import (
    DIGEST_PROMPT,
    Janitor,
    Lingerer,
    Plain,
    Reporter,
    agent_id,
    make_due,
    read_events,
    release_key,
    stored,
    submission_for,
)
from tests.support.builders import texts, user, wait_for_status
from tests.support.processes import free_port
from think_jobs import ScheduledTask, ScheduleError, Think, ThinkJobs
from think_jobs.context import utcnow
from think_jobs.db import schedules as schedule_ops
from think_jobs.db.dialect import server_now
from think_jobs.db.tables import turns
from think_jobs.engine import schedules as schedule_api
from think_jobs.models import EchoModel
from think_jobs.observe.metrics import exposition
from think_jobs.scheduled_task import occurrence_key
from think_jobs.scheduling import next_occurrence
from think_jobs.testing import wait_until, worker
from think_jobs.worker.beat import DatabaseScheduler, claim_due, fire_due, send_overdue

FAST = {"beat_tick_interval_s": 0.2, "schedule_retry_backoff_s": 0.2}


@pytest.fixture
def sjobs(make_jobs: Callable[..., ThinkJobs]) -> ThinkJobs:
    """A runtime with the scheduled agents registered and a short tick (fast retry backoff)."""
    return with_agents(make_jobs(**FAST))


def with_agents(jobs: ThinkJobs) -> ThinkJobs:
    for cls in (Reporter, Janitor, Plain):
        jobs.register(cls)
    return jobs


def expected_metadata(task_id: str, scheduled_for: datetime, schedule: str) -> dict[str, object]:
    return {
        "source": "scheduled-task",
        "task_id": task_id,
        "scheduled_for": scheduled_for.isoformat(),
        "schedule": schedule,
    }


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured(logger_name: str) -> Iterator[list[logging.LogRecord]]:
    """Records of one logger (a handler of its own: Celery's worker setup rewires the root)."""
    handler = _Collect()
    records = handler.records
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# -- arming ------------------------------------------------------------------------------------


def test_start_arms_each_task_at_its_next_occurrence(sjobs: ThinkJobs) -> None:
    before = utcnow()
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    after = utcnow()
    rows = stored(agent)
    assert sorted(rows) == ["digest", "nudge"]
    digest, nudge = rows["digest"], rows["nudge"]
    assert (digest.schedule, digest.timezone) == ("every 1 minute", None)
    assert (nudge.schedule, nudge.timezone) == ("every day at 09:00", "Europe/Paris")
    for row in (digest, nudge):
        possible = {
            next_occurrence(row.schedule, now=t, timezone=row.timezone) for t in (before, after)
        }
        assert row.next_run_at in possible
        assert row.last_scheduled_for is None and row.last_fired_at is None
    assert nudge.next_run_at.astimezone(ZoneInfo("Europe/Paris")).hour == 9


def test_the_first_submission_arms_a_new_agent(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "fresh")
    agent.submit_messages([user("hello")])
    assert sorted(stored(agent)) == ["digest", "nudge"]


def test_an_agent_without_tasks_gets_no_rows(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Plain, "p")
    agent.start()
    assert stored(agent) == {}
    assert agent.next_runs() == {}


def test_arming_again_from_another_process_keeps_the_armed_rows(
    sjobs: ThinkJobs, make_jobs: Callable[..., ThinkJobs]
) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    moved = make_due(agent, "digest")
    other = with_agents(make_jobs(**FAST)).get_agent(Reporter, "acme")
    other.start()
    rows = stored(other)
    assert sorted(rows) == ["digest", "nudge"]
    assert rows["digest"].next_run_at == moved  # not re-armed: missing rows only


def test_next_runs_are_computed_before_the_agent_exists_then_read_from_the_rows(
    sjobs: ThinkJobs,
) -> None:
    agent = sjobs.get_agent(Reporter, "later")
    before = utcnow()
    computed = agent.next_runs()
    assert sorted(computed) == ["digest", "nudge"]
    assert before < computed["digest"] <= before + timedelta(minutes=1)
    assert sjobs.agent_id_of(agent, create=False) is None  # asking did not create it
    agent.start()
    moved = make_due(agent, "digest")
    assert agent.next_runs()["digest"] == moved


# -- reconciling with the code -----------------------------------------------------------------


def test_reconcile_rearms_changed_tasks_arms_new_ones_and_removes_dropped_ones(
    sjobs: ThinkJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = [sjobs.get_agent(Reporter, name) for name in ("a", "b")]
    for agent in agents:
        agent.start()
    monkeypatch.setenv("TJ_TEST_DIGEST_SCHEDULE", "every 2 hours")
    monkeypatch.setenv("TJ_TEST_EXTRA_TASK", "1")
    monkeypatch.setenv("TJ_TEST_DROP_NUDGE", "1")
    now = utcnow()
    report = schedule_api.reconcile(sjobs.services, now=now)
    assert (report.armed, report.rearmed, report.removed) == (2, 2, 2)
    for agent in agents:
        rows = stored(agent)
        assert sorted(rows) == ["digest", "weekly"]
        assert rows["digest"].schedule == "every 2 hours"
        assert rows["digest"].next_run_at == next_occurrence("every 2 hours", now=now)
        assert rows["weekly"].timezone == "America/New_York"
    assert schedule_api.reconcile(sjobs.services) == schedule_api.ReconcileReport(0, 0, 0)


def test_reconcile_rearms_wall_clock_tasks_when_the_default_timezone_changes(
    sjobs: ThinkJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    monkeypatch.setattr(Reporter, "get_default_timezone", lambda self: "Asia/Tokyo")
    now = utcnow()
    assert schedule_api.reconcile(sjobs.services, now=now) == schedule_api.ReconcileReport(0, 1, 0)
    nudge = stored(agent)["nudge"]
    assert nudge.timezone == "Asia/Tokyo"
    assert nudge.next_run_at == next_occurrence("every day at 09:00 in Asia/Tokyo", now=now)


def test_reconcile_leaves_rows_that_match_the_code_alone(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    make_due(agent, "digest")
    before = stored(agent)
    assert schedule_api.reconcile(sjobs.services) == schedule_api.ReconcileReport(0, 0, 0)
    assert stored(agent) == before


def test_reconcile_arms_agents_that_existed_before_their_class_had_tasks(
    sjobs: ThinkJobs,
) -> None:
    agent = sjobs.get_agent(Reporter, "old")
    agent.start()
    with sjobs.db.write() as conn:
        conn.execute(schedule_ops.schedules.delete())
    report = schedule_api.reconcile(sjobs.services)
    assert report.armed == 2
    assert sorted(stored(agent)) == ["digest", "nudge"]


# -- claiming (what beat does each tick) -------------------------------------------------------


def test_a_claim_fires_a_missed_occurrence_once_and_arms_the_next_after_now(
    sjobs: ThinkJobs,
) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    due = make_due(agent, "digest")  # eight days ago: thousands of missed minutes
    now = utcnow()
    claims = claim_due(sjobs, now=now)
    assert [(c.task_id, c.due_at) for c in claims] == [("digest", due)]
    assert claims[0].next_run_at == next_occurrence("every 1 minute", now=now)
    row = stored(agent)["digest"]
    assert (row.next_run_at, row.last_scheduled_for, row.last_fired_at) == (
        claims[0].next_run_at,
        due,
        now,
    )
    assert claim_due(sjobs, now=now) == []


def test_concurrent_beats_claim_each_occurrence_exactly_once(
    sjobs: ThinkJobs, make_jobs: Callable[..., ThinkJobs]
) -> None:
    agents = [sjobs.get_agent(Reporter, f"agent-{n}") for n in range(12)]
    for agent in agents:
        agent.start()
        make_due(agent, "digest")
    beats = [with_agents(make_jobs(**FAST)) for _ in range(4)]
    barrier = threading.Barrier(len(beats))
    claimed: list[list[tuple[int, datetime]]] = [[] for _ in beats]

    def run(index: int) -> None:
        barrier.wait()
        found = claim_due(beats[index], now=utcnow())
        claimed[index] = [(c.schedule_id, c.due_at) for c in found]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(beats))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    everything = [claim for found in claimed for claim in found]
    assert len(everything) == len(set(everything)) == len(agents)


def test_a_beat_only_claims_the_agent_types_it_knows(
    sjobs: ThinkJobs, make_jobs: Callable[..., ThinkJobs]
) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    make_due(agent, "digest")
    other = make_jobs(**FAST)
    other.register(Janitor)
    assert claim_due(other, now=utcnow()) == []
    assert len(claim_due(sjobs, now=utcnow())) == 1


def test_occurrences_whose_fires_cannot_be_sent_are_given_back(
    sjobs: ThinkJobs, make_jobs: Callable[..., ThinkJobs]
) -> None:
    agents = [sjobs.get_agent(Reporter, name) for name in ("a", "b", "c")]
    for agent in agents:
        agent.start()
    dues = [make_due(agent, "digest") for agent in agents]
    offline = with_agents(make_jobs(broker_url=f"redis://127.0.0.1:{free_port()}/0", **FAST))
    assert fire_due(offline) == 0  # all three claimed; the first send failed; none sent
    assert [stored(agent)["digest"].next_run_at for agent in agents] == dues
    assert sorted(c.due_at for c in claim_due(sjobs, now=utcnow())) == sorted(dues)


# -- firing ------------------------------------------------------------------------------------


def test_a_prompt_fire_becomes_a_scheduled_submission_and_runs_on_a_worker(
    sjobs: ThinkJobs,
) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    due = make_due(agent, "digest")
    with worker(sjobs):
        assert fire_due(sjobs) == 1
        key = occurrence_key("Reporter", "acme", "digest", due)
        found = wait_until(lambda: agent.list_submissions(), message="no submission yet")
        assert [s.idempotency_key for s in found] == [key]
        done = wait_for_status(agent, found[0].submission_id, "completed")
    assert done.metadata == {"kind": "digest", **expected_metadata("digest", due, "every 1 minute")}
    assert texts(agent) == [("user", DIGEST_PROMPT), ("assistant", f"Report: {DIGEST_PROMPT}")]
    with sjobs.db.read() as conn:
        assert conn.execute(select(turns.c.trigger)).scalars().all() == ["schedule"]


def test_an_agent_whose_name_has_a_space_gets_its_scheduled_turns(sjobs: ThinkJobs) -> None:
    """Agent names may hold inner spaces, idempotency keys may not: the occurrence key writes
    the space as ``+``, and the fire becomes a submission that runs."""
    agent = sjobs.get_agent(Reporter, "customer 42")
    agent.start()
    due = make_due(agent, "digest")
    with worker(sjobs):
        assert fire_due(sjobs) == 1
        found = wait_until(lambda: agent.list_submissions(), message="no submission yet")
        wait_for_status(agent, found[0].submission_id, "completed")
    key = occurrence_key("Reporter", "customer 42", "digest", due)
    assert key.startswith("think-schedule:Reporter:customer+42:digest:")
    assert [s.idempotency_key for s in found] == [key]


def test_the_beat_scheduler_reconciles_claims_and_sends_in_one_tick(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    due = make_due(agent, "digest")
    scheduler = DatabaseScheduler(sjobs.celery)
    with worker(sjobs):
        assert scheduler.tick() <= sjobs.settings.beat_tick_interval_s
        key = occurrence_key("Reporter", "acme", "digest", due)
        wait_until(lambda: [s.idempotency_key for s in agent.list_submissions()] == [key])
    scheduler.close()


def test_firing_the_same_occurrence_twice_adds_nothing(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    due = make_due(agent, "digest")
    first = schedule_api.fire(sjobs.services, agent_id(agent), "digest", due)
    again = schedule_api.fire(sjobs.services, agent_id(agent), "digest", due)
    submission_id = first.submission_id
    assert (first, again) == (
        schedule_api.Fired(schedule_api.FireOutcome.SUBMITTED, submission_id),
        schedule_api.Fired(schedule_api.FireOutcome.DUPLICATE, submission_id),
    )
    assert len(agent.list_submissions()) == 1


def test_a_prompt_function_gets_the_occurrence_context(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    when = datetime(2026, 3, 29, 7, 0, tzinfo=UTC)  # 09:00 in Paris, the day clocks go forward
    result = agent.run_scheduled_task("nudge", scheduled_for=when)
    assert result is not None
    key = occurrence_key("Reporter", "acme", "nudge", when)
    with worker(sjobs):
        wait_for_status(agent, result.submission_id, "completed")
    assert texts(agent)[0] == ("user", f"Nudge for {when.isoformat()} in Europe/Paris ({key})")


def test_a_worker_whose_code_lacks_a_task_beat_schedules_gives_its_occurrence_back(
    sjobs: ThinkJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling deploy, beat first: beat's code declares ``nudge`` (a new or renamed task)
    and keeps a claimed occurrence of it; a worker still on the old code gets it and lacks
    the task. It gives the occurrence back, as a worker that does not serve the agent type
    does, instead of forgetting it (it was lost: nothing sent it again once the workers had
    the new code)."""
    jobs = with_agents(sjobs)
    agent = jobs.get_agent(Reporter, "deploy")
    agent.start()
    due = due_alone(agent, "nudge")
    [claim] = [c for c in claim_due(jobs) if c.task_id == "nudge"]
    monkeypatch.setenv("TJ_TEST_DROP_NUDGE", "1")  # the old worker's code
    fired = schedule_api.fire(jobs.services, agent_id(agent), "nudge", claim.due_at, kept=True)
    monkeypatch.delenv("TJ_TEST_DROP_NUDGE")
    assert fired.outcome is schedule_api.FireOutcome.REMOVED
    with jobs.db.read() as conn:
        kept = [(f.task_id, f.due_at) for f in schedule_ops.kept_fires(conn)]
    assert ("nudge", due) in kept
    again = schedule_api.fire(jobs.services, agent_id(agent), "nudge", claim.due_at, kept=True)
    assert again.outcome is schedule_api.FireOutcome.SUBMITTED  # by an upgraded worker


def test_one_class_whose_tasks_cannot_be_read_does_not_stop_the_others(
    make_jobs: Callable[..., ThinkJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``FlakyTasks`` was valid when registered; later its ``get_scheduled_tasks()`` raises
    (a flag service down). Beat's reconcile logs it and goes on: ``Reporter``'s occurrence
    is claimed (the reconcile raised, every pass ended there, and no schedule of any class
    fired)."""
    jobs = with_agents(make_jobs(**FAST))
    jobs.register(FlakyTasks)
    agent = jobs.get_agent(Reporter, "innocent")
    agent.start()
    due = due_alone(agent, "digest")
    monkeypatch.setenv("TJ_TEST_TASKS_BROKEN", "1")
    scheduler = DatabaseScheduler(jobs.celery)
    try:
        with captured("think_jobs.engine.schedules") as records:
            scheduler.tick()
    finally:
        scheduler.close()
    assert stored(agent)["digest"].next_run_at > due
    assert any("schedules of FlakyTasks not reconciled" in r.getMessage() for r in records)


class FlakyTasks(Think):
    """Valid at registration; its tasks cannot be read while ``TJ_TEST_TASKS_BROKEN`` is set."""

    def get_model(self) -> EchoModel:
        return EchoModel()

    def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
        if os.environ.get("TJ_TEST_TASKS_BROKEN"):
            raise RuntimeError("feature-flag service unreachable")
        return {"ping": ScheduledTask("every 1 hour", prompt="ping")}


def test_a_fire_for_a_task_removed_from_the_code_does_nothing(
    sjobs: ThinkJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    monkeypatch.setenv("TJ_TEST_DROP_NUDGE", "1")
    removed = schedule_api.fire(sjobs.services, agent_id(agent), "nudge", utcnow())
    assert removed.outcome is schedule_api.FireOutcome.REMOVED
    unknown = schedule_api.fire(sjobs.services, 987_654, "nudge", utcnow())
    assert unknown.outcome is schedule_api.FireOutcome.UNKNOWN_AGENT
    assert agent.list_submissions() == []


def due_alone(agent: Think, task_id: str) -> datetime:
    """``make_due`` for ``task_id``, with the agent's other tasks moved a day ahead: "every 1
    minute" would otherwise come due too whenever the test crosses a minute boundary."""
    later = utcnow() + timedelta(days=1)
    for other in stored(agent):
        if other != task_id:
            make_due(agent, other, at=later)
    return make_due(agent, task_id)


def beat_tick(
    jobs: ThinkJobs, records: list[logging.LogRecord], level: int, ending: str = ""
) -> list[logging.LogRecord]:
    """One tick of beat (it sends each next attempt of a failed fire once its backoff has
    passed); then the records at ``level`` ending with ``ending``."""
    fire_due(jobs)
    return [r for r in records if r.levelno == level and r.getMessage().endswith(ending)]


def test_a_failing_handler_is_retried_up_to_max_attempts_and_the_next_run_stays_armed(
    sjobs: ThinkJobs,
) -> None:
    agent = sjobs.get_agent(Janitor, "j")
    agent.start()
    due = due_alone(agent, "flaky")
    # the occurrence the test made due: "every 1 minute", so a test that crosses a minute
    # also fires the schedule's own next one (CI met it at 02:56:00), under another key
    key = occurrence_key("Janitor", "j", "flaky", due)

    def ours(level: int) -> list[str]:
        return [r.getMessage() for r in records if r.levelno == level and key in r.getMessage()]

    with captured("think_jobs.engine.schedules") as records, worker(sjobs):
        fired_after = utcnow()
        assert fire_due(sjobs) == 1
        wait_until(lambda: beat_tick(sjobs, records, logging.ERROR) and ours(logging.ERROR))
    gave_up = ours(logging.ERROR)
    assert "failed after 3 attempts" in gave_up[0]
    events = read_events(sjobs)
    assert [e["attempt"] for e in events if e["key"] == key] == [1, 2, 3]
    warnings = ours(logging.WARNING)
    assert ["retrying in 0.2 s" in warnings[0], "retrying in 0.4 s" in warnings[1]] == [True, True]
    row = stored(agent)["flaky"]
    last = row.last_scheduled_for
    assert last is not None and due <= last <= utcnow()  # ours, or the next one fired since
    # Armed for the schedule's next occurrence after the firing (not the retries' end: with
    # "every 1 minute" that may come while the retries still run).
    assert row.next_run_at > fired_after > due


def test_a_handler_that_recovers_runs_until_it_succeeds(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Janitor, "j")
    agent.start()
    due = due_alone(agent, "recovers")
    with captured("think_jobs.engine.schedules") as records, worker(sjobs):
        assert fire_due(sjobs) == 1
        wait_until(lambda: beat_tick(sjobs, records, logging.INFO, ": handled"))
    # the occurrence the test made due: a test that crosses a five-minute boundary also fires
    # the schedule's own next one (CI met it at 02:00:00)
    key = occurrence_key("Janitor", "j", "recovers", due)
    assert [e["attempt"] for e in read_events(sjobs) if e["key"] == key] == [1, 2, 3]
    assert not [r for r in records if r.levelno >= logging.ERROR]


# -- kept occurrences: a lost fire is sent again ---------------------------------------------


def kept(jobs: ThinkJobs) -> list[tuple[int, datetime, int]]:
    """Occurrences beat keeps until fired: (schedule id, due, attempt)."""
    with jobs.db.read() as conn:
        return [(f.schedule_id, f.due_at, f.attempt) for f in schedule_ops.kept_fires(conn)]


def overdue_gauge(jobs: ThinkJobs) -> dict[str, float]:
    """``think_jobs_overdue_fires`` by agent type, as a scrape of the metrics reads it."""
    families = text_string_to_metric_families(exposition(jobs).decode())
    [family] = [f for f in families if f.name == "think_jobs_overdue_fires"]
    return {sample.labels["agent_type"]: sample.value for sample in family.samples}


def lose_queued_messages(jobs: ThinkJobs) -> int:
    """What a broker restarted empty does to the messages waiting in the queue."""
    return int(jobs.redis.delete(jobs.settings.queue))


def test_a_fire_lost_before_any_worker_took_it_is_sent_again_after_the_timeout(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    sjobs = with_agents(make_jobs(**FAST, schedule_fire_timeout_s=1.0))
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    due = due_alone(agent, "digest")
    key = occurrence_key("Reporter", "acme", "digest", due)
    assert fire_due(sjobs) == 1
    [(_, kept_due, attempt)] = kept(sjobs)
    assert (kept_due, attempt) == (due, 1)
    assert lose_queued_messages(sjobs) == 1
    assert fire_due(sjobs) == 0  # within the timeout: nothing is sent twice
    later = utcnow() + timedelta(seconds=2)  # past it, but no worker consumes the queue:
    assert send_overdue(sjobs, now=later) == 0  # a message would only wait (one per timeout)
    assert sjobs.redis.llen(sjobs.settings.queue) == 0
    assert [attempt for _, _, attempt in kept(sjobs)] == [1]
    wait_until(lambda: overdue_gauge(sjobs) == {"Janitor": 0, "Plain": 0, "Reporter": 1}, 10)
    with worker(sjobs):
        found = wait_until(lambda: (fire_due(sjobs), submission_for(agent, key))[1], 30)
        wait_for_status(agent, found.submission_id, "completed")
        wait_until(lambda: not kept(sjobs), 10)
    assert overdue_gauge(sjobs)["Reporter"] == 0
    [submission] = [s for s in agent.list_submissions() if s.idempotency_key == key]
    assert submission.metadata["scheduled_for"] == due.isoformat()  # type: ignore[index]


def test_a_fired_occurrence_is_forgotten_and_never_sent_again(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    sjobs = with_agents(make_jobs(**FAST, schedule_fire_timeout_s=0.5))
    agent = sjobs.get_agent(Reporter, "acme")
    agent.start()
    due = due_alone(agent, "digest")
    with worker(sjobs):
        assert fire_due(sjobs) == 1
        wait_until(lambda: not kept(sjobs), 30)
        later = utcnow() + timedelta(seconds=1)  # past the timeout: a kept one would be due
        assert send_overdue(sjobs, now=later) == 0
    key = occurrence_key("Reporter", "acme", "digest", due)
    assert [s.idempotency_key for s in agent.list_submissions()].count(key) == 1


def test_a_fire_sent_again_after_it_was_fired_does_nothing(sjobs: ThinkJobs) -> None:
    """Its first message was only late: the second finds the occurrence no longer kept."""
    agent = sjobs.get_agent(Janitor, "j")
    agent.start()
    due = due_alone(agent, "tidy")
    with worker(sjobs):
        assert fire_due(sjobs) == 1
        wait_until(lambda: read_events(sjobs) and not kept(sjobs), 30)
    again = schedule_api.fire(sjobs.services, agent_id(agent), "tidy", due, kept=True)
    assert again == schedule_api.Fired(schedule_api.FireOutcome.FIRED_ALREADY)
    assert len(read_events(sjobs)) == 1  # the handler ran once


def test_a_fire_message_of_an_older_beat_is_still_fired_and_retried_by_celery(
    sjobs: ThinkJobs,
) -> None:
    """Messages sent before ``think_schedule_fires`` carry no attempt (a rolling upgrade)."""
    agent = sjobs.get_agent(Janitor, "j")
    agent.start()
    due = due_alone(agent, "recovers")
    args = [agent_id(agent), "recovers", due.isoformat()]
    with captured("think_jobs.engine.schedules") as records, worker(sjobs):
        sjobs.celery.send_task(schedule_api.FIRE_TASK, args=args, queue=sjobs.settings.queue)
        wait_until(lambda: any(r.getMessage().endswith(": handled") for r in records))
    assert [e["attempt"] for e in read_events(sjobs)] == [1, 2, 3]
    assert kept(sjobs) == []


# -- run now -----------------------------------------------------------------------------------


def test_run_now_with_an_occurrence_shares_its_idempotency_key_with_beat(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    when = datetime(2026, 6, 1, 9, 0, 0, 123_456, tzinfo=UTC)
    first = agent.run_scheduled_task("digest", scheduled_for=when)
    again = agent.run_scheduled_task("digest", scheduled_for=when)
    assert first is not None and again is not None
    at_ms = when.replace(microsecond=123_000)
    assert first.idempotency_key == occurrence_key("Reporter", "acme", "digest", at_ms)
    assert first.metadata == {
        "kind": "digest",
        **expected_metadata("digest", at_ms, "every 1 minute"),
    }
    assert (first.accepted, again.accepted) == (True, False)
    assert again.submission_id == first.submission_id
    fired = schedule_api.fire(sjobs.services, agent_id(agent), "digest", at_ms)
    assert fired == schedule_api.Fired(schedule_api.FireOutcome.DUPLICATE, first.submission_id)


def test_run_now_without_an_occurrence_fires_a_fresh_one(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    before = utcnow()
    first = agent.run_scheduled_task("digest")
    assert first is not None and first.accepted
    scheduled_for = datetime.fromisoformat(first.metadata["scheduled_for"])  # type: ignore[index]
    assert before - timedelta(milliseconds=1) < scheduled_for <= utcnow()
    wait_until(lambda: utcnow() >= scheduled_for + timedelta(milliseconds=1))
    second = agent.run_scheduled_task("digest")
    assert second is not None and second.accepted
    assert second.idempotency_key != first.idempotency_key


def test_run_now_runs_a_handler_inline_and_raises_its_last_error(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Janitor, "j")
    when = datetime(2026, 6, 1, 9, tzinfo=UTC)
    assert agent.run_scheduled_task("tidy", scheduled_for=when) is None
    with pytest.raises(RuntimeError, match=r"upstream down \(attempt 3\)"):
        agent.run_scheduled_task("flaky", scheduled_for=when)
    events = read_events(sjobs)
    attempts = [(e["task_id"], e["attempt"]) for e in events]
    assert attempts == [("tidy", 1), ("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert events[0]["key"] == occurrence_key("Janitor", "j", "tidy", when)
    assert {e["key"] for e in events[1:]} == {occurrence_key("Janitor", "j", "flaky", when)}


def test_run_now_retries_a_handler_as_beat_does(sjobs: ThinkJobs) -> None:
    """One occurrence, one retry policy: "recovers" fails twice, then succeeds on attempt 3
    (max_attempts=3), in the calling process, as beat's fire of it would."""
    agent = sjobs.get_agent(Janitor, "j")
    assert agent.run_scheduled_task("recovers") is None
    assert [e["attempt"] for e in read_events(sjobs)] == [1, 2, 3]


def test_run_now_of_an_unknown_task_names_the_declared_ones(sjobs: ThinkJobs) -> None:
    agent = sjobs.get_agent(Reporter, "acme")
    with pytest.raises(
        ScheduleError, match=r'no scheduled task "nope" \(declared: digest, nudge\)'
    ):
        agent.run_scheduled_task("nope")


# -- one worker at a time fires a kept occurrence --------------------------------------------


def kept_resend_at(jobs: ThinkJobs) -> datetime:
    with jobs.db.read() as conn:
        [fire] = schedule_ops.kept_fires(conn)
    return fire.resend_at


def database_now(jobs: ThinkJobs) -> datetime:
    with jobs.db.read() as conn:
        return server_now(conn)


def test_a_handler_running_past_the_timeout_is_held_and_fired_once(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """Its worker holds the occurrence while it runs: beat does not send it again, and a
    second message of it (a late one) finds it held."""
    sjobs = make_jobs(**FAST, schedule_fire_timeout_s=0.6)
    sjobs.register(Lingerer)
    agent = sjobs.get_agent(Lingerer, "l")
    agent.start()
    due = make_due(agent, "linger")
    with worker(sjobs):
        assert fire_due(sjobs) == 1
        wait_until(lambda: read_events(sjobs), 30)
        first_hold = kept_resend_at(sjobs)
        wait_until(lambda: database_now(sjobs) > first_hold + timedelta(seconds=0.6), 30)
        assert send_overdue(sjobs) == 0  # held: its resend_at keeps moving on
        assert kept_resend_at(sjobs) > database_now(sjobs)
        again = schedule_api.fire(sjobs.services, agent_id(agent), "linger", due, kept=True)
        assert again == schedule_api.Fired(schedule_api.FireOutcome.HELD)
        sjobs.redis.rpush(release_key(sjobs, os.getpid()), "go")  # an in-process worker
        wait_until(lambda: not kept(sjobs), 30)
    assert [e["phase"] for e in read_events(sjobs)] == ["started", "ended"]


def test_a_holder_that_stops_renewing_loses_the_occurrence_to_another_worker(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """A worker that took an occurrence and stopped (SIGSTOP, cut from the database) holds it
    no longer once its hold lapses: beat sends it again, another worker fires it, and the
    first one, back, can neither forget it nor schedule a retry of it."""
    sjobs = with_agents(make_jobs(**FAST, schedule_fire_timeout_s=0.5))
    agent = sjobs.get_agent(Janitor, "j")
    agent.start()
    due = due_alone(agent, "tidy")
    assert [claim.task_id for claim in claim_due(sjobs)] == ["tidy"]  # its message is lost
    where = (agent_id(agent), "tidy", due)
    with sjobs.db.write() as conn:
        assert schedule_ops.take_fire(conn, *where, attempt=1, token="stopped", hold_s=0.5)
    held_until = kept_resend_at(sjobs)
    with worker(sjobs):
        assert send_overdue(sjobs) == 0  # held
        wait_until(lambda: database_now(sjobs) > held_until, 30)
        assert send_overdue(sjobs) == 1
        wait_until(lambda: read_events(sjobs) and not kept(sjobs), 30)
    with sjobs.db.write() as conn:
        late = [
            schedule_ops.retry_fire(conn, *where, token="stopped", attempt=2, in_s=0),
            schedule_ops.forget_fire(conn, *where, token="stopped"),
        ]
    assert late == [False, False]
    assert [e["attempt"] for e in read_events(sjobs)] == [1]
