"""The final write that also claims the agent's next turn, in one statement on PostgreSQL
(``db.final_write.write_final_and_claim``): a drain of an agent with no hook after the final
write, keeping the lease for the turns queued behind."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.test_admission import statements
from tests.integration.test_claim import conversation
from tests.integration.test_final_write import claimed_lease, reply, stored
from tests.support.builders import user
from tests.support.pg_sessions import wait_for_lock_waiter
from think_jobs import Think, ThinkJobs
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.domain.records import AgentRef, NewTurn
from think_jobs.domain.status import Kind
from think_jobs.engine import drain
from think_jobs.engine.execution import Claimed, claim
from think_jobs.engine.lease import LeaseLost
from think_jobs.models import ModelRequest, Reply, ScriptedModel

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def _seen(request: ModelRequest) -> Reply:
    return Reply(text="|".join(message.id for message in request.messages))


class Echo(Think):
    """No hook: its reply names the messages its model saw, in order."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(_seen)


def echo_queued(jobs: ThinkJobs, count: int) -> AgentRef:
    jobs.register(Echo)
    agent = jobs.get_agent(Echo, "e")
    for i in range(count):
        agent.submit_messages([user(f"u{i}", f"m{i}")])
    agent_id = jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    return AgentRef(agent_id, "Echo", "e")


def statuses(jobs: ThinkJobs, agent: AgentRef) -> list[str]:
    query = sa.text("SELECT status FROM think_turns WHERE agent_id = :a ORDER BY seq")
    with jobs.db.read() as conn:
        return [str(status) for status in conn.execute(query, {"a": agent.id}).scalars()]


def replies_saw_their_past(messages: list[dict[str, Any]]) -> None:
    """Each reply follows its turn's message and names every message before it, in order."""
    ids = [m["id"] for m in messages]
    assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
    for index in range(1, len(messages), 2):
        assert messages[index]["parts"][-1]["text"] == "|".join(ids[:index]), index


