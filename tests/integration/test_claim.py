"""The common claim in one statement on PostgreSQL (``db.claim``), and its guard.

One statement has one snapshot, taken before it waits for the agent row's lock. Without the
guard, a claim queued behind the previous holder's final write would start the next turn on a
conversation read before that write: the model would not see the reply just stored.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.test_admission import statements
from tests.integration.test_queueing import Quiet, claimed, queued
from tests.support.builders import user
from tests.support.pg_sessions import wait_for_lock_waiter
from think_jobs import ThinkJobs
from think_jobs.db import agents as agent_ops
from think_jobs.db import claim as claim_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.tables import UTCDateTime, turns
from think_jobs.domain.records import AgentRef, Idle, NotClaimed
from think_jobs.engine.execution import Claimed, claim
from think_jobs.messages import stored_messages

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def conversation(jobs: ThinkJobs, agent: AgentRef) -> list[dict[str, Any]]:
    with jobs.db.read() as conn:
        found: list[dict[str, Any]] = json.loads(
            conversation_ops.load_messages_json(conn, agent.id)
        )
    return found


def test_a_fresh_head_is_claimed_in_one_statement_that_commits_by_itself(
    jobs: ThinkJobs,
) -> None:
    jobs.register(Quiet)
    handle = jobs.get_agent(Quiet, "a")
    handle.submit_messages([user("first", "m1"), user("second", "m2")])
    handle.submit_messages([user("later", "m3")])
    agent_id = jobs.agent_id_of(handle, create=False)
    assert agent_id is not None
    agent = AgentRef(agent_id, "Quiet", "a")
    with statements(jobs) as sent:
        result = claim(jobs.services, agent)
    assert [(sql.split()[:2], autocommit) for sql, autocommit in sent] == [
        (["WITH", "fresh"], True)
    ]
    assert isinstance(result, Claimed), result
    taken = result.claim
    assert (taken.turn.seq, taken.turn.status, taken.turn.attempt) == (1, "running", 1)
    assert taken.turn.messages_applied and taken.turn.started_at is not None
    assert taken.turn.assistant_message_id and not taken.recovering
    assert taken.admitted == 2 and taken.queued_behind  # "later" waits behind it
    with jobs.db.read() as conn:
        assert turn_ops.get_turn_by_id(conn, taken.turn.id) == taken.turn
        row = conn.execute(
            sa.text("SELECT lease_token, lease_expires_at > now() FROM think_agents WHERE id = :a"),
            {"a": agent.id},
        ).one()
    assert tuple(row) == (taken.token, True)  # the lease is held, with this claim's token
    stored = conversation(jobs, agent)
    assert [(m["id"], m["role"]) for m in stored] == [("m1", "user"), ("m2", "user")]
    assert taken.history is not None and json.loads(taken.history) == stored
    assert [m.id for m in stored_messages(taken.history)] == ["m1", "m2"]


def test_a_message_already_stored_is_skipped_as_the_general_path_does(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 0)
    handle = jobs.get_agent(Quiet, "a")
    handle.submit_messages([user("hello", "m1")])
    first = claimed(jobs, agent)
    with jobs.db.write() as conn:  # the first turn ends and gives the lease back
        turn_ops.finish_turn(conn, first.turn, status="completed", error=None)
        agent_ops.release_lease(conn, agent.id, first.token)
    handle.submit_messages([user("hello again", "m1"), user("new", "m2")])
    second = claimed(jobs, agent)
    assert second.turn.seq == 2
    assert [m["id"] for m in conversation(jobs, agent)] == ["m1", "m2"]
    assert second.history is not None
    assert [m["id"] for m in json.loads(second.history)] == ["m1", "m2"]


def test_a_claim_behind_a_clear_of_the_conversation_does_not_see_what_it_deleted(
    jobs: ThinkJobs,
) -> None:
    """``clear_messages`` takes the lease, deletes the conversation and gives the lease back in
    one transaction. A claim that took its snapshot before that commit finds the lease free
    both before and after; without the guard it would start the next turn on the deleted
    conversation (the guard sends it down the general path, which reads after the lock)."""
    agent, _ = queued(jobs, 1)
    with jobs.db.write() as conn:  # a conversation from before
        conversation_ops.append_messages(
            conn, agent.id, [user("old", "old-1")], turn_id=None, now=datetime.now(UTC)
        )
    found: list[Claimed | NotClaimed] = []
    with jobs.db.write() as conn:  # the clear, holding the agent row
        token = uuid.uuid4().hex
        assert agent_ops.try_acquire_lease(conn, agent.id, token, ttl_s=30.0) is not None
        conversation_ops.delete_conversation(conn, agent.id)
        agent_ops.release_lease(conn, agent.id, token)
        claiming = threading.Thread(target=lambda: found.append(claim(jobs.services, agent)))
        claiming.start()
        wait_for_lock_waiter(jobs)
    claiming.join(10)
    assert found, "the claim did not finish"
    result = found[0]
    assert isinstance(result, Claimed), result
    assert result.claim.history is not None
    assert [m["id"] for m in json.loads(result.claim.history)] == ["m0"]
    assert [m["id"] for m in conversation(jobs, agent)] == ["m0"]


def test_a_head_cancelled_while_the_claim_waited_is_not_started(jobs: ThinkJobs) -> None:
    """A cancellation does not touch the agent row, so the guard lets the statement go on; the
    head is started only if it is still pending, and the lease the statement took is then
    given back by the general path."""
    agent, ids = queued(jobs, 1)
    found: list[Claimed | NotClaimed] = []
    with jobs.db.write() as conn:  # a cancellation holding the head's row
        head = turn_ops.get_turn(conn, agent.id, ids[0])
        assert head is not None
        conn.execute(
            sa.text("SELECT id FROM think_turns WHERE id = :id FOR UPDATE"), {"id": head.id}
        )
        claiming = threading.Thread(target=lambda: found.append(claim(jobs.services, agent)))
        claiming.start()
        wait_for_lock_waiter(jobs)
        turn_ops.end_turn(conn, head.id, status="aborted", error="cancelled")
    claiming.join(10)
    assert found == [NotClaimed(Idle.IDLE)]
    with jobs.db.read() as conn:
        assert not agent_ops.lease_is_live(conn, agent.id)
        assert turn_ops.get_turn(conn, agent.id, ids[0]).status == "aborted"  # type: ignore[union-attr]
    assert conversation(jobs, agent) == []


def test_a_busy_lease_writes_nothing(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 2)
    holder = claimed(jobs, agent)
    with statements(jobs) as sent:
        result = claim(jobs.services, agent)
    assert result == NotClaimed(Idle.BUSY)
    assert sent[0][0].split()[:2] == ["WITH", "fresh"]
    with jobs.db.read() as conn:
        token = conn.execute(
            sa.text("SELECT lease_token FROM think_agents WHERE id = :a"), {"a": agent.id}
        ).scalar_one()
    assert token == holder.token


def test_a_held_lease_claims_the_next_fresh_head_in_one_statement(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 2)
    result = claim(jobs.services, agent)
    assert isinstance(result, Claimed)
    with jobs.db.write() as conn:
        turn_ops.finish_turn(conn, result.claim.turn, status="completed", error=None)
    with statements(jobs) as sent:
        following = claim(jobs.services, agent, held=result.lease)
    assert isinstance(following, Claimed), following
    assert [(sql.split()[:2], autocommit) for sql, autocommit in sent] == [
        (["WITH", "fresh"], True)
    ]
    assert following.claim.token == result.claim.token and following.claim.turn.seq == 2


def test_a_message_holding_nul_is_claimed_by_the_general_path(jobs: ThinkJobs) -> None:
    """JSON keeps a NUL as ``\\u0000``, which PostgreSQL's ``->>`` refuses to turn into text:
    the one statement leaves such a head alone and the general path claims it."""
    jobs.register(Quiet)
    handle = jobs.get_agent(Quiet, "a")
    message = {
        "id": "m1",
        "role": "user",
        "parts": [{"type": "text", "text": "a\x00b"}, {"type": "data-x", "data": {"k\x00": 1}}],
    }
    handle.submit_messages([message])
    agent_id = jobs.agent_id_of(handle, create=False)
    assert agent_id is not None
    agent = AgentRef(agent_id, "Quiet", "a")
    with statements(jobs) as sent:
        result = claim(jobs.services, agent)
    assert isinstance(result, Claimed), result
    assert result.claim.turn.status == "running" and result.claim.turn.attempt == 1
    assert sent[0][0].split()[:2] == ["WITH", "fresh"] and len(sent) > 1  # then the general path
    stored = conversation(jobs, agent)
    assert stored == [message]
    assert result.claim.history is not None and json.loads(result.claim.history) == stored


def test_a_turn_row_is_read_by_position_in_the_order_the_statement_selects(
    jobs: ThinkJobs,
) -> None:
    """The one-statement claims name every column by position (``claim.with_turn_columns``),
    which is what lets SQLAlchemy keep the result's metadata with the compiled statement;
    each column still reads back under its own name, with its type."""
    agent, _ = queued(jobs, 1)
    columns = f"{claim_ops.TURN_COLUMNS}, 7 AS extra_count, now() AS extra_at"
    statement = claim_ops.with_turn_columns(
        sa.text(f"SELECT {columns} FROM think_turns AS s WHERE s.agent_id = :agent_id"),
        {"extra_count": sa.BigInteger(), "extra_at": UTCDateTime()},
    )
    assert statement.positional
    with jobs.db.read() as conn:
        row = conn.execute(statement, {"agent_id": agent.id}).one()._mapping
        stored = turn_ops.head_turn(conn, agent.id)
    assert list(row.keys()) == [column.name for column in turns.c] + ["extra_count", "extra_at"]
    assert turn_ops.record_of_row({column.name: row[column.name] for column in turns.c}) == stored
    assert row["extra_count"] == 7 and row["extra_at"].tzinfo is not None
