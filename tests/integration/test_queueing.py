"""Admissions and claims at the database level.

An admission says whether it made the agent's head (then the caller nudges a worker; if not,
whoever holds the lease or runs the turns in front hands on); the sweeper would hide a wrong
answer in the worker tests, so it is checked here. A claim always starts the agent's head: a
fresh submission in one statement, anything else (a running turn left by a dead executor, a
finished one in front) through the general path.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from typing import Any

from tests.support.builders import user
from think_jobs import Think, ThinkJobs
from think_jobs.db import agents as agent_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.tables import turns
from think_jobs.domain.records import AgentRef, Claim, Drained, Idle, NewTurn
from think_jobs.domain.status import Kind
from think_jobs.engine import drain as worker
from think_jobs.engine.execution import Claimed, claim
from think_jobs.engine.queueing import admit_submission
from think_jobs.models import ScriptedModel


class Quiet(Think):
    def get_model(self) -> ScriptedModel:
        return ScriptedModel("ok")


def queued(jobs: ThinkJobs, count: int) -> tuple[AgentRef, list[str]]:
    """An agent with ``count`` pending submissions (no worker runs them)."""
    jobs.register(Quiet)
    agent = jobs.get_agent(Quiet, "a")
    ids = [agent.submit_messages([user(f"u{i}", f"m{i}")]).submission_id for i in range(count)]
    agent_id = jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    return AgentRef(agent_id, "Quiet", "a"), ids


def claimed(jobs: ThinkJobs, agent: AgentRef) -> Claim:
    result = claim(jobs.services, agent)
    assert isinstance(result, Claimed), result
    return result.claim


def drop_lease(jobs: ThinkJobs, taken: Claim) -> None:
    """What a killed executor leaves: its turn running, the lease gone."""
    with jobs.db.write() as conn:
        agent_ops.release_lease(conn, taken.agent_id, taken.token)


def test_a_fresh_head_is_started_with_its_messages_applied(jobs: ThinkJobs) -> None:
    agent, ids = queued(jobs, 2)
    taken = claimed(jobs, agent)
    assert taken.turn.request_id == ids[0]
    assert (taken.turn.status, taken.turn.attempt, taken.recovering) == ("running", 1, False)
    assert taken.turn.messages_applied and taken.turn.started_at is not None
    assert taken.turn.assistant_message_id
    assert [m.id for m in jobs.get_agent(Quiet, "a").get_messages()] == ["m0"]


def test_a_running_head_is_recovered_before_the_pending_turn_behind_it(jobs: ThinkJobs) -> None:
    agent, ids = queued(jobs, 2)
    first = claimed(jobs, agent)
    drop_lease(jobs, first)
    again = claimed(jobs, agent)
    assert again.turn.request_id == ids[0]
    assert (again.turn.attempt, again.recovering) == (2, True)
    assert again.turn.assistant_message_id == first.turn.assistant_message_id
    assert [m.id for m in jobs.get_agent(Quiet, "a").get_messages()] == ["m0"]


def test_a_cancelled_head_is_passed_over(jobs: ThinkJobs) -> None:
    agent, ids = queued(jobs, 3)
    jobs.get_agent(Quiet, "a").cancel_submission(ids[0])
    taken = claimed(jobs, agent)
    assert taken.turn.request_id == ids[1]
    assert [m.id for m in jobs.get_agent(Quiet, "a").get_messages()] == ["m1"]


def admitted_as_head(jobs: ThinkJobs, agent: AgentRef, text: str) -> bool:
    with jobs.db.write() as conn:
        new = NewTurn(str(uuid.uuid4()), Kind.SUBMISSION, "submission", messages=[user(text)])
        admission = admit_submission(conn, agent.id, new, submission_id=None)
    assert admission.accepted
    return admission.is_head


def test_an_admission_is_the_head_only_with_nothing_in_front_and_no_lease(
    jobs: ThinkJobs,
) -> None:
    agent, _ = queued(jobs, 0)
    assert admitted_as_head(jobs, agent, "first")  # idle agent: nudge a worker
    assert not admitted_as_head(jobs, agent, "second")  # behind a pending turn
    taken = claimed(jobs, agent)
    assert not admitted_as_head(jobs, agent, "third")  # the lease is held
    with jobs.db.write() as conn:
        turn_ops.finish_turn(conn, taken.turn, status="completed", error=None)
        agent_ops.release_lease(conn, taken.agent_id, taken.token)
    assert not admitted_as_head(jobs, agent, "fourth")  # "second" is still in front
    with jobs.db.write() as conn:
        for turn in turn_ops.active_turns(conn, agent.id):
            turn_ops.end_turn(conn, turn.id, status="skipped", error=None)
    assert admitted_as_head(jobs, agent, "fifth")  # everything in front has finished


def test_a_claim_knows_whether_turns_wait_behind_it(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 2)
    first = claimed(jobs, agent)
    assert first.queued_behind
    with jobs.db.write() as conn:
        turn_ops.finish_turn(conn, first.turn, status="completed", error=None)
        agent_ops.release_lease(conn, first.agent_id, first.token)
    assert not claimed(jobs, agent).queued_behind


def test_a_drain_runs_what_is_queued_and_then_gives_the_lease_back(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(drain_slice_s=60.0)
    agent, ids = queued(jobs, 3)
    assert worker.drain(jobs.services, agent.id) == Drained(3)
    quiet = jobs.get_agent(Quiet, "a")
    statuses = [inspection.status for i in ids if (inspection := quiet.inspect_submission(i))]
    assert statuses == ["completed"] * 3
    with jobs.db.read() as conn:
        assert not agent_ops.lease_is_live(conn, agent.id)
    assert worker.drain(jobs.services, agent.id) == Drained(0, Idle.IDLE)


def test_the_sweeper_finds_agents_with_work_waiting_and_no_live_lease(jobs: ThinkJobs) -> None:
    """Pending work with the lease free or expired, and a running turn whose executor's lease
    expired, need a drain; pending work under a live lease, a continuation waiting for an
    approval, and finished work do not."""
    jobs.register(Quiet)
    ids: dict[str, int] = {}
    for name in ("free", "leased", "expired", "orphan", "asking", "done"):
        agent = jobs.get_agent(Quiet, name)
        agent.submit_messages([user("u", f"m-{name}")], submission_id=f"s-{name}")
        agent_id = jobs.agent_id_of(agent, create=True)
        assert agent_id is not None
        ids[name] = agent_id
    with jobs.db.write() as conn:
        for name, ttl_s in (("leased", 60.0), ("expired", -1.0), ("orphan", -1.0)):
            assert agent_ops.try_acquire_lease(conn, ids[name], f"t-{name}", ttl_s=ttl_s)
        set_status = turns.update().where(turns.c.agent_id == ids["orphan"])
        conn.execute(set_status.values(status="running", attempt=1))
        waiting = turns.update().where(turns.c.agent_id == ids["asking"])
        conn.execute(waiting.values(awaiting_approval=True))
        finished = turns.update().where(turns.c.agent_id == ids["done"])
        conn.execute(finished.values(status="completed"))
    with jobs.db.read() as conn:
        found = agent_ops.agents_needing_a_drain(conn, limit=10)
        first = agent_ops.agents_needing_a_drain(conn, limit=1)
    assert found == sorted(ids[name] for name in ("free", "expired", "orphan"))
    assert first == found[:1]
    with jobs.db.read() as conn:
        assert agent_ops.agents_needing_a_drain(conn, limit=10, after=found[0]) == found[1:]
        assert agent_ops.agents_needing_a_drain(conn, limit=10, after=found[-1]) == []


def test_sweeps_go_on_from_where_the_last_one_stopped(jobs: ThinkJobs) -> None:
    """Agents that stay on the sweeper's list (marked, of a type no worker serves, behind a
    long backlog) cannot keep the ones after them from being nudged: with a batch of two and
    five agents whose drains were lost, three sweeps nudge each once, and the fourth starts
    over (each is marked by then: nothing more is sent)."""
    jobs.register(Quiet)
    agents = [jobs.get_agent(Quiet, f"a{i}") for i in range(5)]
    for agent in agents:
        agent.submit_messages([user("u")])
    ids = [jobs.agent_id_of(agent, create=True) for agent in agents]
    assert None not in ids
    queue = jobs.settings.queue
    jobs.redis.delete(queue)  # the drains the submissions sent: lost

    def nudged() -> list[int]:
        raw = jobs.redis.lrange(queue, 0, -1)
        jobs.redis.delete(queue)
        return sorted(json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in raw)

    assert [worker.sweep(jobs.services, batch=2) for _ in range(4)] == [2, 2, 1, 0]
    assert nudged() == sorted(i for i in ids if i is not None)


def test_the_sweeper_sends_one_drain_until_that_drain_runs(jobs: ThinkJobs) -> None:
    """The sweeper marks an agent it sent a drain, and sends no other while the mark lives;
    only the drain it sent drops the mark (a drain of a submission leaves it, and costs no
    Redis round trip for it)."""
    agent, _ = queued(jobs, 1)
    queue = jobs.settings.queue
    jobs.redis.delete(queue)  # the submission's own drain: not the sweeper's

    def sent() -> list[dict[str, Any]]:
        raw = jobs.redis.lrange(queue, 0, -1)
        found = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in raw]
        jobs.redis.delete(queue)
        return [{"args": args, "kwargs": kwargs} for args, kwargs, _ in found]

    assert worker.sweep(jobs.services) == 1
    assert sent() == [{"args": [agent.id], "kwargs": {"swept": True}}]
    assert worker.sweep(jobs.services) == 0 and sent() == []  # marked
    with jobs.db.write() as conn:  # busy: a drain finds the lease held and runs nothing
        assert agent_ops.try_acquire_lease(conn, agent.id, "someone", ttl_s=30.0)
    assert worker.drain(jobs.services, agent.id) == Drained(0, Idle.BUSY)
    with jobs.db.write() as conn:
        agent_ops.release_lease(conn, agent.id, "someone")
    assert worker.sweep(jobs.services) == 0  # a drain not the sweeper's left the mark
    assert worker.drain(jobs.services, agent.id, swept=True) == Drained(1)
    assert worker.sweep(jobs.services) == 0 and sent() == []  # nothing waits any more
    assert not jobs.redis.exists(jobs.keys.swept(agent.id))