def test_a_drain_claims_each_next_turn_in_the_final_write_of_the_turn_before(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(drain_slice_s=60.0)  # the drain's slice lasts the three turns
    agent = echo_queued(jobs, 3)
    with statements(jobs) as sent:
        drained = drain.drain(jobs.services, agent.id)
    assert drained.ran == 3
    writes = [sql.split()[:2] for sql, _ in sent if sql.split()[0] == "WITH"]
    assert writes == [["WITH", "fresh"], ["WITH", "leased"], ["WITH", "leased"], ["WITH", "fenced"]]
    messages = conversation(jobs, agent)
    assert [m["id"] for m in messages][::2] == ["m0", "m1", "m2"]
    replies_saw_their_past(messages)
    assert statuses(jobs, agent) == ["completed"] * 3
    with jobs.db.read() as conn:
        assert not agent_ops.lease_is_live(conn, agent.id)


def test_the_claimed_turn_sees_the_reply_that_replaced_a_partial_in_its_place(
    jobs: ThinkJobs,
) -> None:
    """A continued reply replaces the partial stored under its id, where it stood."""
    agent = echo_queued(jobs, 2)
    turn, lease = claimed_lease(jobs, agent)
    with lease.write("stall") as conn:  # a partial reply, as a stalled attempt leaves it
        conversation_ops.upsert_message(
            conn, agent.id, reply("part", "r1"), turn_id=turn.id, now=lease.db_now
        )
    ended, found = lease.write_final_and_claim(
        turn, status="completed", error=None, reply=reply("whole", "r1"), assistant_message_id="n"
    )
    assert ended is not None and found is not None and found.turn is not None
    assert (found.turn.seq, found.turn.status, found.turn.attempt) == (2, "running", 1)
    assert found.turn.assistant_message_id == "n" and found.admitted == 2
    assert found.history is not None
    history = json.loads(found.history)
    assert history == [user("u0", "m0"), reply("whole", "r1"), user("u1", "m1")]
    assert conversation(jobs, agent) == history
    after, _ = stored(jobs, agent, turn)
    assert after.status == "completed"


def test_nothing_is_claimed_when_the_next_head_is_not_a_fresh_submission(
    jobs: ThinkJobs,
) -> None:
    """A head the one-statement claim cannot start (here a blocking turn only its caller
    runs) is left to the general claim; the final write is stored and the lease kept."""
    agent = echo_queued(jobs, 1)
    turn, lease = claimed_lease(jobs, agent)
    with jobs.db.write() as conn:
        admitted = agent_ops.next_admission(conn, agent.id)
        new = NewTurn(str(uuid.uuid4()), Kind.BLOCKING, "chat", messages=[user("u1", "m1")])
        turn_ops.insert_turn(conn, agent_id=agent.id, seq=admitted.seq, new=new)
    ended, found = lease.write_final_and_claim(
        turn, status="completed", error=None, reply=reply("r"), assistant_message_id="n"
    )
    assert ended is not None and found is None
    assert lease.locally_valid() and lease.held is not None and lease.held.admitted == 2
    with jobs.db.read() as conn:
        head = turn_ops.head_turn(conn, agent.id)
    assert head is not None and (head.seq, head.status) == (2, "pending")


def test_a_turn_admitted_while_the_final_write_waited_is_claimed_after_it_in_order(
    jobs: ThinkJobs,
) -> None:
    """The statement's snapshot is taken before it waits for the agent row: an admission
    that held the row meanwhile is not in it, so the statement claims nothing, and the drain's
    own claim under the lease it kept starts the new turn on the conversation with the reply."""
    agent = echo_queued(jobs, 1)
    turn, lease = claimed_lease(jobs, agent)
    found: list[Any] = []

    def final_write() -> None:
        found.append(
            lease.write_final_and_claim(
                turn,
                status="completed",
                error=None,
                reply=reply("r0", "r0"),
                assistant_message_id="n",
            )
        )

    with jobs.db.write() as conn:  # an admission holding the agent row
        admitted = agent_ops.next_admission(conn, agent.id)
        new = NewTurn(str(uuid.uuid4()), Kind.SUBMISSION, "submission", messages=[user("u1", "m1")])
        turn_ops.insert_turn(conn, agent_id=agent.id, seq=admitted.seq, new=new)
        writing = threading.Thread(target=final_write)
        writing.start()
        wait_for_lock_waiter(jobs)
    writing.join(10)
    assert found and found[0][0] is not None and found[0][1] is None
    following = claim(jobs.services, agent, held=lease)  # as the drain goes on
    assert isinstance(following, Claimed), following
    assert following.claim.turn.seq == 2 and following.claim.history is not None
    assert [m["id"] for m in json.loads(following.claim.history)] == ["m0", "r0", "m1"]


def test_a_final_write_that_lost_the_lease_claims_nothing(jobs: ThinkJobs) -> None:
    agent = echo_queued(jobs, 2)
    turn, lease = claimed_lease(jobs, agent)
    with jobs.db.write() as conn:  # the lease lapsed and another process took it
        agent_ops.release_lease(conn, agent.id, lease.token)
        assert agent_ops.try_acquire_lease(conn, agent.id, uuid.uuid4().hex, ttl_s=30.0)
    with pytest.raises(LeaseLost):
        lease.write_final_and_claim(
            turn, status="completed", error=None, reply=reply("stale"), assistant_message_id="n"
        )
    _, messages = stored(jobs, agent, turn)
    assert [m["id"] for m in messages] == ["m0"]
    assert statuses(jobs, agent) == ["running", "pending"]


def test_a_final_write_with_no_reply_claims_the_next_turn_on_the_conversation_as_it_is(
    jobs: ThinkJobs,
) -> None:
    agent = echo_queued(jobs, 2)
    turn, lease = claimed_lease(jobs, agent)
    ended, found = lease.write_final_and_claim(
        turn, status="error", error="the model said nothing", reply=None, assistant_message_id="n"
    )
    assert ended is not None and found is not None and found.turn is not None
    assert found.turn.seq == 2 and found.history is not None
    assert [m["id"] for m in json.loads(found.history)] == ["m0", "m1"]
    after, messages = stored(jobs, agent, turn)
    assert (after.status, after.error) == ("error", "the model said nothing")
    assert [m["id"] for m in messages] == ["m0", "m1"]
    assert statuses(jobs, agent) == ["error", "running"]
