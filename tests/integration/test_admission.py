"""Admission in one statement on PostgreSQL (``db.admission``), and its guard; the release in
one statement, and why it needs none.

One statement has one snapshot, taken before it waits for the agent row's lock. The guard
makes it give way to the two-statement path whenever someone changed the agent row in
between; without it an admission queued behind a release would read the released turn as
still running, nudge nobody, and its turn would wait for the sweeper.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.test_queueing import Quiet, claimed, queued
from tests.support.builders import user
from tests.support.pg_sessions import wait_for_lock_waiter
from think_jobs import ThinkJobs
from think_jobs.db import agents as agent_ops
from think_jobs.db import turns as turn_ops
from think_jobs.domain import policy
from think_jobs.domain.policy import Nudge
from think_jobs.domain.records import Admission, AgentRef, NewTurn, Released
from think_jobs.domain.status import Kind
from think_jobs.engine import submissions
from think_jobs.engine.execution import Claimed, claim
from think_jobs.engine.lease import Lease
from think_jobs.errors import SubmissionConflictError

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


@contextmanager
def statements(jobs: ThinkJobs) -> Iterator[list[tuple[str, bool]]]:
    """The statements this thread sends to the database while the block runs, each with
    whether its connection was in autocommit (the statement was its own transaction)."""
    sent: list[tuple[str, bool]] = []
    thread = threading.get_ident()

    def record(conn: sa.Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.get_ident() == thread:
            sent.append((statement, conn.connection.driver_connection.autocommit))  # type: ignore[union-attr]

    sa.event.listen(jobs.db.engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(jobs.db.engine, "before_cursor_execute", record)


def admit(
    jobs: ThinkJobs, agent: AgentRef, text: str, *, key: str | None = None
) -> tuple[Admission, list[tuple[str, bool]]]:
    new = NewTurn(
        str(uuid.uuid4()), Kind.SUBMISSION, "submission", messages=[user(text)], idempotency_key=key
    )
    with statements(jobs) as sent:
        admission = submissions.admit(jobs.services, agent.id, new, submission_id=None)
    return admission, sent


def admitted_count(jobs: ThinkJobs, agent: AgentRef) -> int:
    with jobs.db.read() as conn:
        query = sa.text("SELECT admitted FROM think_agents WHERE id = :id")
        return int(conn.execute(query, {"id": agent.id}).scalar_one())


def test_a_submission_is_one_statement_that_commits_by_itself(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 0)
    first, sent = admit(jobs, agent, "first")
    assert [(sql.split()[:2], autocommit) for sql, autocommit in sent] == [
        (["WITH", "bumped"], True)
    ]
    assert first.accepted and first.is_head
    second, sent = admit(jobs, agent, "second", key="k-2")
    assert [(sql.split()[:2], autocommit) for sql, autocommit in sent] == [
        (["WITH", "bumped"], True)
    ]
    assert second.accepted and not second.is_head  # behind "first"
    assert (first.turn.seq, second.turn.seq) == (1, 2)
    assert second.turn.idempotency_key == "k-2" and second.turn.created_at is not None
    with jobs.db.read() as conn:
        stored = turn_ops.get_turn_by_id(conn, second.turn.id)
    assert stored == second.turn


def test_a_key_already_used_is_answered_by_one_more_read(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 0)
    first, _ = admit(jobs, agent, "first", key="evt-1")
    again, sent = admit(jobs, agent, "again", key="evt-1")
    shapes = [(sql.split()[:2], autocommit) for sql, autocommit in sent]
    assert shapes == [(["WITH", "bumped"], True), (["SELECT", "think_turns.id,"], True)]
    assert not again.accepted and again.turn.id == first.turn.id
    assert admitted_count(jobs, agent) == 1  # the duplicate bumped nothing
    assert [m.id for m in jobs.get_agent(Quiet, "a").get_messages()] == []  # not started yet


def test_ids_naming_two_different_turns_are_refused_and_change_nothing(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 0)
    first, _ = admit(jobs, agent, "first", key="evt-1")
    new = NewTurn(str(uuid.uuid4()), Kind.SUBMISSION, "submission", messages=[user("x")])
    with pytest.raises(SubmissionConflictError):
        submissions.admit(
            jobs.services,
            agent.id,
            replace(new, idempotency_key="evt-1"),
            submission_id="another-id",
        )
    assert admitted_count(jobs, agent) == 1 and first.accepted


def test_an_admission_behind_a_release_sees_the_released_turn_finished(jobs: ThinkJobs) -> None:
    agent, _ = queued(jobs, 1)
    taken = claimed(jobs, agent)
    found: list[Admission] = []
    with jobs.db.write() as conn:  # the worker's final write, holding the agent row
        turn_ops.finish_turn(conn, taken.turn, status="completed", error=None)
        agent_ops.release_lease(conn, taken.agent_id, taken.token)
        admitting = threading.Thread(target=lambda: found.append(admit(jobs, agent, "next")[0]))
        admitting.start()
        wait_for_lock_waiter(jobs)  # its snapshot holds the turn as running
    admitting.join(10)
    assert found, "the admission did not finish"
    admission = found[0]
    assert admission.accepted and admission.turn.seq == 2
    assert admission.is_head  # nobody else will nudge: the release saw no turn behind
    assert admitted_count(jobs, agent) == 2


# -- the release: one statement, its admission count read from the row it locked ----------


def _lease_of(jobs: ThinkJobs, agent: AgentRef) -> Lease:
    result = claim(jobs.services, agent)
    assert isinstance(result, Claimed), result
    with jobs.db.write() as conn:  # the turn's final write, as a worker makes it
        turn_ops.finish_turn(conn, result.claim.turn, status="completed", error=None)
    return result.lease


def test_a_release_with_nothing_admitted_behind_is_one_autocommit_statement(
    jobs: ThinkJobs,
) -> None:
    agent, _ = queued(jobs, 1)
    lease = _lease_of(jobs, agent)
    with statements(jobs) as sent:
        released = lease.release(ended_seq=1)
    assert released == Released(None) and lease.released
    assert [(statement.split()[0], autocommit) for statement, autocommit in sent] == [
        ("UPDATE", True)
    ]


def test_a_release_names_the_turn_admitted_while_it_waited_for_the_agent_row(
    jobs: ThinkJobs,
) -> None:
    """The release's statement takes its snapshot before it waits for the row lock an
    admission holds; the admission count it returns is the row's latest, so the turn that
    admission commits is read as the head and nudged (it saw the lease held and nudged no one)."""
    agent, _ = queued(jobs, 1)
    lease = _lease_of(jobs, agent)
    found: list[Released] = []
    with jobs.db.write() as conn:  # an admission holding the agent row, not committed yet
        admitted = agent_ops.next_admission(conn, agent.id)
        assert admitted.lease_held  # so it nudges nobody
        new = NewTurn(str(uuid.uuid4()), Kind.SUBMISSION, "submission", messages=[user("x")])
        turn_ops.insert_turn(conn, agent_id=agent.id, seq=admitted.seq, new=new)
        releasing = threading.Thread(target=lambda: found.append(lease.release(ended_seq=1)))
        releasing.start()
        wait_for_lock_waiter(jobs)
    releasing.join(10)
    assert found, "the release did not finish"
    head = found[0].next_turn
    assert head is not None and (head.seq, head.status) == (2, "pending")
    assert policy.nudge_after_release(found[0]) is Nudge.DRAIN


def test_a_release_whose_turn_may_still_be_active_reads_the_head(jobs: ThinkJobs) -> None:
    """A stalled attempt hands its turn back to recovery before releasing: it is the head."""
    agent, _ = queued(jobs, 1)
    result = claim(jobs.services, agent)
    assert isinstance(result, Claimed), result
    with jobs.db.write() as conn:
        turn_ops.requeue_turn(conn, result.claim.turn)
    released = result.lease.release(ended_seq=None)
    assert released.next_turn is not None and released.next_turn.seq == 1
    assert policy.nudge_after_release(released) is Nudge.DRAIN
