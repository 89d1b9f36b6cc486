"""A running turn cancelled while its attempt cannot write keeps what it streamed (SPEC §5: a
cancelled running turn keeps its partial reply), against a real worker killed mid-stream,
PostgreSQL and Redis.

The attempt that would store its partial when the cancel reaches it is dead, and no recovery
follows a cancel: the worker that next takes the agent's lease over from the lapsed one stores
the partial the stream shows, before the agent's next turn applies its messages; when the
agent gets no further turn, the sweeper sends it a drain that does the same once the dead
attempt's lease lapsed. Before 2026-12-06 evening the cancelled turn kept the partial stored
before its attempt began — here none — while a client had read every word its stream carried
(and until late that day, with no further turn, it kept none for good).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.apps.agents import Recorder, read_events
from tests.support.builders import directive, wait_for_status
from tests.support.fencing_faults import through
from tests.support.pg_sessions import wait_for_lock_waiter
from tests.support.processes import worker_processes
from tests.support.proxy import Proxy, proxy_to
from think_jobs import StreamEvent, SubmitMessagesResult, ThinkJobs
from think_jobs.domain.records import AgentRef, Idle, NotClaimed
from think_jobs.engine.execution import Claimed, claim
from think_jobs.messages import UIMessage, message_text
from think_jobs.replay import assemble
from think_jobs.testing import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]


def test_a_turn_cancelled_after_its_worker_died_keeps_what_it_streamed(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    agent = fault_jobs.get_agent(Recorder, "cancelled")
    first = _killed_mid_stream(fault_jobs, fault_env, agent)
    agent.cancel_submission(first.submission_id, reason="the user stopped it")
    streamed = list(agent.stream(first.submission_id, timeout_s=30))  # a client reads it now
    second = agent.submit_messages([directive("m-2", label="b", text="after")])
    with worker_processes(fault_env, count=1):
        wait_for_status(agent, second.submission_id, "completed")
    found = agent.inspect_submission(first.submission_id)
    assert found is not None and (found.status, found.error) == ("aborted", "the user stopped it")
    assert streamed[-1].done and streamed[-1].status == "aborted"
    messages = agent.get_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    _assert_shown(streamed, messages[1])  # in its place: before the next turn's message
    assert (messages[0].id, messages[2].id, message_text(messages[3])) == ("m-1", "m-2", "after")


def test_a_turn_cancelled_after_its_worker_died_keeps_what_it_streamed_with_no_turn_after(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    """Nothing else is submitted: a live worker's sweeper finds the cancel whose attempt's
    lease lapsed, and the drain it sends stores the partial."""
    agent = fault_jobs.get_agent(Recorder, "cancelled-alone")
    first = _killed_mid_stream(fault_jobs, fault_env, agent)
    agent.cancel_submission(first.submission_id, reason="the user stopped it")
    streamed = list(agent.stream(first.submission_id, timeout_s=30))
    with worker_processes(fault_env, count=1):
        wait_until(lambda: len(agent.get_messages()) == 2, 30)
    found = agent.inspect_submission(first.submission_id)
    assert found is not None and (found.status, found.error) == ("aborted", "the user stopped it")
    [asked, partial] = agent.get_messages()
    assert asked.id == "m-1"
    _assert_shown(streamed, partial)


def test_a_cancel_committing_as_the_lease_is_taken_over_is_not_skipped(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    """The cancel has written the turn's status and not yet committed (held, here, behind a
    lock on the approvals table it reads next) when a worker takes the dead attempt's lease
    over: the claim waits for the cancel, reads the turn aborted and stores its partial
    before the next turn runs. (Reading the turn unlocked, the claim saw it running, found
    it cancelled only as it tried to recover it, and started the next turn with the partial
    unstored.)"""
    agent = fault_jobs.get_agent(Recorder, "cancelled-racing")
    first = _killed_mid_stream(fault_jobs, fault_env, agent)
    second = agent.submit_messages([directive("m-2", label="b", text="after")])
    cancelling = threading.Thread(
        target=agent.cancel_submission, args=(first.submission_id,), kwargs={"reason": "stop"}
    )
    with fault_jobs.db.engine.connect() as blocker:
        blocker.execute(sa.text("LOCK TABLE think_approvals IN ACCESS EXCLUSIVE MODE"))
        cancelling.start()
        wait_for_lock_waiter(fault_jobs, on="think_approvals")  # the cancel, uncommitted
        with worker_processes(fault_env, count=1):
            # the claim, behind the cancel (the sweeper may wait on the approvals too)
            wait_for_lock_waiter(fault_jobs, on="think_turns", besides="think_approvals")
            blocker.commit()
            cancelling.join(30)
            wait_for_status(agent, second.submission_id, "completed")
    found = agent.inspect_submission(first.submission_id)
    assert found is not None and (found.status, found.error) == ("aborted", "stop")
    streamed = list(agent.stream(first.submission_id, timeout_s=30))
    messages = agent.get_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    _assert_shown(streamed, messages[1])


def test_a_partial_its_attempt_stored_and_the_user_cleared_does_not_come_back(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    """A live attempt cancelled stores its partial and ends its stream; the user then clears
    the conversation. Should the agent's lease later lapse in a holder's hands before another
    turn ran (set here on the row: a process that took the lease and died before it started
    a turn), the worker that takes it over settles nothing: the attempt ended its own stream,
    so the partial was stored, and its absence now is the user's doing. (Reading the stream
    alone, the take-over stored the cleared partial again.)"""
    agent = fault_jobs.get_agent(Recorder, "cleared")
    text = " ".join(f"w{i}" for i in range(200))
    first = agent.submit_messages([directive("m-1", label="a", text=text, delay_s=0.05)])
    with worker_processes(fault_env, count=1):
        wait_until(lambda: _chunks(fault_jobs, "a") >= 10, 60, interval_s=0.02)
        agent.cancel_submission(first.submission_id, reason="stop")
        streamed = list(agent.stream(first.submission_id, timeout_s=30))
        assert streamed[-1].done and streamed[-1].attempt == 1  # the attempt ended it
        assert [m.role for m in agent.get_messages()] == ["user", "assistant"]
        agent.clear_messages()
        with fault_jobs.db.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE think_agents SET lease_token = 'died-holding-it', "
                    "lease_expires_at = now() - interval '1 minute' WHERE agent_name = :name"
                ),
                {"name": "cleared"},
            )
        wait_until(lambda: not _leased(fault_jobs, "cleared"), 30)  # taken over, given back
    assert agent.get_messages() == []


def test_a_settle_waiting_on_redis_holds_no_transaction(
    fault_jobs: ThinkJobs, fault_env: dict[str, str], make_jobs: Callable[..., ThinkJobs]
) -> None:
    """The process that takes the dead attempt's lease over reads the cancelled turn's stream
    with no transaction open: while Redis does not answer it, no session of it sits in a
    transaction and the agent takes submissions (its row is not held); once Redis answers, the
    partial is stored before the next turn's message. (Settled inside the claim's transaction,
    a Redis that hung held the agent row and the turn row for up to its socket timeout.)"""
    agent, ref, streamed = _cancelled_after_its_worker_died(fault_jobs, fault_env, "hung")
    with proxy_to(6379) as proxy:
        claimer = _claimer(make_jobs, fault_env, proxy)
        proxy.cut()
        found: list[Claimed | NotClaimed] = []
        claiming = threading.Thread(target=lambda: found.append(claim(claimer.services, ref)))
        claiming.start()
        assert proxy.holding.wait(30)  # the take-over committed; its Redis read waits
        assert _in_transaction(fault_jobs) == 0
        second = agent.submit_messages([directive("m-2", label="b", text="after")])
        assert claiming.is_alive() and not found  # the submit did not wait for the settle
        proxy.heal()
        claiming.join(30)
    [claimed] = found
    assert isinstance(claimed, Claimed) and claimed.claim.turn.request_id == second.submission_id
    messages = agent.get_messages()
    assert [(m.id, m.role) for m in messages][::2] == [("m-1", "user"), ("m-2", "user")]
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    _assert_shown(streamed, messages[1])


def test_a_settle_that_cannot_read_the_stream_claims_nothing_and_is_done_later(
    fault_jobs: ThinkJobs, fault_env: dict[str, str], make_jobs: Callable[..., ThinkJobs]
) -> None:
    """Redis refuses the process that took the lease over: it runs no turn (the next one's
    messages would go in before the partial it cannot read) and keeps the lease until its
    TTL (a back-off); once it lapsed and Redis answers, the next claim settles the turn
    first. (Before, the claim went on without the partial: the turn kept none for good.)"""
    agent, ref, streamed = _cancelled_after_its_worker_died(fault_jobs, fault_env, "refused")
    second = agent.submit_messages([directive("m-2", label="b", text="after")])
    with proxy_to(6379) as proxy:
        claimer = _claimer(make_jobs, fault_env, proxy, lease_ttl_s=5)
        proxy.down()
        assert claim(claimer.services, ref) == NotClaimed(Idle.BUSY)
        assert not _lapsed(fault_jobs, ref.id)  # held until its TTL: a back-off
        assert claim(claimer.services, ref) == NotClaimed(Idle.BUSY)
        assert [m.id for m in agent.get_messages()] == ["m-1"]  # m-2 not applied
        wait_until(lambda: _lapsed(fault_jobs, ref.id), 30)
        proxy.heal()
        claimed = claim(claimer.services, ref)
    assert isinstance(claimed, Claimed) and claimed.claim.turn.request_id == second.submission_id
    messages = agent.get_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    _assert_shown(streamed, messages[1])


def test_a_stream_that_cannot_be_settled_does_not_stop_the_agent(
    fault_jobs: ThinkJobs, fault_env: dict[str, str], make_jobs: Callable[..., ThinkJobs]
) -> None:
    """The cancelled turn's buffer holds an event this code cannot read (written by another
    version, say): the take-over logs it, the turn keeps the partial stored before (none),
    and the agent's next turn runs. (A failure there would meet every claim of the agent.)"""
    agent, ref, _ = _cancelled_after_its_worker_died(fault_jobs, fault_env, "garbled")
    [buffer] = fault_jobs.redis.keys(f"{fault_jobs.settings.key_prefix}:stream:*garbled*")
    fault_jobs.redis.rpush(buffer, b"{not an event")
    second = agent.submit_messages([directive("m-2", label="b", text="after")])
    claimer = make_jobs(lease_ttl_s=10)
    claimed = claim(claimer.services, ref)
    assert isinstance(claimed, Claimed) and claimed.claim.turn.request_id == second.submission_id
    assert [(m.id, m.role) for m in agent.get_messages()] == [("m-1", "user"), ("m-2", "user")]


