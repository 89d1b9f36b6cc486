"""SPEC §5, rule by rule, on SQLite and PostgreSQL, with real Redis and real Celery workers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from tests.apps.agents import Recorder, Support, read_events
from tests.support.builders import (
    buffer_key,
    directive,
    texts,
    user,
    wait_for_status,
    wait_until,
)
from think_jobs import (
    EmptySubmissionError,
    InvalidInputError,
    MessageValidationError,
    SubmissionConflictError,
    SubmissionInspection,
    Think,
    ThinkJobs,
    UnknownCursorError,
)
from think_jobs.db.tables import turns
from think_jobs.messages import ToolPart, message_text
from think_jobs.models import Reply, ScriptedModel, ToolCall
from think_jobs.testing import worker
from think_jobs.tools import tool


def turn_rows(jobs: ThinkJobs) -> int:
    with jobs.db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(turns)).scalar_one())


# -- accepting ---------------------------------------------------------------------------------


def test_new_submission_is_pending_and_returns_before_any_model_work(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="x")])
    assert result.accepted is True
    assert result.status == "pending"
    assert result.request_id == result.submission_id
    assert uuid.UUID(result.submission_id).version == 4
    assert result.started_at is None and result.completed_at is None
    assert result.created_at.tzinfo is not None and result.created_at.utcoffset() == timedelta(0)
    assert read_events(jobs) == []  # no worker: the model never ran
    assert agent.get_messages() == []  # messages are applied only when the turn starts


def test_submission_runs_on_a_worker_and_completes(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "customer-42")
    result = agent.submit_messages([user("Hi", "m1")], idempotency_key="evt-123")
    with worker(jobs):
        done = wait_for_status(agent, result.submission_id, "completed")
    assert done.started_at is not None and done.completed_at is not None
    assert done.completed_at >= done.started_at >= done.created_at
    assert done.error is None
    assert texts(agent) == [("user", "Hi"), ("assistant", "Thanks, we are on it.")]


def test_given_submission_id_is_used(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    result = agent.submit_messages([user("Hi")], submission_id="sub-1")
    assert (result.submission_id, result.request_id) == ("sub-1", "sub-1")
    assert agent.inspect_submission("sub-1") is not None


# -- bad input ---------------------------------------------------------------------------------


def test_empty_messages_raise_value_error_and_store_nothing(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    with pytest.raises(EmptySubmissionError) as raised:
        agent.submit_messages([])
    assert isinstance(raised.value, ValueError)
    assert str(raised.value) == "submit_messages requires at least one message"
    assert turn_rows(jobs) == 0


def test_malformed_message_names_the_bad_field_and_stores_nothing(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    bad = {"id": "m1", "parts": [{"type": "text"}]}
    with pytest.raises(MessageValidationError) as raised:
        agent.submit_messages([user("fine"), bad])
    assert "messages[1].role: Field required" in str(raised.value)
    assert "messages[1].parts[0].text: Field required" in str(raised.value)
    assert turn_rows(jobs) == 0


def test_unknown_part_type_is_rejected(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    bad = {"id": "m1", "role": "user", "parts": [{"type": "hologram", "text": "x"}]}
    with pytest.raises(MessageValidationError, match='unknown message part type "hologram"'):
        agent.submit_messages([bad])
    assert turn_rows(jobs) == 0


def test_oversize_metadata_is_rejected(make_jobs) -> None:  # type: ignore[no-untyped-def]
    jobs = make_jobs(max_metadata_bytes=64)
    agent = jobs.get_agent(Support, "a")
    with pytest.raises(InvalidInputError, match=r"metadata is .* bytes as JSON; the limit is 64"):
        agent.submit_messages([user("hi")], metadata={"blob": "x" * 100})
    with pytest.raises(InvalidInputError, match="JSON-serialisable"):
        agent.submit_messages([user("hi")], metadata={"when": datetime.now(UTC)})
    assert turn_rows(jobs) == 0


# -- idempotency -------------------------------------------------------------------------------


def test_same_idempotency_key_returns_the_existing_submission_unchanged(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    first = agent.submit_messages([user("Hi", "m1")], idempotency_key="evt-1", metadata={"n": 1})
    retry = agent.submit_messages([user("Other", "m2")], idempotency_key="evt-1", metadata={"n": 2})
    assert retry.accepted is False
    assert retry.submission_id == first.submission_id
    assert retry.metadata == {"n": 1}
    with worker(jobs):
        wait_for_status(agent, first.submission_id, "completed")
    assert texts(agent) == [("user", "Hi"), ("assistant", "Thanks, we are on it.")]
    assert len(agent.list_submissions()) == 1


def test_same_submission_id_returns_the_existing_submission(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    first = agent.submit_messages([user("Hi", "m1")], submission_id="s1")
    again = agent.submit_messages([user("Other", "m2")], submission_id="s1")
    assert (again.accepted, again.submission_id, again.status) == (False, "s1", "pending")
    assert first.created_at == again.created_at


def test_duplicate_of_a_pending_submission_re_enqueues_its_work(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    first = agent.submit_messages([user("Hi")], idempotency_key="evt-1")
    jobs.redis.delete(jobs.settings.queue)  # the drain message is lost (say, a Redis restart)
    assert jobs.redis.llen(jobs.settings.queue) == 0
    agent.submit_messages([user("Hi")], idempotency_key="evt-1")
    assert jobs.redis.llen(jobs.settings.queue) == 1
    with worker(jobs, sweeper=False):
        wait_for_status(agent, first.submission_id, "completed")


def test_conflict_when_id_and_key_name_two_existing_submissions(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    agent.submit_messages([user("1")], submission_id="s1", idempotency_key="k1")
    agent.submit_messages([user("2")], submission_id="s2", idempotency_key="k2")
    with pytest.raises(SubmissionConflictError) as raised:
        agent.submit_messages([user("3")], submission_id="s1", idempotency_key="k2")
    assert str(raised.value) == "submission_id and idempotency_key refer to different submissions"
    assert turn_rows(jobs) == 2


def test_conflict_when_key_exists_and_a_new_submission_id_is_given(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    agent.submit_messages([user("1")], submission_id="s1", idempotency_key="k1")
    with pytest.raises(SubmissionConflictError):
        agent.submit_messages([user("2")], submission_id="brand-new", idempotency_key="k1")
    assert turn_rows(jobs) == 1


def test_conflict_when_id_exists_with_a_different_key(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    agent.submit_messages([user("1")], submission_id="s1", idempotency_key="k1")
    with pytest.raises(SubmissionConflictError):
        agent.submit_messages([user("2")], submission_id="s1", idempotency_key="k-other")
    assert turn_rows(jobs) == 1


def test_id_without_key_then_same_id_with_a_key_returns_the_existing(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    agent.submit_messages([user("1")], submission_id="s1")
    again = agent.submit_messages([user("2")], submission_id="s1", idempotency_key="k1")
    assert (again.accepted, again.idempotency_key) == (False, None)


def test_agents_never_share_ids_or_keys(jobs: ThinkJobs) -> None:
    one = jobs.get_agent(Support, "one")
    two = jobs.get_agent(Support, "two")
    a = one.submit_messages([user("x")], submission_id="s1", idempotency_key="k1")
    b = two.submit_messages([user("x")], submission_id="s1", idempotency_key="k1")
    assert a.accepted and b.accepted
    assert one.inspect_submission("s1") is not None and two.inspect_submission("s1") is not None
    other_type = jobs.get_agent(Recorder, "one")
    assert other_type.inspect_submission("s1") is None


# -- when messages become visible --------------------------------------------------------------


def test_messages_become_visible_only_when_their_own_turn_starts(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    first = agent.submit_messages([directive("m1", label="one", delay_s=0.05, text="a b c d e f")])
    second = agent.submit_messages([directive("m2", label="two")])
    with worker(jobs):
        wait_for_status(agent, first.submission_id, "running")
        ids = [m.id for m in agent.get_messages()]
        assert "m1" in ids and "m2" not in ids
        wait_for_status(agent, second.submission_id, "completed")
    assert [m.id for m in agent.get_messages() if m.role == "user"] == ["m1", "m2"]


# -- cancelling --------------------------------------------------------------------------------


def test_cancel_pending_submission_aborts_it_and_stores_nothing(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive("m1", label="never")])
    agent.cancel_submission(result.submission_id, "No longer needed")
    cancelled = agent.inspect_submission(result.submission_id)
    assert cancelled is not None
    assert (cancelled.status, cancelled.error) == ("aborted", "No longer needed")
    assert cancelled.completed_at is not None
    with worker(jobs):
        later = agent.submit_messages([directive("m2", label="after")])
        wait_for_status(agent, later.submission_id, "completed")
    assert [e["label"] for e in read_events(jobs) if e["what"] == "start"] == ["after"]
    assert "m1" not in [m.id for m in agent.get_messages()]
    assert agent.inspect_submission(result.submission_id).status == "aborted"  # type: ignore[union-attr]


def test_cancel_without_reason_leaves_error_none(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    result = agent.submit_messages([user("x")])
    agent.cancel_submission(result.submission_id)
    found = agent.inspect_submission(result.submission_id)
    assert found is not None and (found.status, found.error) == ("aborted", None)


def test_cancel_unknown_or_terminal_submission_is_a_no_op(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    agent.cancel_submission("does-not-exist", "why")
    result = agent.submit_messages([user("x")])
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
    agent.cancel_submission(result.submission_id, "too late")
    found = agent.inspect_submission(result.submission_id)
    assert found is not None and (found.status, found.error) == ("completed", None)


def test_cancel_queued_behind_a_running_turn_never_runs_it(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    running = agent.submit_messages(
        [directive("m1", label="slow", delay_s=0.05, text="a b c d e f g")]
    )
    queued = agent.submit_messages([directive("m2", label="queued")])
    with worker(jobs):
        wait_for_status(agent, running.submission_id, "running")
        agent.cancel_submission(queued.submission_id, "changed my mind")
        wait_for_status(agent, running.submission_id, "completed")
    assert [e["label"] for e in read_events(jobs) if e["what"] == "start"] == ["slow"]
    assert "m2" not in [m.id for m in agent.get_messages()]
    found = agent.inspect_submission(queued.submission_id)
    assert found is not None and (found.status, found.error) == ("aborted", "changed my mind")


def test_cancel_mid_stream_stops_within_a_chunk_and_keeps_the_partial(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    words = " ".join(f"w{i}" for i in range(200))
    result = agent.submit_messages([directive("m1", label="long", delay_s=0.02, text=words)])
    buffer = buffer_key(agent, result.submission_id)

    def deltas_published() -> int:
        return sum(1 for raw in jobs.redis.lrange(buffer, 0, -1) if b'"text-delta"' in raw)

    with worker(jobs):
        wait_until(lambda: deltas_published() >= 5)
        agent.cancel_submission(result.submission_id, "stop")
        at_cancel = deltas_published()
        found = wait_for_status(agent, result.submission_id, "aborted")
        events = list(agent.stream(result.submission_id, timeout_s=20))
    deltas = [e.chunk["delta"] for e in events if e.chunk and e.chunk["type"] == "text-delta"]
    assert at_cancel <= len(deltas) <= at_cancel + 1  # at most the chunk already in flight
    assert [e.chunk["type"] for e in events if e.chunk][-1] == "abort"
    assert (events[-1].done, events[-1].status, events[-1].error) == (True, "aborted", "stop")
    assert found.error == "stop"
    reply = [text for role, text in texts(agent) if role == "assistant"]
    assert reply == ["".join(deltas)] and "w199" not in reply[0]
    assert agent.inspect_submission(result.submission_id).status == "aborted"  # type: ignore[union-attr]


TOOL_ENTERED = threading.Event()
TOOL_RELEASE = threading.Event()


class LooksSomethingUp(Think):
    """Says it is looking, then calls a tool that waits until the test lets it go."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(
            Reply(text="looking", tool_calls=[ToolCall("lookup")], then=Reply(text="found it"))
        )

    def get_tools(self) -> dict[str, Any]:
        @tool
        def lookup() -> str:
            """Waits until the test lets it go."""
            TOOL_ENTERED.set()
            assert TOOL_RELEASE.wait(60), "the test never let the tool go"
            return "the answer"

        return {"lookup": lookup}


