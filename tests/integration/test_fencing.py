"""Fenced execution (issue 14): an attempt that lost its turn can never write again, in the
database or the stream.

A paused executor is made deterministic here: its model waits on a gate (as if the process
were stopped), its lease is made to expire by the database's clock (as if the pause outlasted
``lease_ttl_s``; the TTL is long so its own heartbeat does not renew it meanwhile), and another
claimer recovers the turn and completes it. Then the gate opens and the stale attempt carries
on, as a process resumed with SIGCONT would. The process-level faults (SIGSTOP, partitions,
skewed clocks) are in ``test_faults_fencing.py``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import select, update

from tests.apps.agents import Recorder
from tests.support.builders import buffer_key, directive, user, wait_for_status, wait_until
from tests.support.processes import PrivateRedis, worker_processes
from tests.support.proxy import Proxy, proxy_to
from think_jobs import Think, ThinkJobs, tool
from think_jobs.assembly import MessageAssembler
from think_jobs.db.dialect import db_now_plus
from think_jobs.db.tables import agents
from think_jobs.domain.records import Drained
from think_jobs.engine import drain as worker
from think_jobs.engine.execution import INTERRUPTED, Claimed, TurnResult, claim, run_and_release
from think_jobs.engine.queueing import AgentRef
from think_jobs.engine.submissions import find_turn
from think_jobs.engine.watch import CLOCK, TurnWatch, WatchTimings
from think_jobs.messages import ToolPart, UIMessage, message_text
from think_jobs.models import ModelRequest
from think_jobs.replay import assemble
from think_jobs.tools import Tool

Gate = tuple[threading.Event, threading.Event]  # (reached, go on)
GATES: dict[tuple[str, int], Gate] = {}  # (agent name, attempt) -> its gate


def gate(name: str, attempt: int) -> Gate:
    return GATES.setdefault((name, attempt), (threading.Event(), threading.Event()))


class Gated(Think):
    """First attempt: ``a1 a2 a3``, then waits at its gate (mid-stream, or after its last
    word for agents named ``end*``), then ``a4 a5``. A continuation answers ``b1 b2``, waiting
    at a gate of its own before its first word (nothing of it sent yet) for agents named
    ``both*``."""

    def get_model(self) -> GatedModel:
        return GatedModel(self.name)


class GatedModel:
    def __init__(self, name: str) -> None:
        self.name = name

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        if request.continuation:
            yield from self._words(
                ["b1 ", "b2"], pause_at=0 if self.name.startswith("both") else None, attempt=2
            )
            return
        at_end = self.name.startswith("end")
        yield from self._words(
            ["a1 ", "a2 ", "a3 ", "a4 ", "a5"], pause_at=5 if at_end else 3, attempt=1
        )

    def _words(
        self, words: list[str], *, pause_at: int | None, attempt: int
    ) -> Iterator[dict[str, Any]]:
        yield {"type": "text-start", "id": "t"}
        for n, word in enumerate(words):
            if n == pause_at:
                self._pause(attempt)
            yield {"type": "text-delta", "id": "t", "delta": word}
        if pause_at == len(words):
            self._pause(attempt)
        yield {"type": "text-end", "id": "t"}

    def _pause(self, attempt: int) -> None:
        reached, go_on = gate(self.name, attempt)
        reached.set()
        assert go_on.wait(30), "the test never let the paused attempt go on"


def paused_attempt(
    jobs: ThinkJobs, kind: str, agent_class: type[Gated] | None = None
) -> tuple[Think, str, threading.Thread, list[TurnResult]]:
    """Submit to a new agent named ``<kind>-<unique>`` and run its first attempt in a thread
    until its gate."""
    name = f"{kind}-{uuid.uuid4().hex[:8]}"
    agent = jobs.get_agent(agent_class or Gated, name)
    submission = agent.submit_messages([user("go")]).submission_id
    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    claimed = claim(jobs.services, AgentRef(agent_id, agent.agent_type, name))
    assert isinstance(claimed, Claimed)
    results: list[TurnResult] = []
    thread = threading.Thread(
        target=lambda: results.append(run_and_release(jobs.services, claimed).result)
    )
    thread.start()
    assert gate(name, 1)[0].wait(30)
    # What it streamed before its gate is in the stream (a chunk right after another waits
    # for the flush window): a pause that comes later finds it there.
    last = b'"delta":"a5"' if kind.startswith("end") else b'"delta":"a3 "'
    key = buffer_key(agent, submission)
    wait_until(lambda: any(last in item for item in jobs.redis.lrange(key, 0, -1)))
    return agent, submission, thread, results


def expire_lease(jobs: ThinkJobs, agent: Think) -> None:
    """What a pause longer than the lease TTL amounts to: the lease is expired by the
    database's clock."""
    agent_id = jobs.agent_id_of(agent, create=False)
    statement = (
        update(agents).where(agents.c.id == agent_id).values(lease_expires_at=db_now_plus(-1.0))
    )
    with jobs.db.write() as conn:
        conn.execute(statement)


