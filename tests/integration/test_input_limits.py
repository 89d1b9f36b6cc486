"""Issue 15 through the Python API, on both databases with a real worker: one set of limits at
the edge every entry shares, whatever is accepted reads back (the conversation, the model's
request, the stream, the API), whatever is refused writes nothing, and a stored message that no
longer reads back is named, removable and repairable instead of bricking the agent."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from tests.acceptance.test_cli import think_jobs
from tests.apps.agents import Recorder
from tests.support.builders import user, wait_for_status
from tests.support.openai_server import Completion, openai_server, tool_call
from tests.support.openai_server import text as provider_text
from tests.web.support import FULL, FULL_TOKEN, SECRET_KEY
from think_jobs import Think, ThinkJobs
from think_jobs.context import utcnow
from think_jobs.db import conversation as conversation_ops
from think_jobs.db.tables import turns
from think_jobs.engine.repair import Repair
from think_jobs.errors import InvalidInputError, MessageValidationError, StoredMessageError
from think_jobs.messages import ToolPart, coerce_message, message_bytes, message_text
from think_jobs.models import OpenAIChatModel
from think_jobs.models.base import ModelRequest
from think_jobs.replay import assemble
from think_jobs.testing import worker
from web import create_app


def nested(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def deep_message(levels: int, message_id: str = "m-deep") -> dict[str, Any]:
    parts = [{"type": "text", "text": "keep me"}, {"type": "data-x", "data": nested(levels)}]
    return {"id": message_id, "role": "user", "parts": parts}


def nothing_written(jobs: ThinkJobs, agent: Think) -> bool:
    """Not even the agent's row: validation ran before anything touched the database."""
    return jobs.agent_id_of(agent, create=False) is None


# -- case 1 and 2 through Python, and the shared id rule ----------------------------------------


def test_case_1_deep_data_is_refused_by_submit_messages_and_nothing_is_written(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Recorder, "a")
    with pytest.raises(MessageValidationError) as caught:
        agent.submit_messages([deep_message(250)])
    assert str(caught.value).startswith(
        "messages[0].parts[1].data: nested 250 levels deep; the limit is 64"
    )
    with pytest.raises(MessageValidationError, match=r"^metadata: nested 256 levels deep"):
        agent.submit_messages([user("hi")], metadata={"a": nested(255)})
    assert nothing_written(jobs, agent)


def test_blocking_calls_share_the_message_limits(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    with pytest.raises(MessageValidationError, match="nested 300 levels deep"):
        agent.save_messages([deep_message(300)])
    assert nothing_written(jobs, agent)


def test_the_limits_are_settings(make_jobs: Callable[..., ThinkJobs]) -> None:
    jobs = make_jobs(max_json_depth=3, max_parts_per_message=2, max_messages_per_submission=2)
    agent = jobs.get_agent(Recorder, "a")
    for messages, fragment in [
        ([deep_message(4)], "nested 4 levels deep; the limit is 3"),
        ([{**user("x"), "parts": [{"type": "step-start"}] * 3}], "3 parts; the limit is 2"),
        ([user("1"), user("2"), user("3")], "3 messages, at most 2 messages per submission"),
    ]:
        with pytest.raises(MessageValidationError, match=fragment):
            agent.submit_messages(messages)
    assert nothing_written(jobs, agent)
    assert agent.submit_messages([deep_message(3)]).accepted


@pytest.mark.parametrize("name", [".", "..", "a/b", " a", "caf\u00e9", ""])
def test_case_6_agent_names_a_url_cannot_carry_are_refused(jobs: ThinkJobs, name: str) -> None:
    with pytest.raises(InvalidInputError, match="agent name"):
        jobs.get_agent(Recorder, name)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        *[("submission_id", value) for value in (".", "..", "x/y", "\u00d7\u00f8", "trailing ")],
        *[("idempotency_key", value) for value in (".", "..", "x/y", "\u00d7\u00f8", "two words")],
    ],
)
def test_case_6_ids_a_url_cannot_carry_are_refused(jobs: ThinkJobs, field: str, value: str) -> None:
    agent = jobs.get_agent(Recorder, "a")
    options: dict[str, Any] = {field: value}
    with pytest.raises(InvalidInputError, match=field):
        agent.submit_messages([user("hi")], **options)
    assert nothing_written(jobs, agent)


