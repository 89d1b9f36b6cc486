"""Text a turn stores that nobody validated (an exception's message, a model's error chunk) and
numbers a caller gives: on both databases, with a real worker. A turn error holding NUL, a lone
surrogate or megabytes is stored clean and cut (``limits.storable_text``), so the turn ends on
its first attempt with the error it had and the agent goes on; an integer no JSON reader
elsewhere can take is refused at the edge and nothing is stored."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from tests.support.builders import user, wait_for_status
from think_jobs import MessageValidationError, Think, ThinkJobs, TurnContext
from think_jobs.callbacks import StreamCallback
from think_jobs.db.tables import messages, turns
from think_jobs.limits import ERROR_MAX_CHARS, MAX_JSON_INTEGER
from think_jobs.messages import ToolPart, message_text
from think_jobs.models import ModelRequest, Reply, ScriptedModel, ToolCall
from think_jobs.testing import worker
from think_jobs.tools import Tool, tool

HUGE = "x" * 1_000_000
SCRIPTS = {
    "chunk": Reply(text="so far", error="bad\x00chunk"),
    "raise": Reply(text="so far", raise_error="boom\x00here"),
    "surrogate": Reply(raise_error="half \ud800 a pair"),
    "huge": Reply(raise_error=HUGE),
    "tool": Reply(tool_calls=[ToolCall("explode")], then=Reply(text="after the tool")),
}


@tool
def explode() -> str:
    """A tool that fails with NUL in its message."""
    raise RuntimeError("tool\x00broke")


def _script(request: ModelRequest) -> Reply:
    """The reply the last user message names (``SCRIPTS``); anything else is answered ``ok``."""
    users = [m for m in request.messages if m.role == "user"]
    return SCRIPTS.get(message_text(users[-1]) if users else "", Reply(text="ok"))


class Failing(Think):
    """A model that fails as its user asks; ``before_turn`` fails on ``hook``."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(_script)

    def get_tools(self) -> dict[str, Tool]:
        return {"explode": explode}

    def before_turn(self, ctx: TurnContext) -> None:
        if message_text(ctx.messages[-1]) == "hook":
            raise ValueError("hook\x00failed")


def attempts_of(jobs: ThinkJobs, request_id: str) -> int:
    with jobs.db.read() as conn:
        query = select(turns.c.attempt).where(turns.c.request_id == request_id)
        return int(conn.execute(query).scalar_one())


def row_counts(jobs: ThinkJobs) -> tuple[int, int]:
    with jobs.db.read() as conn:
        count = [
            int(conn.execute(select(func.count()).select_from(table)).scalar_one())
            for table in (turns, messages)
        ]
    return count[0], count[1]


EXPECTED = [
    ("chunk", "bad\ufffdchunk"),
    ("raise", "boom\ufffdhere"),
    ("surrogate", "half \ufffd a pair"),
    ("hook", "hook\ufffdfailed"),
]


@pytest.mark.parametrize(("ask", "stored"), EXPECTED, ids=[ask for ask, _ in EXPECTED])
def test_a_turn_error_with_nul_or_a_surrogate_is_stored_clean_on_the_first_attempt(
    jobs: ThinkJobs, ask: str, stored: str
) -> None:
    agent = jobs.get_agent(Failing, "a")
    failed = agent.submit_messages([user(ask)]).submission_id
    after = agent.submit_messages([user("and now?")]).submission_id
    with worker(jobs):
        found = wait_for_status(agent, failed, "error", "completed", "aborted")
        wait_for_status(agent, after, "completed")
        events = list(agent.stream(failed, timeout_s=20))
    assert (found.status, found.error) == ("error", stored)
    assert attempts_of(jobs, failed) == 1  # the final write went in: no recovery ran the model
    listed = {s.submission_id: s.error for s in agent.list_submissions()}
    assert listed[failed] == stored
    errors = [e.chunk["errorText"] for e in events if e.chunk and e.chunk["type"] == "error"]
    assert errors == [stored]  # a hook's failure streams its error chunk too
    assert (events[-1].done, events[-1].status, events[-1].error) == (True, "error", stored)
    assert message_text(agent.get_messages()[-1]) == "ok"