@pytest.fixture
def tool_gate() -> Iterator[None]:
    TOOL_ENTERED.clear()
    TOOL_RELEASE.clear()
    try:
        yield
    finally:
        TOOL_RELEASE.set()


@pytest.mark.usefixtures("tool_gate")
def test_a_turn_cancelled_in_a_tool_while_a_client_watches_still_stores_and_releases(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """A client following a turn cancelled inside a tool sees its stream end (after two idle
    polls the reader ends it from the database: the turn is aborted there). The attempt, once
    the tool returns, still stores its partial reply and gives the lease back at once — the
    stream ended from the database is not a newer attempt's — so the next turn runs without
    waiting for the lease (30 s) to lapse."""
    jobs = make_jobs(lease_ttl_s=30.0)
    agent = jobs.get_agent(LooksSomethingUp, "a")
    cancelled = agent.submit_messages([user("look it up")])
    after = agent.submit_messages([user("again")])
    with worker(jobs):
        assert TOOL_ENTERED.wait(30)
        agent.cancel_submission(cancelled.submission_id, "stop")
        seen = list(agent.stream(cancelled.submission_id, timeout_s=20))
        TOOL_RELEASE.set()
        wait_for_status(agent, after.submission_id, "completed", timeout_s=15)
    assert (seen[-1].done, seen[-1].status, seen[-1].error) == (True, "aborted", "stop")
    deltas = [e.chunk["delta"] for e in seen if e.chunk and e.chunk["type"] == "text-delta"]
    assert "".join(deltas) == "looking"
    found = agent.inspect_submission(cancelled.submission_id)
    assert found is not None and (found.status, found.attempt) == ("aborted", 1)
    [_, partial, _, _] = agent.get_messages()
    [call] = [part for part in partial.parts if isinstance(part, ToolPart)]
    assert (message_text(partial), call.tool_name) == ("looking", "lookup")


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_cancel_that_reads_a_turn_pending_as_a_worker_claims_it_aborts_it_as_running(
    jobs: ThinkJobs,
) -> None:
    """The cancel reads the turn (pending), then a claim commits (running), then the cancel
    writes: the turn is aborted as the running turn it now is — its executor is told through
    the revocation flag, and its stream is left for it to end — not as a pending turn whose
    stream the cancel ends itself. The test holds the turn's row so the cancel's write waits
    between the two, and moves the turn to running as a claim does."""
    agent = jobs.get_agent(Support, "a")
    result = agent.submit_messages([user("hi")])
    cancelling = threading.Thread(target=agent.cancel_submission, args=(result.submission_id,))
    with jobs.db.engine.connect() as conn, conn.begin():
        turn_id = conn.execute(
            select(turns.c.id).where(turns.c.request_id == result.submission_id).with_for_update()
        ).scalar_one()
        cancelling.start()
        wait_until(lambda: _waiting_on_a_lock(jobs), 30, interval_s=0.01)
        conn.execute(turns.update().where(turns.c.id == turn_id).values(status="running"))
    cancelling.join(30)
    found = agent.inspect_submission(result.submission_id)
    assert found is not None and found.status == "aborted"
    assert jobs.redis.exists(jobs.keys.revoked(agent.address, turn_id))
    assert not jobs.redis.exists(buffer_key(agent, result.submission_id))


def _waiting_on_a_lock(jobs: ThinkJobs) -> bool:
    query = (
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    )
    with jobs.db.read() as conn:
        return conn.exec_driver_sql(query).first() is not None


# -- final statuses ----------------------------------------------------------------------------


def test_model_that_raises_ends_in_error_with_its_message(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive("m1", text="partial", **{"raise": "model exploded"})])
    with worker(jobs):
        found = wait_for_status(agent, result.submission_id, "error")
    assert found.error == "model exploded"
    assert texts(agent) == [("user", texts(agent)[0][1]), ("assistant", "partial")]