CONTROL_LABELS = {  # a part whose id or name holds a control character, and its refusal
    "toolCallId": (
        {"type": "tool-x", "toolCallId": "c\x00", "state": "input-available", "input": {}},
        "messages[0].parts[0].toolCallId: must not contain control characters",
    ),
    "tool type": (
        {"type": "tool-x\x01y", "toolCallId": "c", "state": "input-available", "input": {}},
        "messages[0].parts[0].type: must not contain control characters",
    ),
    "dynamic toolName": (
        {
            "type": "dynamic-tool",
            "toolName": "x\ty",
            "toolCallId": "c",
            "state": "input-available",
            "input": {},
        },
        "messages[0].parts[0].toolName: must not contain control characters",
    ),
    "sourceId": (
        {"type": "source-url", "sourceId": "s\x7f", "url": "https://example.com"},
        "messages[0].parts[0].sourceId: must not contain control characters",
    ),
    "mediaType": (
        {"type": "file", "mediaType": "text/plain\r", "url": "https://example.com/f"},
        "messages[0].parts[0].mediaType: must not contain control characters",
    ),
    "data id": (
        {"type": "data-x", "id": "d\x1b", "data": 1},
        "messages[0].parts[0].id: must not contain control characters",
    ),
}


@pytest.mark.parametrize("label", list(CONTROL_LABELS))
def test_ids_and_names_in_parts_with_control_characters_are_refused(
    jobs: ThinkJobs, label: str
) -> None:
    """The rule a model's chunks follow (a toolCallId names its approval's row; a client
    sends these back with its next request): at the one edge, so nothing is written."""
    part, refusal = CONTROL_LABELS[label]
    agent = jobs.get_agent(Recorder, "a")
    message = {"id": "m", "role": "assistant", "parts": [part]}
    with pytest.raises(MessageValidationError) as refused:
        agent.submit_messages([message])
    assert refusal in str(refused.value)
    assert nothing_written(jobs, agent)


# -- defence in depth: a stored message that no longer reads back -------------------------------


def store_directly(jobs: ThinkJobs, agent: Think, *messages: dict[str, Any]) -> None:
    """Rows as an older version (before the limits) or a manual edit could have left them."""
    agent_id = jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    with jobs.db.write() as conn:
        conversation_ops.append_messages(conn, agent_id, list(messages), turn_id=None, now=utcnow())