def _cancelled_after_its_worker_died(
    jobs: ThinkJobs, env: dict[str, str], name: str
) -> tuple[Recorder, AgentRef, list[StreamEvent]]:
    """An agent whose turn was cancelled, and read by a client, after its worker died
    mid-stream; once the dead worker's lease lapsed."""
    agent = jobs.get_agent(Recorder, name)
    first = _killed_mid_stream(jobs, env, agent)
    agent.cancel_submission(first.submission_id, reason="stop")
    streamed = list(agent.stream(first.submission_id, timeout_s=30))
    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    wait_until(lambda: _lapsed(jobs, agent_id), 30)
    return agent, AgentRef(agent_id, "Recorder", name), streamed


def _claimer(
    make_jobs: Callable[..., ThinkJobs], env: dict[str, str], proxy: Proxy, lease_ttl_s: float = 10
) -> ThinkJobs:
    """A process of its own, which reaches Redis through ``proxy``."""
    url = through(env, "redis", proxy)["THINK_JOBS_REDIS_URL"]
    return make_jobs(lease_ttl_s=lease_ttl_s, redis_url=url)


def _lapsed(jobs: ThinkJobs, agent_id: int) -> bool:
    query = sa.text("SELECT lease_expires_at < now() FROM think_agents WHERE id = :id")
    with jobs.db.engine.connect() as conn:
        return bool(conn.execute(query, {"id": agent_id}).scalar_one())