def test_an_error_of_a_megabyte_is_cut_where_it_says(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Failing, "a")
    failed = agent.submit_messages([user("huge")]).submission_id
    after = agent.submit_messages([user("and now?")]).submission_id
    with worker(jobs):
        found = wait_for_status(agent, failed, "error")
        wait_for_status(agent, after, "completed")
        events = list(agent.stream(failed, timeout_s=20))
    assert len(found.error) == ERROR_MAX_CHARS
    assert found.error == HUGE[: ERROR_MAX_CHARS - 1] + "…"
    assert attempts_of(jobs, failed) == 1
    assert agent.list_submissions()[-1].error == found.error
    errors = [e.chunk["errorText"] for e in events if e.chunk and e.chunk["type"] == "error"]
    assert errors == [found.error]
    assert events[-1].error == found.error


def test_a_tool_error_with_nul_is_kept_in_the_reply_and_reads_back(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Failing, "a")
    result = agent.submit_messages([user("tool")]).submission_id
    with worker(jobs):
        found = wait_for_status(agent, result, "completed", "error")
    assert (found.status, found.error) == ("completed", None)
    reply = agent.get_messages()[-1]
    outputs = [p.error_text for p in reply.parts if isinstance(p, ToolPart)]
    assert outputs == ["tool\x00broke"]  # JSON holds NUL escaped: stored as given
    assert message_text(reply) == "after the tool"


def test_an_on_event_that_raises_with_nul_aborts_the_chat_with_clean_text(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Failing, "a")
    errors: list[str] = []

    def explode(_chunk: str) -> None:
        raise RuntimeError("callback\x00broke")

    with pytest.raises(RuntimeError, match="callback\x00broke"):
        agent.chat("hi", StreamCallback(on_event=explode, on_error=errors.append))
    with jobs.db.read() as conn:
        stored = conn.execute(select(turns.c.status, turns.c.error, turns.c.attempt)).one()
    assert tuple(stored) == ("aborted", "on_event raised: callback\ufffdbroke", 1)
    assert errors == []  # an abort calls no on_error
    assert agent.save_messages([user("again")]).status == "completed"


# -- integers no JSON reader elsewhere takes ----------------------------------------------------


BIG = [10**5000, -(10**5000), MAX_JSON_INTEGER + 1, -MAX_JSON_INTEGER - 1]


@pytest.mark.parametrize("number", BIG, ids=["10**5000", "-10**5000", "max+1", "min-1"])
def test_an_integer_past_the_bound_is_refused_and_nothing_is_stored(
    jobs: ThinkJobs, number: int
) -> None:
    agent = jobs.get_agent(Failing, "a")
    agent.submit_messages([user("first")])
    before = row_counts(jobs)
    data = {"id": "m-big", "role": "user", "parts": [{"type": "data-n", "data": {"n": [number]}}]}
    with pytest.raises(MessageValidationError, match=r"^messages\[0\]\.parts\[0\]\.data\.n\[0\]: "):
        agent.submit_messages([data])
    with pytest.raises(
        MessageValidationError, match=r"^metadata\.n: an integer of about \d+ digits"
    ):
        agent.submit_messages([user("hi")], metadata={"n": number})
    with pytest.raises(MessageValidationError, match=r"^body\.n: an integer"):
        agent.save_messages([user("hi")], body={"n": number})
    assert row_counts(jobs) == before


def test_the_largest_integers_allowed_read_back(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Failing, "a")
    numbers = [MAX_JSON_INTEGER, -MAX_JSON_INTEGER, 2**53, 0]
    data = {"id": "m-n", "role": "user", "parts": [{"type": "data-n", "data": numbers}]}
    result = agent.submit_messages([data, user("and now?")], metadata={"n": numbers})
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
    found = agent.inspect_submission(result.submission_id)
    assert found is not None and found.metadata == {"n": numbers}
    stored = agent.get_messages()[0].model_dump(mode="json", by_alias=True, exclude_none=True)
    assert json.loads(json.dumps(stored))["parts"][0]["data"] == numbers
