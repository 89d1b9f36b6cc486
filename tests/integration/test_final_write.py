"""A turn's final write in one statement on PostgreSQL (``db.final_write``): the fence, the
final status and the reply, each written only when the fence matched."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from tests.apps.agents import Support
from tests.integration.test_admission import statements
from tests.integration.test_queueing import queued
from tests.support.builders import buffer_key, texts, user, wait_for_status, wait_until
from tests.support.proxy import proxy_to
from think_jobs import ChatResponseResult, Think, ThinkJobs
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.domain.records import AgentRef, TurnRecord
from think_jobs.engine.execution import Claimed, claim
from think_jobs.engine.lease import Lease, LeaseLost
from think_jobs.testing import worker

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def reply(text: str, message_id: str = "r1") -> dict[str, Any]:
    return {"id": message_id, "role": "assistant", "parts": [{"type": "text", "text": text}]}


def claimed_lease(jobs: ThinkJobs, agent: AgentRef) -> tuple[TurnRecord, Lease]:
    result = claim(jobs.services, agent)
    assert isinstance(result, Claimed), result
    return result.claim.turn, result.lease


def agent_row(jobs: ThinkJobs, agent: AgentRef) -> tuple[Any, ...]:
    with jobs.db.read() as conn:
        query = "SELECT lease_token, lease_expires_at FROM think_agents WHERE id = :a"
        return tuple(conn.execute(sa.text(query), {"a": agent.id}).one())


def stored(jobs: ThinkJobs, agent: AgentRef, turn: TurnRecord) -> tuple[TurnRecord, list[Any]]:
    with jobs.db.read() as conn:
        found = turn_ops.get_turn_by_id(conn, turn.id)
        conversation = json.loads(conversation_ops.load_messages_json(conn, agent.id))
    assert found is not None
    return found, conversation


def test_the_final_write_is_one_statement_that_renews_the_lease(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 2)
    turn, lease = claimed_lease(jobs, agent)
    expires_before = agent_row(jobs, agent)[1]
    with statements(jobs) as sent:
        ended = lease.write_final(
            turn, status="completed", error=None, reply=reply("done"), releasing=False
        )
    assert [(sql.split()[:2], autocommit) for sql, autocommit in sent] == [
        (["WITH", "fenced"], True)
    ]
    assert ended is not None and ended.completed_at is not None
    after, conversation = stored(jobs, agent, turn)
    assert (after.status, after.error, after.agent_id, after.attempt) == (
        "completed", None, agent.id, turn.attempt,
    )  # fmt: skip
    assert after.completed_at == ended.completed_at
    assert conversation[-1] == reply("done")
    token, expires = agent_row(jobs, agent)
    assert token == lease.token and expires > expires_before
    assert lease.held is not None and lease.db_now == lease.held.now and not lease.released


def test_the_releasing_final_write_gives_the_lease_back(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 1)
    turn, lease = claimed_lease(jobs, agent)
    ended = lease.write_final(
        turn, status="completed", error=None, reply=reply("bye"), releasing=True
    )
    assert ended is not None and lease.released and lease.admitted_at_release == 1
    assert agent_row(jobs, agent) == (None, None)
    after, conversation = stored(jobs, agent, turn)
    assert after.status == "completed" and conversation[-1] == reply("bye")


def test_a_final_write_without_the_lease_writes_nothing(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 1)
    turn, lease = claimed_lease(jobs, agent)
    with jobs.db.write() as conn:  # the lease lapsed and another process took it
        agent_ops.release_lease(conn, agent.id, lease.token)
        assert agent_ops.try_acquire_lease(conn, agent.id, uuid.uuid4().hex, ttl_s=30.0)
    for releasing in (False, True):
        with pytest.raises(LeaseLost):
            lease.write_final(
                turn, status="completed", error=None, reply=reply("stale"), releasing=releasing
            )
    after, conversation = stored(jobs, agent, turn)
    assert after.status == "running" and after.completed_at is None
    assert [m["id"] for m in conversation] == ["m0"]  # no stale reply
    assert not lease.locally_valid()


def test_a_status_set_meanwhile_is_kept_and_the_reply_replaces_the_partial(
    jobs: ThinkJobs,
) -> None:
    agent, _ = queued(jobs, 1)
    turn, lease = claimed_lease(jobs, agent)
    with jobs.db.write() as conn:  # a partial reply stored earlier, then a cancellation
        conversation_ops.upsert_message(
            conn, agent.id, reply("part"), turn_id=turn.id, now=lease.db_now
        )
        turn_ops.end_turn(conn, turn.id, status="aborted", error="stopped by the user")
    ended = lease.write_final(
        turn, status="completed", error=None, reply=reply("partial, then more"), releasing=False
    )
    assert ended is None  # not ours to end
    after, conversation = stored(jobs, agent, turn)
    assert (after.status, after.error) == ("aborted", "stopped by the user")
    assert [m["id"] for m in conversation] == ["m0", "r1"]
    assert conversation[-1] == reply("partial, then more")


# -- the database gone between the release and the read of the next head -------------------


class Hooked(Support):
    """With a hook after the final write, the lease is given back by a statement of its own."""

    def on_chat_response(self, result: ChatResponseResult) -> None:
        pass


# The statement that gives the lease back, as each path sends it.
_RELEASES: dict[type[Think], str] = {
    Support: "WITH fenced AS (UPDATE think_agents SET lease_token=NULL",
    Hooked: "UPDATE think_agents SET lease_token=NULL",
}


@pytest.mark.parametrize("agent_class", [Support, Hooked], ids=["with-final-write", "alone"])
def test_a_database_gone_right_after_the_release_neither_fails_the_turn_nor_strands_the_next(
    make_jobs: Any, database_url: str, agent_class: type[Think]
) -> None:
    """The lease is given back, then PostgreSQL refuses the worker before it reads the head:
    the turn still ends as any other (its stream's ``done``), and a drain is nudged to look
    for the next turn instead of leaving it to the sweeper (off here)."""
    observer = make_jobs()
    agent = observer.get_agent(agent_class, "a")
    first = agent.submit_messages([user("one")])
    second = agent.submit_messages([user("two")])
    with proxy_to(5432) as proxy:
        port = database_url.split("@", 1)[1].split("/", 1)[0]
        proxied = database_url.replace(port, f"127.0.0.1:{proxy.port}")
        cut_off = make_jobs(database_url=proxied, drain_slice_s=0)  # release after each turn
        cut_off.get_agent(agent_class, "a")  # registered in the worker's process

        def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if " ".join(statement.split()).startswith(_RELEASES[agent_class]) and not fired:
                fired.append(statement)
                proxy.down()

        fired: list[str] = []
        sa.event.listen(cut_off.db.engine, "after_cursor_execute", after)
        with worker(cut_off, sweeper=False):
            key = buffer_key(agent, first.submission_id)

            def ended() -> bool:
                return any(b'"done":true' in raw for raw in observer.redis.lrange(key, 0, -1))

            wait_until(ended)  # with a hook, the release comes after the stream's end
            wait_until(lambda: fired)
            assert wait_for_status(agent, first.submission_id, "completed")
            proxy.heal()
            wait_for_status(agent, second.submission_id, "completed")
    assert texts(agent) == [
        ("user", "one"), ("assistant", "Thanks, we are on it."),
        ("user", "two"), ("assistant", "Thanks, we are on it."),
    ]  # fmt: skip