def _in_transaction(jobs: ThinkJobs) -> int:
    """Sessions of this database, other than the asking one, idle inside a transaction."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
    )
    with jobs.db.engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def _leased(jobs: ThinkJobs, name: str) -> bool:
    query = sa.text("SELECT lease_token IS NOT NULL FROM think_agents WHERE agent_name = :name")
    with jobs.db.engine.connect() as conn:
        return bool(conn.execute(query, {"name": name}).scalar_one())


def _killed_mid_stream(
    jobs: ThinkJobs, env: dict[str, str], agent: Recorder
) -> SubmitMessagesResult:
    """A long turn submitted, its worker SIGKILLed once the turn streamed a few words."""
    text = " ".join(f"w{i}" for i in range(200))
    first = agent.submit_messages([directive("m-1", label="a", text=text, delay_s=0.05)])
    with worker_processes(env, count=1) as [dying]:
        wait_until(lambda: _chunks(jobs, "a") >= 10, 60, interval_s=0.02)
        dying.kill()
    return first


def _assert_shown(streamed: list[StreamEvent], partial: UIMessage) -> None:
    """What the client read of the cancelled turn is what the agent keeps."""
    chunks = [event.chunk for event in streamed if event.chunk is not None]
    shown = assemble(chunks, partial.id)
    assert message_text(shown).startswith("w0 w1 w2 w3 w4 w5")
    assert shown.parts == partial.parts


def _chunks(jobs: ThinkJobs, label: str) -> int:
    return sum(1 for e in read_events(jobs) if e["what"] == "chunk" and e["label"] == label)