def take_over_and_finish(jobs: ThinkJobs, agent: Think) -> None:
    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    assert worker.drain(jobs.services, agent_id) == Drained(
        1
    )  # recovery: a continuation, attempt 2


def resume(name: str, thread: threading.Thread, attempt: int = 1) -> None:
    gate(name, attempt)[1].set()
    thread.join(30)
    assert not thread.is_alive()


def assert_one_reply_matching_its_stream(
    agent: Think, submission: str, text: str, *, attempt: int = 2
) -> None:
    found = agent.inspect_submission(submission)
    assert found is not None and (found.status, found.attempt) == ("completed", attempt)
    replies = [m for m in agent.get_messages() if m.role == "assistant"]
    assert [message_text(m) for m in replies] == [text]
    events = list(agent.stream(submission, timeout_s=5))
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.done for e in events].count(True) == 1 and events[-1].done
    assert events[-1].status == "completed"
    chunks = [e.chunk for e in events if e.chunk is not None]
    assert assemble(chunks, replies[0].id).parts == replies[0].parts
    attempts = [e.attempt for e in events if e.attempt is not None]
    assert len(attempts) == len(events)  # sorting a None among them would raise anyway
    assert attempts == sorted(attempts)  # nothing of attempt 1 after attempt 2 began


def test_a_paused_attempt_mid_stream_writes_nothing_after_another_took_the_turn(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(lease_ttl_s=300)
    agent, submission, thread, results = paused_attempt(jobs, "mid")
    expire_lease(jobs, agent)
    take_over_and_finish(jobs, agent)
    resume(agent.name, thread)
    assert [r.status for r in results] == [INTERRUPTED]
    assert results[0].interruption == "lease_lost"
    assert_one_reply_matching_its_stream(agent, submission, "a1 a2 a3 b1 b2")


def test_a_paused_attempt_whose_model_finished_cannot_overwrite_the_reply(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(lease_ttl_s=300)
    agent, submission, thread, results = paused_attempt(jobs, "end")
    expire_lease(jobs, agent)
    take_over_and_finish(jobs, agent)
    resume(agent.name, thread)  # its final write is refused by the fence
    assert [r.status for r in results] == [INTERRUPTED]
    assert_one_reply_matching_its_stream(agent, submission, "a1 a2 a3 a4 a5b1 b2")


def test_the_stream_buffer_holds_no_event_of_the_stale_attempt(make_jobs: Any) -> None:
    jobs = make_jobs(lease_ttl_s=300)
    agent, submission, thread, _ = paused_attempt(jobs, "mid")
    expire_lease(jobs, agent)
    take_over_and_finish(jobs, agent)
    resume(agent.name, thread)
    raw = jobs.redis.lrange(buffer_key(agent, submission), 0, -1)
    assert raw and not any(b'"delta":"a4 "' in item for item in raw)  # unfenced: published


def test_a_stale_attempt_resumed_while_the_new_one_streams_adds_nothing_to_its_stream(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(lease_ttl_s=300)
    agent, submission, stale, results = paused_attempt(jobs, "both")
    expire_lease(jobs, agent)
    owner = threading.Thread(target=take_over_and_finish, args=(jobs, agent))
    owner.start()
    assert gate(agent.name, 2)[0].wait(30)  # the new attempt took the stream, sent nothing yet
    resume(agent.name, stale)  # the stale one wakes up and tries to publish "a4 "
    assert [r.interruption for r in results] == ["lease_lost"]
    resume(agent.name, owner, attempt=2)
    assert_one_reply_matching_its_stream(agent, submission, "a1 a2 a3 b1 b2")


# -- one watch thread for every attempt of a process ---------------------------------------------


def lease_expiry(jobs: ThinkJobs, agent: Think) -> Any:
    agent_id = jobs.agent_id_of(agent, create=False)
    with jobs.db.read() as conn:
        return conn.execute(
            select(agents.c.lease_expires_at).where(agents.c.id == agent_id)
        ).scalar_one()


def watch_threads() -> int:
    return sum(thread.name == "think-jobs-watch" for thread in threading.enumerate())


def renewed_by(jobs: ThinkJobs, agent: Think, before: Any) -> float:
    return float((lease_expiry(jobs, agent) - before).total_seconds())


def test_attempts_running_at_once_are_watched_by_one_thread_that_renews_each_lease(
    make_jobs: Any,
) -> None:
    """Every running attempt's watch is woken by the process's one clock thread (a thread per
    attempt cost a thread start per turn): paused past their lease TTL, two attempts both
    keep their leases (renewed every TTL / 3) and finish once they go on."""
    jobs = make_jobs(lease_ttl_s=3)
    threads_before = watch_threads()
    paused = [paused_attempt(jobs, "mid") for _ in range(2)]
    first = {agent.name: lease_expiry(jobs, agent) for agent, *_ in paused}
    for agent, *_ in paused:  # renewed at least twice: beyond what was left of the TTL
        wait_until(lambda: renewed_by(jobs, agent, first[agent.name]) > 1.5)  # noqa: B023
    assert len(CLOCK.get()) >= 2  # both on the process's clock...
    assert watch_threads() - threads_before <= 1  # ...and no thread of their own (the clock's)
    for agent, _, thread, results in paused:
        resume(agent.name, thread)
        assert [r.status for r in results] == ["completed"]


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_command_line_worker_keeps_the_lease_of_a_turn_that_outlasts_it(
    jobs: ThinkJobs, settings_env: dict[str, str], pool: str
) -> None:
    """A turn of 4 s under a 1.5 s lease is renewed all along by the worker's watch clock: a
    prefork child runs a clock of its own (the parent's thread is not in it). Had no clock
    renewed it, the attempt would stop at its lease's local bound and a second one finish it."""
    env = {**settings_env, "THINK_JOBS_LEASE_TTL_S": "1.5"}
    agent = jobs.get_agent(Recorder, f"long-{pool}")
    submission = agent.submit_messages([directive(label="long", hold_s=4)]).submission_id
    with worker_processes(env, count=1, concurrency=1, pool=pool):
        found = wait_for_status(agent, submission, "completed")
    assert found.attempt == 1


# -- a lease claimed before its attempt starts --------------------------------------------------


def test_a_watch_renews_at_once_a_lease_claimed_a_while_before_its_attempt(
    make_jobs: Any,
) -> None:
    """A drain claims the next turn in the final write of the one before, then delivers that
    turn (its stream's end may wait 2 s for an unreachable Redis): the new attempt's lease has
    aged before its watch starts. The watch renews it at once instead of a heartbeat interval
    after it started, which came too late (seen: turns re-run after a Redis-only cut)."""
    jobs = make_jobs(lease_ttl_s=3)
    jobs.register(Gated)
    agent = jobs.get_agent(Gated, "a")
    agent.submit_messages([user("hi")])
    agent_id = jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    claimed = claim(jobs.services, AgentRef(agent_id, "Gated", "a"))
    assert isinstance(claimed, Claimed)
    lease = claimed.lease
    lease.valid_until -= 2.5  # claimed 2.5 s before the attempt: 0.5 s of the lease left
    lease.safety_s = 0.2
    aged = lease.valid_until
    watch = TurnWatch(
        lease,
        claimed.claim.turn,
        revocations=jobs.services.revocations,
        revocation_key=jobs.keys.revoked(agent.address, claimed.claim.turn.id),
        timings=WatchTimings(heartbeat_s=1.0, poll_s=0.02),
    ).start()
    try:
        wait_until(lambda: lease.valid_until > aged + 2)  # renewed through the fence
        assert watch.reason is None  # not stopped as "could not be renewed in time"
    finally:
        watch.close()


# -- a process resumed after a pause longer than its lease ---------------------------------------


def lapsed_watch(jobs: ThinkJobs, agent: Think) -> tuple[TurnWatch, Any]:
    """The watch of a claimed turn whose lease, to this process, is past its local bound (as
    after a pause longer than the lease): not started, so only ``confirm()`` renews it."""
    agent_id = jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    claimed = claim(jobs.services, AgentRef(agent_id, agent.agent_type, agent.name))
    assert isinstance(claimed, Claimed)
    claimed.lease.valid_until -= 10.0
    watch = TurnWatch(
        claimed.lease,
        claimed.claim.turn,
        revocations=jobs.services.revocations,
        revocation_key=jobs.keys.revoked(agent.address, claimed.claim.turn.id),
        timings=WatchTimings(heartbeat_s=60.0, poll_s=60.0),
    )
    return watch, claimed.lease


def test_a_resumed_attempt_whose_turn_was_taken_begins_no_model_call(make_jobs: Any) -> None:
    """Resumed past its lease, while another worker has taken the turn: ``confirm()`` (asked
    before each model call and tool) renews through the fence, finds the lease gone, and
    stops the attempt, instead of starting a model call beside the new attempt's (CI: two
    model calls of one turn at once after a SIGSTOP, the fence holding their writes)."""
    jobs = make_jobs(lease_ttl_s=3)
    jobs.register(Gated)
    agent = jobs.get_agent(Gated, "taken")
    agent.submit_messages([user("hi")])
    watch, _ = lapsed_watch(jobs, agent)
    expire_lease(jobs, agent)
    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    taken = claim(jobs.services, AgentRef(agent_id, "Gated", "taken"))  # another worker
    assert isinstance(taken, Claimed)
    assert watch.confirm() is False
    assert watch.reason is not None and watch.reason.kind == "lease_lost"


def test_a_resumed_attempt_whose_lease_nobody_took_renews_it_and_goes_on(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(lease_ttl_s=3)
    jobs.register(Gated)
    agent = jobs.get_agent(Gated, "kept")
    agent.submit_messages([user("hi")])
    watch, lease = lapsed_watch(jobs, agent)
    expire_lease(jobs, agent)  # expired by the database's clock, but taken by no one
    assert watch.confirm() is True
    assert watch.reason is None and not lease.lapsed  # renewed through the fence


class StallingGated(Gated):
    """``Gated`` with a stall watchdog shorter than the Redis outage below."""

    stall_timeout_s = 0.3


@pytest.mark.parametrize("agent_class", [Gated, StallingGated])
def test_a_recovery_that_cannot_reach_redis_waits_for_the_stream_it_continues(
    make_jobs: Any, redis_url: str, caplog: pytest.LogCaptureFixture, agent_class: type[Gated]
) -> None:
    """The attempt that died streamed ``a1 a2 a3`` and stored no partial. The recovering one,
    cut from Redis as it starts (connections refused, as while Redis restarts), waits for the
    stream rather than continue from the empty stored partial, which would stream those words
    a second time, before its own, and store a reply without them. The wait is no stall: its
    model has not started."""
    with recovery_cut_from_redis(make_jobs, redis_url, "mid", agent_class) as cut:
        agent = cut.agent
        recovering = threading.Thread(target=take_over_and_finish, args=(cut.jobs, agent))
        with caplog.at_level(logging.WARNING, logger="think_jobs.transport.streams"):
            recovering.start()
            wait_until(lambda: "stream take-over failed" in caplog.text)
        time.sleep(1.0)  # the outage lasts a second more: over StallingGated's stall timeout
        cut.proxy.heal()
        recovering.join(30)
    assert not recovering.is_alive()
    resume(agent.name, cut.stale)
    assert_one_reply_matching_its_stream(agent, cut.submission, "a1 a2 a3 b1 b2")


@dataclass(frozen=True)
class CutRecovery:
    agent: Think
    submission: str
    stale: threading.Thread  # the first attempt, paused at its gate
    proxy: Proxy  # down: the recovering worker's way to Redis
    jobs: ThinkJobs  # the recovering worker's


@contextmanager
def recovery_cut_from_redis(
    make_jobs: Any, redis_url: str, kind: str, agent_class: type[Gated], *, lease_ttl_s: float = 300
) -> Iterator[CutRecovery]:
    """A new agent's first attempt paused at its gate, its lease expired, and the ``ThinkJobs``
    of a worker that would recover it but reaches Redis through a proxy that is down
    (refusing, as while Redis restarts); ``lease_ttl_s`` is that worker's (its wait)."""
    jobs = make_jobs(lease_ttl_s=300)
    agent, submission, stale, _ = paused_attempt(jobs, kind, agent_class)
    expire_lease(jobs, agent)
    with proxy_to(6379) as proxy:
        proxy.down()
        cut_off = make_jobs(lease_ttl_s=lease_ttl_s, redis_url=proxy.url(_through_port(redis_url)))
        cut_off.register(agent_class)
        yield CutRecovery(agent, submission, stale, proxy, cut_off)


def _through_port(redis_url: str) -> str:
    """``redis_url`` with its port left for the proxy's (``Proxy.url``)."""
    return redis_url.replace(":6379/", ":{port}/")


# -- the stream must lead to the reply a recovery continues ---------------------------------------


def _drain_in_thread(jobs: ThinkJobs, agent: Think) -> threading.Thread:
    """One drain of ``agent`` by ``jobs`` (another worker), in a thread of its own."""
    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    thread = threading.Thread(target=worker.drain, args=(jobs.services, agent_id))
    thread.start()
    return thread


def test_a_recovery_after_redis_lost_the_stream_streams_the_stored_partial_first(
    make_jobs: Any, server: PrivateRedis
) -> None:
    """Attempt 1 streamed ``a1 a2 a3`` and froze; attempt 2 took the stream over, stored that
    partial and froze before its first word; Redis restarted empty. Attempt 3 finds the
    stream empty and continues the stored partial: a client must see that partial before
    ``b1 b2``, as the reply stores it (before 2026-12-06 the stream held ``b1 b2`` alone: the
    mixed-faults bench found it, a kill and a Redis restart on one turn)."""
    jobs = make_jobs(lease_ttl_s=300, redis_url=server.url)
    agent, submission, first, _ = paused_attempt(jobs, "both", Gated)
    expire_lease(jobs, agent)
    second = _drain_in_thread(jobs, agent)
    assert gate(agent.name, 2)[0].wait(30)  # its partial stored: it is about to stream
    assert message_text(_stored_reply(agent)) == "a1 a2 a3 "
    server.stop()
    server.start()  # empty
    expire_lease(jobs, agent)
    third = _drain_in_thread(jobs, agent)
    wait_until(lambda: _stream_owner(agent, submission) == 3)  # attempt 3 took it over
    resume(agent.name, second, attempt=2)  # both continuations go on; the second is stale
    third.join(30)
    assert not third.is_alive()
    resume(agent.name, first)
    assert_one_reply_matching_its_stream(agent, submission, "a1 a2 a3 b1 b2", attempt=3)


def test_a_recovery_that_continued_without_its_stream_hands_the_turn_on_when_it_shows_more(
    make_jobs: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Attempt 1 streamed ``a1 a2 a3`` and froze, storing no partial. Attempt 2 could not
    reach Redis for longer than it waits (its lease TTL, 4 s here), so it went on from the
    empty stored partial; Redis answers before its first word goes out, and the stream it
    then takes over shows more than the reply it continues. It sends nothing and hands the
    turn to recovery (``stream_ahead``); attempt 3 continues from the stream. Before
    2026-12-06 attempt 2 appended ``b1 b2`` after ``a1 a2 a3`` and stored ``b1 b2``."""
    # It waits for Redis up to its lease TTL: 4 s, short enough to wait out, long enough for
    # its renewals under a loaded CI (with 1 s, CI once lost the lease before the gate).
    with recovery_cut_from_redis(make_jobs, redis_url, "both", Gated, lease_ttl_s=4) as cut:
        agent = cut.agent
        with caplog.at_level(logging.WARNING, logger="think_jobs.transport.streams"):
            second = _drain_in_thread(cut.jobs, agent)
            assert gate(agent.name, 2)[0].wait(30)  # went on without the stream
            cut.proxy.heal()
            resume(agent.name, second, attempt=2)
    third = _drain_in_thread(agent.jobs, agent)  # the turn was put back: another worker's drain
    third.join(30)
    assert not third.is_alive()
    resume(agent.name, cut.stale)
    assert_one_reply_matching_its_stream(agent, cut.submission, "a1 a2 a3 b1 b2", attempt=3)
    assert "shows more than the reply attempt 2 continued" in caplog.text


def _stored_reply(agent: Think) -> Any:
    return next(m for m in agent.get_messages() if m.role == "assistant")


def _stream_owner(agent: Think, submission: str) -> int:
    """The attempt that owns the turn's stream, as Redis holds it (0: none yet)."""
    turn = find_turn(agent.jobs.services, agent, submission)
    assert turn is not None
    owner = agent.jobs.redis.hget(agent.jobs.keys.stream_state(agent.address, turn.id), "epoch")
    return int(owner) if owner is not None else 0


# -- an approval's continuation: its stream extends the reply it answers ----------------------


class GatedApprover(Gated):
    """Its first turn calls ``pay``, which needs approval; the continuation the approval lets
    run streams as ``Gated`` does (``a1 a2 a3``, its gate, then its recoveries' ``b1 b2``)."""

    def get_model(self) -> GatedModel:
        return ApprovalGatedModel(self.name)

    def get_tools(self) -> dict[str, Tool]:
        @tool(needs_approval=True)
        def pay(amount: int) -> str:
            """Pay an amount."""
            return f"paid {amount}"

        return {"pay": pay}


class ApprovalGatedModel(GatedModel):
    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        if not any(m.role == "assistant" for m in request.messages):  # the turn that asks
            yield {"type": "tool-input-start", "toolCallId": "call-1", "toolName": "pay"}
            yield {
                "type": "tool-input-available",
                "toolCallId": "call-1",
                "toolName": "pay",
                "input": {"amount": 7},
            }
            return
        reply = request.messages[-1]  # the reply it extends: a recovery finds text in it
        if any(part.type == "text" for part in reply.parts):
            yield from self._words(["b1 ", "b2"], pause_at=0, attempt=2)
        else:
            yield from self._words(["a1 ", "a2 ", "a3 ", "a4 ", "a5"], pause_at=3, attempt=1)


def paused_continuation(jobs: ThinkJobs) -> tuple[Think, str, Any, threading.Thread]:
    """A new ``both-*`` agent's turn asked for an approval and got it; the continuation's
    first attempt runs in a thread until its gate (``a1 a2 a3`` streamed). Returns the agent,
    the continuation's request id, the reply it extends (answered), and that thread."""
    name = f"both-{uuid.uuid4().hex[:8]}"
    agent = jobs.get_agent(GatedApprover, name)
    agent.submit_messages([user("pay")])
    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    assert worker.drain(jobs.services, agent_id) == Drained(1)  # it asked; the line waits
    (approval,) = agent.list_approvals(status="pending")
    asked = _as_answered(_stored_reply(agent), approval.approval_id)
    agent.respond_to_approval(approval.approval_id, True)
    claimed = claim(jobs.services, AgentRef(agent_id, agent.agent_type, name))
    assert isinstance(claimed, Claimed)
    thread = threading.Thread(target=run_and_release, args=(jobs.services, claimed))
    thread.start()
    assert gate(name, 1)[0].wait(30)
    key = buffer_key(agent, approval.continuation_id)
    wait_until(lambda: any(b'"delta":"a3 "' in item for item in jobs.redis.lrange(key, 0, -1)))
    return agent, approval.continuation_id, asked, thread


def _as_answered(reply: UIMessage, approval_id: str) -> UIMessage:
    """The reply that asked, as a client holds it once it approved (what the AI SDK's
    ``addToolApprovalResponse`` does to the part): what the continuation's stream applies to."""
    wire = reply.to_wire()
    (part,) = [p for p in wire["parts"] if p["type"] == "tool-pay"]
    assert part["state"] == "approval-requested"
    part["state"] = "approval-responded"
    part["approval"] = {"id": approval_id, "approved": True}
    return UIMessage.model_validate(wire)


def assert_the_stream_extends_the_reply_it_answers(
    agent: Think, continuation: str, asked: Any, *, attempt: int
) -> None:
    """The continuation completed by ``attempt`` and its stream, applied to the reply it
    answers (as ``useChat`` continues that message), rebuilds the stored reply exactly."""
    found = agent.inspect_submission(continuation)
    assert found is not None and (found.status, found.attempt) == ("completed", attempt)
    reply = _stored_reply(agent)
    assert reply.id == asked.id and message_text(reply) == "a1 a2 a3 b1 b2"
    (paid,) = [p for p in reply.parts if isinstance(p, ToolPart)]
    assert paid.approval is not None and paid.approval.approved is True  # the answer stays
    events = list(agent.stream(continuation, timeout_s=5))
    assert [e.done for e in events].count(True) == 1 and events[-1].done
    chunks = [e.chunk for e in events if e.chunk is not None]
    assembler = MessageAssembler(reply.id, parts=asked.parts)
    for chunk in chunks:
        if chunk["type"] not in ("abort", "error"):
            assembler.feed(chunk)
    assert assembler.message.parts == reply.parts


def test_a_continuation_recovered_after_redis_lost_its_stream_streams_its_stored_partial_first(
    make_jobs: Any, server: PrivateRedis
) -> None:
    """As ``test_a_recovery_after_redis_lost_the_stream_streams_the_stored_partial_first``,
    for an approval's continuation: its stream extends the reply the approval answered, so
    what attempt 3 must stream first is what the stored partial adds to that reply (before
    2026-12-06 evening it streamed ``b1 b2`` alone)."""
    jobs = make_jobs(lease_ttl_s=300, redis_url=server.url)
    agent, continuation, asked, first = paused_continuation(jobs)
    expire_lease(jobs, agent)
    second = _drain_in_thread(jobs, agent)
    assert gate(agent.name, 2)[0].wait(30)  # its partial stored: it is about to stream
    assert message_text(_stored_reply(agent)) == "a1 a2 a3 "
    server.stop()
    server.start()  # empty
    expire_lease(jobs, agent)
    third = _drain_in_thread(jobs, agent)
    wait_until(lambda: _stream_owner(agent, continuation) == 3)
    resume(agent.name, second, attempt=2)
    third.join(30)
    assert not third.is_alive()
    resume(agent.name, first)
    assert_the_stream_extends_the_reply_it_answers(agent, continuation, asked, attempt=3)


def test_a_continuation_whose_stream_redis_lost_is_rebuilt_without_the_reply_it_answers(
    make_jobs: Any, server: PrivateRedis
) -> None:
    """A reader of a finished continuation whose buffer Redis lost gets the stream rebuilt
    from the database: only what the continuation added, not the reply it answers again
    (which ``useChat``, continuing that message, would show twice)."""
    jobs = make_jobs(lease_ttl_s=300, redis_url=server.url)
    agent, continuation, asked, first = paused_continuation(jobs)
    resume(agent.name, first)
    server.stop()
    server.start()  # empty
    found = agent.inspect_submission(continuation)
    assert found is not None and found.status == "completed"
    reply = _stored_reply(agent)
    assert message_text(reply) == "a1 a2 a3 a4 a5"
    events = list(agent.stream(continuation, timeout_s=5))
    chunks = [e.chunk for e in events if e.chunk is not None]
    assembler = MessageAssembler(reply.id, parts=asked.parts)
    for chunk in chunks:
        assembler.feed(chunk)
    assert assembler.message.parts == reply.parts