def test_model_error_chunk_ends_in_error_with_its_text(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive("m1", text="so far", error="rate limited")])
    with worker(jobs):
        found = wait_for_status(agent, result.submission_id, "error")
    assert found.error == "rate limited"
    assert [role for role, _ in texts(agent)] == ["user", "assistant"]


# -- listing -----------------------------------------------------------------------------------


def test_list_is_newest_first_and_filters_before_the_limit(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    ids = [
        agent.submit_messages([user(str(i))], submission_id=f"s{i}").submission_id for i in range(5)
    ]
    agent.cancel_submission("s1")
    agent.cancel_submission("s3")
    assert [s.submission_id for s in agent.list_submissions()] == list(reversed(ids))
    assert [s.submission_id for s in agent.list_submissions(status="aborted", limit=1)] == ["s3"]
    both = agent.list_submissions(status=["aborted", "pending"], limit=10)
    assert [s.submission_id for s in both] == ["s4", "s3", "s2", "s1", "s0"]
    assert [s.submission_id for s in agent.list_submissions(status="pending")] == ["s4", "s2", "s0"]


def test_list_pages_with_a_before_cursor_in_the_same_order_as_one_listing(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Support, "a")
    for i in range(7):
        agent.submit_messages([user(str(i))], submission_id=f"s{i}")
    agent.cancel_submission("s2")
    with jobs.db.write() as conn:  # a tie on created_at: the submission id decides
        same = select(turns.c.created_at).where(turns.c.request_id == "s3").scalar_subquery()
        conn.execute(turns.update().where(turns.c.request_id == "s4").values(created_at=same))
    whole = [s.submission_id for s in agent.list_submissions()]
    assert whole == ["s6", "s5", "s4", "s3", "s2", "s1", "s0"]
    pages, before = [], None
    while page := agent.list_submissions(limit=3, before=before):
        pages.append([s.submission_id for s in page])
        before = page[-1].submission_id
    assert pages == [whole[:3], whole[3:6], whole[6:]]
    pending = agent.list_submissions(status="pending", limit=10, before="s4")
    assert [s.submission_id for s in pending] == ["s3", "s1", "s0"]
    agent.cancel_submission("s5")
    pages, before = [], None  # several statuses: each read from its own range, then merged
    while page := agent.list_submissions(status=["aborted", "pending"], limit=2, before=before):
        pages.append([s.submission_id for s in page])
        before = page[-1].submission_id
    assert pages == [["s6", "s5"], ["s4", "s3"], ["s2", "s1"], ["s0"]]


def test_list_rejects_a_before_cursor_that_is_not_a_submission_of_the_agent(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Support, "a")
    agent.submit_messages([user("hi")], submission_id="mine")
    jobs.get_agent(Support, "b").submit_messages([user("hi")], submission_id="theirs")
    for cursor in ("theirs", "nope"):
        with pytest.raises(UnknownCursorError, match="is not a submission of agent"):
            agent.list_submissions(before=cursor)
    with pytest.raises(UnknownCursorError, match="is not a submission of agent"):
        jobs.get_agent(Support, "never-written").list_submissions(before="mine")


def test_list_limit_is_clamped_to_1_and_100(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    for i in range(102):
        agent.submit_messages([user(str(i))])
    assert len(agent.list_submissions(limit=0)) == 1
    assert len(agent.list_submissions(limit=-5)) == 1
    assert len(agent.list_submissions(limit=1000)) == 100


def test_list_rejects_an_unknown_status(jobs: ThinkJobs) -> None:
    with pytest.raises(InvalidInputError, match="unknown submission status"):
        jobs.get_agent(Support, "a").list_submissions(status="finished")


# -- deleting ----------------------------------------------------------------------------------


def test_delete_submission_only_deletes_terminal_ones(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    pending = agent.submit_messages([user("1")])
    done = agent.submit_messages([user("2")])
    agent.cancel_submission(done.submission_id)
    assert agent.delete_submission(pending.submission_id) is False
    assert agent.delete_submission("unknown") is False
    assert agent.delete_submission(done.submission_id) is True
    assert agent.inspect_submission(done.submission_id) is None
    assert agent.delete_submission(done.submission_id) is False
    assert agent.inspect_submission(pending.submission_id) is not None


def _age_completion(jobs: ThinkJobs, submission_id: str, when: datetime) -> None:
    with jobs.db.write() as conn:
        conn.execute(
            turns.update().where(turns.c.request_id == submission_id).values(completed_at=when)
        )


def test_delete_submissions_defaults_to_terminal_and_never_deletes_active(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    active = agent.submit_messages([user("keep")])
    for i in range(3):
        agent.cancel_submission(agent.submit_messages([user(str(i))]).submission_id)
    assert agent.delete_submissions(status=["pending", "running"]) == 0
    assert agent.delete_submissions() == 3
    assert [s.submission_id for s in agent.list_submissions()] == [active.submission_id]


def test_delete_submissions_by_cutoff_is_strict_and_oldest_first(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(4):
        sid = agent.submit_messages([user(str(i))], submission_id=f"s{i}").submission_id
        agent.cancel_submission(sid)
        _age_completion(jobs, sid, base + timedelta(days=i))
    assert agent.delete_submissions(completed_before=base + timedelta(days=2), limit=1) == 1
    assert agent.inspect_submission("s0") is None
    assert agent.delete_submissions(completed_before=base + timedelta(days=2)) == 1  # s1 only
    remaining = sorted(s.submission_id for s in agent.list_submissions())
    assert remaining == ["s2", "s3"]  # s2 completed exactly at the cutoff: kept (strict <)


def test_delete_submissions_filters_by_status_and_clamps_the_limit(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Support, "a")
    for i in range(3):
        agent.cancel_submission(agent.submit_messages([user(str(i))]).submission_id)
    assert agent.delete_submissions(status="completed") == 0
    assert agent.delete_submissions(status="aborted", limit=0) == 1  # clamped up to 1
    assert agent.delete_submissions(limit=10_000) == 2


# -- hooks -------------------------------------------------------------------------------------


class Watched(Think):
    seen: list[tuple[str, str]] = []

    def get_model(self) -> ScriptedModel:
        return ScriptedModel("ok")

    def on_submission_status(self, inspection: SubmissionInspection) -> None:
        Watched.seen.append((inspection.submission_id, inspection.status))
        raise RuntimeError("hooks that raise are logged and ignored")


def test_on_submission_status_sees_every_transition_including_pending(jobs: ThinkJobs) -> None:
    Watched.seen = []
    agent = jobs.get_agent(Watched, "a")
    result = agent.submit_messages([user("x")], submission_id="s1")
    cancelled = agent.submit_messages([user("y")], submission_id="s2")
    agent.cancel_submission(cancelled.submission_id)
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
        wait_until(lambda: ("s1", "completed") in Watched.seen)
    assert [status for sid, status in Watched.seen if sid == "s1"] == [
        "pending",
        "running",
        "completed",
    ]
    assert [status for sid, status in Watched.seen if sid == "s2"] == ["pending", "aborted"]


def test_agents_a_process_has_forgotten_are_found_again(jobs: ThinkJobs) -> None:
    """A process keeps only its most recently used agent rows in memory
    (``domain.agent_rows``): past that bound, producers and workers read the row again, and
    every turn still runs for the agent it was submitted to."""
    from think_jobs.domain.agent_rows import AgentRows

    jobs._agent_rows = AgentRows(capacity=2)  # the default keeps 65,536
    names = [f"forgetful-{n}" for n in range(5)]
    results = {name: jobs.get_agent(Support, name).submit_messages([user(name)]) for name in names}
    again = jobs.get_agent(Support, names[0]).submit_messages([user("again")])
    with worker(jobs, concurrency=1):
        for name, result in [*results.items(), (names[0], again)]:
            wait_for_status(jobs.get_agent(Support, name), result.submission_id, "completed")
    assert len(jobs._agent_rows) == 2
    for name in names:
        asked = [text for role, text in texts(jobs.get_agent(Support, name)) if role == "user"]
        assert asked == ([name, "again"] if name == names[0] else [name])