def test_an_unreadable_message_is_named_and_can_be_repaired(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    deep = deep_message(250, "old-1")
    deep["metadata"] = {"m": nested(250)}
    store_directly(jobs, agent, user("before", "m-0"), deep, user("after", "m-2"))
    with pytest.raises(StoredMessageError) as caught:
        agent.get_messages()
    assert (caught.value.message_id, caught.value.position) == ("old-1", 1)
    [found] = agent.unreadable_messages()
    assert (found.message_id, found.position) == ("old-1", 1)
    repaired = agent.repair_message("old-1")
    assert repaired.kept_parts == 1
    assert [what.split(":")[0] for what in repaired.dropped] == ["parts[1].data", "metadata"]
    messages = agent.get_messages()
    assert [m.id for m in messages] == ["m-0", "old-1", "m-2"]
    assert messages[1].to_wire() == {
        "id": "old-1",
        "role": "user",
        "parts": [{"type": "text", "text": "keep me"}],
    }
    assert agent.unreadable_messages() == []
    assert agent.repair_message("old-1").dropped == ()


def test_an_unreadable_message_can_be_removed_and_the_next_turn_runs(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    store_directly(jobs, agent, deep_message(900, "old-1"))
    with pytest.raises(StoredMessageError):
        agent.get_messages()
    assert agent.remove_message("old-1") is True
    assert agent.remove_message("old-1") is False
    assert agent.get_messages() == []
    submitted = agent.submit_messages([user('{"text": "fine again"}')])
    with worker(jobs):
        wait_for_status(agent, submitted.submission_id, "completed")
    assert [m.role for m in agent.get_messages()] == ["user", "assistant"]


def test_a_turn_over_an_unreadable_message_ends_in_error_naming_it_and_the_agent_goes_on(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Recorder, "a")
    store_directly(jobs, agent, deep_message(900, "old-1"))
    first = agent.submit_messages([user('{"text": "hello"}')])
    with worker(jobs):
        failed = wait_for_status(agent, first.submission_id, "error")
        assert "stored message 'old-1'" in failed.error and "remove or repair it" in failed.error
        assert failed.attempt == 1  # not retried: the next turn is not held up behind it
        agent.remove_message("old-1")
        second = agent.submit_messages([user('{"text": "fine again"}')])
        wait_for_status(agent, second.submission_id, "completed")


UNAPPLIABLE: dict[str, Any] = {
    "not a list": {"id": "m1", "role": "user", "parts": []},
    "not an object": [1],
    "no id": [{"role": "user", "parts": []}],
    "an id that is a number": [{"id": 7, "role": "user", "parts": []}],
    "an id with a NUL": [{"id": "m\x00", "role": "user", "parts": []}],
    "an id with a control character": [{"id": "m\x01", "role": "user", "parts": []}],
    "an id too long for its column": [{"id": "m" * 256, "role": "user", "parts": []}],
    "a role no message has": [{"id": "m1", "role": "robot", "parts": []}],
    "a role too long for its column": [{"id": "m1", "role": "r" * 40, "parts": []}],
}


@pytest.mark.parametrize("stored", UNAPPLIABLE.values(), ids=list(UNAPPLIABLE))
def test_a_submission_whose_stored_messages_cannot_be_applied_ends_in_error_and_the_agent_goes_on(
    jobs: ThinkJobs, stored: Any
) -> None:
    """A pending row an older version or a manual edit left: neither claim path may stop the
    agent's queue on it (PostgreSQL's one-statement claim raised on such rows at every drain)."""
    agent = jobs.get_agent(Recorder, "a")
    first = agent.submit_messages([user('{"text": "hello"}', "m-first")])
    with jobs.db.write() as conn:
        edited = update(turns).where(turns.c.request_id == first.submission_id)
        conn.execute(edited.values(messages=stored))
    second = agent.submit_messages([user('{"text": "fine again"}', "m-second")])
    with worker(jobs):
        failed = wait_for_status(agent, first.submission_id, "error")
        wait_for_status(agent, second.submission_id, "completed")
    assert failed.error.startswith("The submission's stored messages cannot be applied (")
    assert failed.error.endswith("the turn did not run.")
    assert [(m.id, m.role) for m in agent.get_messages()][:1] == [("m-second", "user")]
    assert len(agent.get_messages()) == 2  # nothing of the first was applied


def test_the_operator_commands_check_repair_and_remove(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    agent = jobs.get_agent(Recorder, "a")
    store_directly(jobs, agent, deep_message(250, "old-1"), deep_message(300, "old-2"))

    def run(command: str, *args: str) -> subprocess.CompletedProcess[str]:
        app = ("--app", "tests.apps.agents:jobs")
        return think_jobs("messages", command, *app, "Recorder", "a", *args, env=settings_env)

    checked = run("check")
    assert checked.returncode == 1, checked.stderr
    assert "old-1\tposition 0" in checked.stdout and "old-2\tposition 1" in checked.stdout
    repaired = run("repair", "old-1")
    assert repaired.returncode == 0, repaired.stderr
    assert "dropped parts[1].data: nested 250 levels deep" in repaired.stdout
    removed = run("remove", "old-2")
    assert removed.returncode == 0 and "removed message old-2" in removed.stdout
    missing = run("remove", "old-2")
    assert missing.returncode == 1 and "has no stored message 'old-2'" in missing.stderr
    assert run("check").stdout.strip() == "every stored message reads back"
    assert [m.id for m in agent.get_messages()] == ["old-1"]


def test_a_reply_stored_with_a_lone_surrogate_is_repaired_keeping_its_text(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    """As a turn stored it before 2026-12-05: it failed every later turn of the agent. The
    repair mends the text (U+FFFD) rather than drop the part."""
    agent = jobs.get_agent(Recorder, "a")
    text = {"type": "text", "text": "a\ud800b \ud83d\ude00", "state": "done"}
    reply = {"id": "r-1", "role": "assistant", "parts": [{"type": "step-start"}, text]}
    store_directly(jobs, agent, user("hi", "m-0"), reply)
    with pytest.raises(StoredMessageError):
        agent.get_messages()
    app = ("--app", "tests.apps.agents:jobs")
    repaired = think_jobs("messages", "repair", *app, "Recorder", "a", "r-1", env=settings_env)
    assert repaired.returncode == 0, repaired.stderr
    assert "replaced each lone surrogate in its text by U+FFFD" in repaired.stdout
    assert "dropped" not in repaired.stdout
    [_, mended] = agent.get_messages()
    assert message_text(mended) == "a\ufffdb \U0001f600"
    assert agent.repair_message("r-1") == Repair("r-1", kept_parts=2, dropped=())


# -- the property: accepted reads back everywhere, refused writes nothing -----------------------


class Mirror(Think):
    """Streams back what its model was asked: the conversation as the model request saw it."""

    def get_model(self) -> Any:
        return MirrorModel()


class MirrorModel:
    """The request's messages as JSON text: a chunk nesting them would be deeper than they are,
    and an accepted message may sit at the depth limit."""

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        wires = [message.to_wire() for message in request.messages]
        yield {"type": "data-mirror", "data": {"messages": json.dumps(wires)}}


LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.builds(
        lambda text, code: text + chr(code), st.text(max_size=3), st.integers(0xD800, 0xDFFF)
    )
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def deep_values(draw: st.DrawFn) -> Any:
    """A JSON value wrapped in 0 to 80 arrays: on both sides of the depth limit (64)."""
    return nested(draw(st.integers(min_value=0, max_value=80)), draw(JSON_VALUES))


MESSAGES = st.builds(
    lambda text, data, metadata, identity: {
        "id": identity,
        "role": "user",
        "parts": [{"type": "text", "text": text}, {"type": "data-x", "data": data}],
        **({} if metadata is None else {"metadata": metadata}),
    },
    st.text(max_size=20),
    deep_values(),
    st.none() | st.dictionaries(st.text(max_size=4), deep_values(), max_size=2),
    st.text(min_size=1, max_size=12) | st.just("m" * 256),
)


def mirrored(agent: Think, request_id: str) -> Any:
    for found in agent.stream(request_id, timeout_s=60):
        if found.chunk is not None and found.chunk.get("type") == "data-mirror":
            return json.loads(found.chunk["data"]["messages"])
    raise AssertionError("no data-mirror chunk in the stream")


def test_accepted_input_round_trips_everywhere_and_refused_input_writes_nothing(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(api_tokens=FULL_TOKEN, secret_key=SECRET_KEY)
    jobs.register(Mirror)
    client = create_app(jobs, {"TESTING": True}).test_client()

    @given(
        message=MESSAGES,
        metadata=st.none() | st.dictionaries(st.text(max_size=4), deep_values(), max_size=2),
    )
    @example(  # JSON keeps NUL as \u0000, which PostgreSQL's ->> cannot read (CI found it)
        message={
            "id": "m\x00",
            "role": "user",
            "parts": [{"type": "text", "text": "\x00"}, {"type": "data-x", "data": {"\x00": 0}}],
        },
        metadata=None,
    )
    @example(
        message={
            "id": "m1",
            "role": "user",
            "parts": [{"type": "text", "text": "\x00"}, {"type": "data-x", "data": {"\x00": 0}}],
        },
        metadata={"\x00": "\x00"},
    )
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def exchange(message: dict[str, Any], metadata: dict[str, Any] | None) -> None:
        agent = jobs.get_agent(Mirror, f"fuzz-{uuid.uuid4().hex[:12]}")
        try:
            result = agent.submit_messages([message], metadata=metadata)
        except InvalidInputError:  # MessageValidationError included
            event("refused")
            assert nothing_written(jobs, agent)
            return
        event("accepted")
        expected = coerce_message(message).to_wire()
        wait_for_status(agent, result.submission_id, "completed")
        assert mirrored(agent, result.submission_id) == [expected]
        stored = [m.to_wire() for m in agent.get_messages()]
        seen = json.loads(stored[1]["parts"][-1]["data"]["messages"])
        assert stored[0] == expected and seen == [expected]
        inspected = agent.inspect_submission(result.submission_id)
        assert inspected is not None and inspected.metadata == json.loads(json.dumps(metadata))
        base = f"/api/agents/Mirror/{agent.name}"
        assert client.get(f"{base}/messages", headers=FULL).json == {"messages": stored}
        api = client.get(f"{base}/submissions/{result.submission_id}", headers=FULL)
        body = api.json
        assert api.status_code == 200 and body is not None
        assert body["metadata"] == inspected.metadata

    with worker(jobs):
        exchange()


# -- blocking calls and what a model or tool produces ------------------------------------------


class DeepModel:
    """Streams a data part nested 300 levels deep (or calls a tool that returns such data)."""

    def __init__(self, via_tool: bool) -> None:
        self.via_tool = via_tool

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        if not self.via_tool:
            yield {"type": "data-x", "data": nested(300)}
            return
        if request.step == 0:
            yield {
                "type": "tool-input-available",
                "toolCallId": "c1",
                "toolName": "deep",
                "input": {},
            }
            return
        yield {"type": "text-start", "id": "t"}
        yield {"type": "text-delta", "id": "t", "delta": "done"}
        yield {"type": "text-end", "id": "t"}


class DeepData(Think):
    def get_model(self) -> DeepModel:
        return DeepModel(via_tool=False)


class DeepTool(Think):
    def get_model(self) -> DeepModel:
        return DeepModel(via_tool=True)

    def get_tools(self) -> dict[str, Any]:
        from think_jobs.tools import tool

        @tool
        def deep() -> Any:
            """Returns data nested too deep to store."""
            return nested(300)

        return {"deep": deep}


def test_blocking_calls_refuse_a_deep_body_or_metadata_and_store_nothing(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    with pytest.raises(MessageValidationError, match=r"body.*nested 300 levels deep; the limit"):
        agent.save_messages([user("hi")], body={"x": nested(299)})
    with pytest.raises(MessageValidationError, match=r"metadata.*the limit is 64"):
        agent.chat("hi", object(), metadata={"x": nested(299)})
    assert nothing_written(jobs, agent)


def test_a_model_that_streams_data_too_deep_fails_its_turn_not_the_agent(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(DeepData, "a")
    result = agent.save_messages([user("go")])
    assert result.status == "error"
    assert "could not be stored" in (result.error or "") and "the limit is 64" in (
        result.error or ""
    )
    assert [m.role for m in agent.get_messages()] == ["user"]  # the history still reads back


def test_a_tool_whose_output_is_too_deep_reports_an_error_to_the_model(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(DeepTool, "a")
    assert agent.save_messages([user("go")]).status == "completed"
    [_, reply] = agent.get_messages()
    [tool_part] = [p for p in reply.parts if p.type == "tool-deep"]
    assert isinstance(tool_part, ToolPart)
    assert tool_part.state == "output-error" and "the limit is 64" in (tool_part.error_text or "")


def test_a_messages_function_that_raises_fails_its_turn_and_the_next_turn_runs(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Recorder, "a")

    def broken(current: list[Any]) -> list[Any]:
        raise RuntimeError("could not build the messages")

    failed = agent.save_messages(broken)
    assert (failed.status, failed.error) == ("error", "could not build the messages")
    assert agent.save_messages([user('{"text": "fine"}')]).status == "completed"


class RaggedModel:
    """Text, an error or a tool's error holding a lone surrogate (valid in a Python ``str``
    and in a JSON escape, but not UTF-8), by what the user message asks."""

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        asked = message_text(request.messages[-1])
        if asked == "raise":
            raise RuntimeError("boom \udc80")
        if asked == "tool" and request.step == 0:
            yield {"type": "tool-input-available", "toolCallId": "c1", "toolName": "ragged"}
            return
        if asked == "split":  # pairs cut between deltas, as UTF-16 text can be
            yield {"type": "reasoning-start", "id": "r"}
            yield {"type": "text-start", "id": "t"}
            yield {"type": "text-delta", "id": "t", "delta": "smile \ud83d"}
            yield {"type": "reasoning-delta", "id": "r", "delta": "hmm \ud83e"}
            yield {"type": "text-delta", "id": "t", "delta": "\ude00 and \ud83d"}
            yield {"type": "reasoning-delta", "id": "r", "delta": "\udd14"}
            yield {"type": "reasoning-end", "id": "r"}
            yield {"type": "text-delta", "id": "t", "delta": "\ude03 cut \ud83d"}
            yield {"type": "text-end", "id": "t"}  # its other half never came
            return
        yield {"type": "text-start", "id": "t"}
        yield {"type": "text-delta", "id": "t", "delta": "a\ud800b"}
        yield {"type": "text-delta", "id": "t", "delta": " \ud83d\ude00"}  # a pair: one emoji
        yield {"type": "text-end", "id": "t"}
        if asked == "error":
            yield {"type": "error", "errorText": "bad \ud800 thing"}


class Ragged(Think):
    def get_model(self) -> RaggedModel:
        return RaggedModel()

    def get_tools(self) -> dict[str, Any]:
        from think_jobs.tools import tool

        @tool
        def ragged() -> Any:
            """Raises with a lone surrogate in its message."""
            raise ValueError("no \udfff way")

        return {"ragged": ragged}


def test_text_a_model_streams_with_a_lone_surrogate_is_stored_and_streamed_well_formed(
    jobs: ThinkJobs,
) -> None:
    """Such a reply used to be stored and then fail every later turn of the agent ("stored
    message ... cannot be read"); each lone surrogate is now U+FFFD, in the reply and its
    stream alike, and the conversation reads back."""
    agent = jobs.get_agent(Ragged, "a")
    result = agent.save_messages([user("text")])
    assert result.status == "completed"
    assert agent.save_messages([user("again")]).status == "completed"
    [_, reply, _, _] = agent.get_messages()
    assert message_text(reply) == "a\ufffdb \U0001f600"
    events = list(agent.stream(result.request_id, timeout_s=5))
    chunks = [e.chunk for e in events if e.chunk is not None]
    assert assemble(chunks, reply.id).parts == reply.parts


def test_a_character_split_between_two_deltas_is_stored_and_streamed_whole(
    jobs: ThinkJobs,
) -> None:
    """A model whose text comes as UTF-16 may cut an emoji between two deltas, each half a
    lone surrogate: the halves are joined (text and reasoning alike, interleaved), and a half
    whose other one never came becomes U+FFFD as its block ends."""
    agent = jobs.get_agent(Ragged, "a")
    result = agent.save_messages([user("split")])
    assert result.status == "completed"
    [_, reply] = agent.get_messages()
    texts = [(p.type, getattr(p, "text", None)) for p in reply.parts if p.type != "step-start"]
    assert texts == [
        ("reasoning", "hmm \U0001f914"),
        ("text", "smile \U0001f600 and \U0001f603 cut \ufffd"),
    ]
    events = list(agent.stream(result.request_id, timeout_s=5))
    chunks = [e.chunk for e in events if e.chunk is not None]
    assert assemble(chunks, reply.id).parts == reply.parts


@pytest.mark.parametrize(
    ("asked", "error"), [("error", "bad \ufffd thing"), ("raise", "boom \ufffd")]
)
def test_an_error_with_a_lone_surrogate_ends_its_turn_and_the_agent_goes_on(
    jobs: ThinkJobs, asked: str, error: str
) -> None:
    agent = jobs.get_agent(Ragged, "a")
    failed = agent.save_messages([user(asked)])
    assert (failed.status, failed.error) == ("error", error)
    [done] = [e for e in agent.stream(failed.request_id, timeout_s=5) if e.done]
    assert (done.status, done.error) == ("error", error)
    assert agent.save_messages([user("text")]).status == "completed"


def test_a_tool_error_with_a_lone_surrogate_reaches_the_model_well_formed(
    jobs: ThinkJobs,
) -> None:
    agent = jobs.get_agent(Ragged, "a")
    assert agent.save_messages([user("tool")]).status == "completed"
    [_, reply] = agent.get_messages()
    [tool_part] = [p for p in reply.parts if p.type == "tool-ragged"]
    assert isinstance(tool_part, ToolPart)
    assert (tool_part.state, tool_part.error_text) == ("output-error", "no \ufffd way")


CLOSED: list[str] = []  # what each EndlessModel stream saw as it ended


class EndlessModel:
    """A model that never ends its stream (a runaway or hostile provider), of text, of data
    parts or of tool calls by what the user asks; ``CLOSED`` records that it was closed."""

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        asked = message_text([m for m in request.messages if m.role == "user"][-1])
        try:
            if asked == "tool" and request.step == 0:
                yield {"type": "tool-input-available", "toolCallId": "c1", "toolName": "big"}
                return
            if asked == "tool":
                yield from text_reply("done")
                return
            if asked == "parts":
                for index in range(1_000_000):
                    yield {"type": "data-n", "data": index}
            yield {"type": "text-start", "id": "t"}
            for _ in range(1_000_000):
                yield {"type": "text-delta", "id": "t", "delta": "all work and no play "}
        finally:
            CLOSED.append(asked)


def text_reply(text: str) -> Iterator[dict[str, Any]]:
    yield {"type": "text-start", "id": "t"}
    yield {"type": "text-delta", "id": "t", "delta": text}
    yield {"type": "text-end", "id": "t"}


class Endless(Think):
    def get_model(self) -> EndlessModel:
        return EndlessModel()

    def get_tools(self) -> dict[str, Any]:
        from think_jobs.tools import tool

        @tool
        def big() -> Any:
            """Returns more than a reply may hold."""
            return {"rows": ["row"] * 50_000}

        return {"big": big}


def test_a_model_that_never_ends_its_reply_is_stopped_at_max_message_bytes(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """Its stream is closed when the reply would pass the limit an input message has; the
    turn ends in error naming the setting, the reply stored is within it and reads back,
    the stream a client sees matches it, and the agent's next turn runs."""
    jobs = make_jobs(max_message_bytes=20_000)
    agent = jobs.get_agent(Endless, "a")
    CLOSED.clear()
    failed = agent.save_messages([user("text")])
    assert failed.status == "error"
    assert "past the limit of 20000 (THINK_JOBS_MAX_MESSAGE_BYTES)" in str(failed.error)
    assert CLOSED == ["text"]
    [_, reply] = agent.get_messages()
    assert 15_000 < message_bytes(reply) <= 20_000
    events = list(agent.stream(failed.request_id, timeout_s=5))
    chunks = [e.chunk for e in events if e.chunk is not None]
    assert chunks[-1]["type"] == "error"
    assert assemble(chunks, reply.id).parts == reply.parts
    assert agent.save_messages([user("tool")]).status == "completed"


def test_a_model_that_never_stops_adding_parts_is_stopped_at_max_parts_per_message(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(max_parts_per_message=50)
    agent = jobs.get_agent(Endless, "a")
    failed = agent.save_messages([user("parts")])
    assert failed.status == "error"
    assert "has 50 parts and a data-n chunk would add one past the limit of 50" in str(failed.error)
    [_, reply] = agent.get_messages()
    assert len(reply.parts) == 50


def test_a_tool_output_the_reply_has_no_room_for_becomes_the_tools_error(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """The model is told (as with any tool error) and goes on; the turn completes."""
    jobs = make_jobs(max_message_bytes=20_000)
    agent = jobs.get_agent(Endless, "a")
    assert agent.save_messages([user("tool")]).status == "completed"
    [_, reply] = agent.get_messages()
    [tool_part] = [p for p in reply.parts if p.type == "tool-big"]
    assert isinstance(tool_part, ToolPart)
    assert tool_part.state == "output-error"
    assert str(tool_part.error_text).startswith("the output was not stored: the reply is ")
    assert message_text(reply) == "done"


# -- hostile model output: nothing it streams may store a reply that fails to read back --------

DEEP_ARGUMENTS = '{"a":' + "[" * 210 + "]" * 210 + "}"
LONE_SURROGATE_ARGUMENTS = '{"q":"\\ud83d"}'  # six ASCII characters: a valid JSON escape
BOTTOMLESS_ARGUMENTS = "[" * 5000  # json.loads raises RecursionError, not ValueError
STREAMED_ARGUMENTS = {
    "deep": DEEP_ARGUMENTS,
    "surrogate": LONE_SURROGATE_ARGUMENTS,
    "bottomless": BOTTOMLESS_ARGUMENTS + "]" * 5000,
    "bottomless-open": BOTTOMLESS_ARGUMENTS,
}


def streamed_call(arguments: str) -> Iterator[dict[str, Any]]:
    """A tool call whose input streams as text and never gets ``tool-input-available``."""
    yield {"type": "tool-input-start", "toolCallId": "c1", "toolName": "lookup"}
    yield {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": arguments}


HOSTILE_CHUNKS: dict[str, list[dict[str, Any]]] = {
    "text-start metadata": [
        {"type": "text-start", "id": "t", "providerMetadata": {"p": {"q": nested(205)}}},
        {"type": "text-delta", "id": "t", "delta": "hi"},
        {"type": "text-end", "id": "t"},
    ],
    "text-delta metadata": [
        {"type": "text-start", "id": "t"},
        {
            "type": "text-delta",
            "id": "t",
            "delta": "hi",
            "providerMetadata": {"p": {"q": nested(205)}},
        },
        {"type": "text-end", "id": "t"},
    ],
    "text-end metadata": [
        {"type": "text-start", "id": "t"},
        {"type": "text-end", "id": "t", "providerMetadata": {"p": {"q": "\ud800"}}},
    ],
    "start": [{"type": "start", "messageId": "m-user"}, *text_reply("overwrite")],
    "finish": [*text_reply("done"), {"type": "finish", "messageMetadata": {"x": 1}}],
    "start-step": [{"type": "start-step"}],
    "finish-step": [{"type": "finish-step"}],
    "abort": [{"type": "abort"}],
    "long toolCallId": [{"type": "tool-input-start", "toolCallId": "c" * 256, "toolName": "t"}],
    "NUL toolCallId": [
        {"type": "tool-input-available", "toolCallId": "c\x00", "toolName": "t", "input": {}}
    ],
    "long toolName": [
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "n" * 251, "input": {}}
    ],
    "control toolName": [{"type": "tool-input-start", "toolCallId": "c1", "toolName": "a\nb"}],
    "long sourceId": [{"type": "source-url", "sourceId": "s" * 300, "url": "https://x.test"}],
    "long mediaType": [{"type": "file", "url": "https://x.test/f", "mediaType": "x" * 256}],
    "control mediaType": [
        {"type": "source-document", "sourceId": "s", "mediaType": "text/\x7f", "title": "t"}
    ],
    "long data id": [{"type": "data-x", "id": "d" * 256, "data": 1}],
    "NUL data id": [{"type": "data-x", "id": "d\x00", "data": 1}],
    "long data type": [{"type": "data-" + "x" * 251, "data": 1}],
}
HOSTILE_ERRORS = {
    "text-start metadata": "text-start.provider_metadata: nested 207 levels deep; the limit is 64",
    "text-delta metadata": "text-delta.provider_metadata: nested 207 levels deep; the limit is 64",
    "text-end metadata": "text-end.provider_metadata.p.q: text is not valid Unicode",
    "start": "model produced a start chunk: message and step framing come from the runner",
    "finish": "model produced a finish chunk: message and step framing come from the runner",
    "start-step": "model produced a start-step chunk: message and step framing come from",
    "finish-step": "model produced a finish-step chunk: message and step framing come from",
    "abort": "model produced an abort chunk: message and step framing come from the runner",
    "long toolCallId": "tool-input-start.toolCallId: 256 characters; the limit is 255",
    "NUL toolCallId": "tool-input-available.toolCallId: must not contain control characters",
    "long toolName": "tool-input-available.toolName: 251 characters; the limit is 250",
    "control toolName": "tool-input-start.toolName: must not contain control characters",
    "long sourceId": "source-url.sourceId: 300 characters; the limit is 255",
    "long mediaType": "file.mediaType: 256 characters; the limit is 255",
    "control mediaType": "source-document.mediaType: must not contain control characters",
    "long data id": "data-x.id: 256 characters; the limit is 255",
    "NUL data id": "data-x.id: must not contain control characters",
    "long data type": "type: 256 characters; the limit is 255",
}


class HostileModel:
    """What the user message names: a broken tool call, or chunks a model must not send."""

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        asked = message_text(request.messages[-1])
        if asked in STREAMED_ARGUMENTS:
            yield from streamed_call(STREAMED_ARGUMENTS[asked])
        elif asked in HOSTILE_CHUNKS:
            yield from HOSTILE_CHUNKS[asked]
        else:
            yield from text_reply("fine")


class Hostile(Think):
    def get_model(self) -> HostileModel:
        return HostileModel()


def assert_the_agent_goes_on(agent: Think) -> None:
    """The agent's next turn runs, and its whole conversation reads back."""
    assert agent.save_messages([user("next")]).status == "completed"
    assert message_text(agent.get_messages()[-1]) == "fine"


@pytest.mark.parametrize("asked", list(STREAMED_ARGUMENTS))
def test_a_streamed_tool_input_that_could_not_be_stored_is_left_unparsed(
    jobs: ThinkJobs, asked: str
) -> None:
    """The call never got ``tool-input-available`` (the model ended its stream): its text is
    parsed as a best effort, and a value too deep (or bottomless, or holding a lone
    surrogate) is not kept, as invalid JSON is not: the reply reads back."""
    agent = jobs.get_agent(Hostile, "a")
    assert agent.save_messages([user(asked)]).status == "completed"
    [_, reply] = agent.get_messages()
    [call] = [p for p in reply.parts if isinstance(p, ToolPart)]
    assert (call.state, call.input) == ("input-streaming", None)
    assert_the_agent_goes_on(agent)


@pytest.mark.parametrize("asked", list(HOSTILE_CHUNKS))
def test_a_chunk_a_model_must_not_send_ends_its_turn_and_the_agent_goes_on(
    jobs: ThinkJobs, asked: str
) -> None:
    agent = jobs.get_agent(Hostile, "a")
    failed = agent.save_messages([user(asked, "m-user")])
    assert failed.status == "error"
    assert HOSTILE_ERRORS[asked] in str(failed.error)
    first = agent.get_messages()[0]
    assert (first.id, first.role, message_text(first)) == ("m-user", "user", asked)
    assert_the_agent_goes_on(agent)


def test_a_model_start_chunk_cannot_overwrite_a_user_message(jobs: ThinkJobs) -> None:
    """Its ``messageId`` named an earlier user message: the reply's final write replaced it."""
    agent = jobs.get_agent(Hostile, "a")
    assert agent.save_messages([user("hello", "m-user")]).status == "completed"
    assert agent.save_messages([user("start")]).status == "error"
    [first, *_] = agent.get_messages()
    assert (first.id, first.role, message_text(first)) == ("m-user", "user", "hello")
    assert_the_agent_goes_on(agent)


PROVIDER: dict[str, str] = {}  # the loopback OpenAI-compatible server a test runs


class ViaOpenAI(Think):
    """An agent on ``OpenAIChatModel``, talking to the test's loopback server."""

    def get_model(self) -> OpenAIChatModel:
        url = PROVIDER["base_url"]
        return OpenAIChatModel("gpt-test", base_url=url, api_key="sk-test", max_retries=0)


@pytest.mark.parametrize("arguments", [DEEP_ARGUMENTS, LONE_SURROGATE_ARGUMENTS])
def test_a_provider_tool_call_whose_arguments_could_not_be_stored_ends_the_turn_alone(
    jobs: ThinkJobs, arguments: str
) -> None:
    """The arguments stream as ``tool-input-delta`` text, then their parsed value is refused
    as ``tool-input-available`` (the turn's error): the text left streaming is not stored as
    the call's input either, and the agent's next turn runs."""
    with openai_server() as server:
        PROVIDER["base_url"] = server.base_url
        half = len(arguments) // 2
        call = [
            tool_call(0, id="call_1", name="lookup", arguments=arguments[:half]),
            tool_call(0, arguments=arguments[half:]),
        ]
        answer = Completion([provider_text("fine")])
        server.script(Completion(call, finish_reason="tool_calls"), answer)
        agent = jobs.get_agent(ViaOpenAI, "a")
        failed = agent.save_messages([user("go")])
        assert failed.status == "error"
        assert "model produced a chunk that could not be stored: tool-input-available.input" in (
            str(failed.error)
        )
        [_, reply] = agent.get_messages()
        [part] = [p for p in reply.parts if isinstance(p, ToolPart)]
        assert (part.state, part.input) == ("input-streaming", None)
        assert_the_agent_goes_on(agent)


@pytest.mark.parametrize("bad", ["a\x00b", "\ud800", "x" * 100_000, 12345, ["x"]], ids=repr)
def test_a_lookup_by_an_id_no_turn_or_approval_could_have_is_a_clear_error(
    jobs: ThinkJobs, bad: Any
) -> None:
    """The library's lookups and actions by id validate it as the HTTP routes do: a NUL, a
    lone surrogate, a non-string or an id past the length limit is ``InvalidInputError``
    naming the field (before 2026-12-07 a driver's error: psycopg's DataError on a NUL,
    UnicodeEncodeError, ProgrammingError), and nothing changes."""
    agent = jobs.get_agent(Recorder, "lookups")
    kept = agent.submit_messages([user("hello")])
    calls: list[tuple[str, Callable[[], object]]] = [
        ("submission_id", lambda: agent.inspect_submission(bad)),
        ("submission_id", lambda: agent.cancel_submission(bad)),
        ("submission_id", lambda: agent.delete_submission(bad)),
        ("request_id", lambda: agent.request_status(bad)),
        ("request_id", lambda: agent.cancel_chat(bad)),
        ("request_id", lambda: agent.stream(bad, timeout_s=1)),
        ("approval_id", lambda: agent.get_approval(bad)),
        ("approval_id", lambda: agent.respond_to_approval(bad, True)),
        ("request_id", lambda: agent.list_approvals(request_id=bad)),
    ]
    for field, call in calls:
        with pytest.raises(InvalidInputError, match=field):
            call()
    found = agent.inspect_submission(kept.submission_id)
    assert found is not None and found.status == "pending"
