"""SPEC §6: blocking turns (save_messages, continue_last_turn, chat), callbacks, signals,
reset, nested admission and tools — against real Redis, databases and Celery workers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.apps.agents import Child, Parent, Recorder, read_events
from tests.support.builders import (
    directive,
    texts,
    user,
    wait_for_status,
    wait_until,
    when_streamed,
)
from tests.support.processes import ROOT, worker_processes
from think_jobs import (
    AbortController,
    AbortSignal,
    ChatResponseResult,
    NestedTurnError,
    SaveMessagesResult,
    StreamCallback,
    Think,
    ThinkJobs,
    TurnContext,
    UIMessage,
)
from think_jobs.messages import message_text
from think_jobs.models import Reply, ScriptedModel, ToolCall
from think_jobs.testing import worker
from think_jobs.tools import Tool, tool

SLOW = " ".join(f"w{i}" for i in range(300))


class Logged(Think):
    """Records hook calls; the reply is steered by the last user message (see Recorder)."""

    log: list[Any] = []
    script: Any = "ok"

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(type(self).script)

    def before_turn(self, ctx: TurnContext) -> None:
        Logged.log.append(("before_turn", ctx.trigger, ctx.continuation, ctx.body))

    def on_chat_response(self, result: ChatResponseResult) -> None:
        Logged.log.append(("on_chat_response", result.status, result.error, result.continuation))

    def on_chat_error(self, error: str) -> None:
        Logged.log.append(("on_chat_error", error))


@pytest.fixture
def logged(jobs: ThinkJobs) -> Logged:
    Logged.log = []
    Logged.script = "ok"
    return jobs.get_agent(Logged, "a")


class Recording(StreamCallback):
    def __init__(self, log: list[Any], *, raise_on_error: bool = False) -> None:
        super().__init__()
        self.log = log
        self.raise_on_error = raise_on_error

    def on_start(self, event: Any) -> None:
        self.log.append(("on_start", event.request_id))

    def on_event(self, json_chunk: str) -> None:
        self.log.append(("on_event", json.loads(json_chunk)["type"]))

    def on_done(self) -> None:
        self.log.append(("on_done",))

    def on_error(self, message: str) -> None:
        self.log.append(("on_error", message))
        if self.raise_on_error:
            raise ValueError(f"callback failed on: {message}")

    def on_interrupted(self) -> None:
        self.log.append(("on_interrupted",))


def names(log: list[Any]) -> list[str]:
    return [entry[0] for entry in log]


# -- save_messages -----------------------------------------------------------------------------


def test_save_messages_runs_the_turn_here_and_returns_completed(logged: Logged) -> None:
    result = logged.save_messages([user("hi", "m1")])
    assert result.status == "completed" and result.error is None
    assert len(result.request_id) == 36
    assert texts(logged) == [("user", "hi"), ("assistant", "ok")]
    assert Logged.log == [
        ("before_turn", "save_messages", False, None),
        ("on_chat_response", "completed", None, False),
    ]


def test_save_messages_function_form_sees_messages_when_its_turn_starts(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    ahead = agent.submit_messages(
        [directive("m1", label="ahead", text="first reply", delay_s=0.01)]
    )
    seen: list[list[str]] = []

    def add(current: list[UIMessage]) -> list[UIMessage | dict[str, Any]]:
        seen.append([message.id for message in current])
        return [*current, directive("m2", label="mine")]

    with worker(jobs):
        result = agent.save_messages(add)
    assert result.status == "completed"
    assert agent.inspect_submission(ahead.submission_id).status == "completed"  # type: ignore[union-attr]
    assert seen[0][0] == "m1" and len(seen[0]) == 2  # the submission ahead and its reply
    assert [m.id for m in agent.get_messages()][:3] == seen[0] + ["m2"]


def test_save_messages_with_an_empty_list_still_runs_a_model_turn(logged: Logged) -> None:
    result = logged.save_messages([])
    assert result.status == "completed"
    assert texts(logged) == [("assistant", "ok")]


def test_save_messages_model_error_keeps_user_message_and_partial(logged: Logged) -> None:
    Logged.script = Reply(text="half an answer", error="upstream overloaded")
    result = logged.save_messages([user("hi")])
    assert (result.status, result.error) == ("error", "upstream overloaded")
    assert texts(logged) == [("user", "hi"), ("assistant", "half an answer")]
    assert ("on_chat_error", "upstream overloaded") in Logged.log


def test_save_messages_model_that_raises_gives_error(logged: Logged) -> None:
    Logged.script = Reply(text="so", raise_error="boom")
    result = logged.save_messages([user("hi")])
    assert (result.status, result.error) == ("error", "boom")
    assert texts(logged) == [("user", "hi"), ("assistant", "so")]


def test_signal_aborted_before_the_turn_keeps_the_user_message(logged: Logged) -> None:
    controller = AbortController()
    controller.abort("not needed")
    result = logged.save_messages([user("hi")], signal=controller.signal)
    assert (result.status, result.error) == ("aborted", "not needed")
    assert texts(logged) == [("user", "hi")]


def test_signal_timeout_aborts_a_turn_that_would_never_end(logged: Logged) -> None:
    Logged.script = Reply(text=SLOW, stall_after=3)  # three words, then waits until aborted
    result = logged.save_messages([user("hi")], signal=AbortSignal.timeout(0.3))
    assert (result.status, result.error) == ("aborted", "timeout")
    assert texts(logged)[0] == ("user", "hi")
    # What streamed before the timeout is kept: under load the timeout may come before all
    # three words have, so any prefix of them.
    assert all("w0 w1 w2 ".startswith(text) for role, text in texts(logged) if role == "assistant")


def test_signal_aborted_during_the_turn_keeps_the_partial(logged: Logged) -> None:
    Logged.script = Reply(text=SLOW, stall_after=10)
    controller = AbortController()
    when_streamed(logged, 3, lambda: controller.abort("enough"))
    result = logged.save_messages([user("hi")], signal=controller.signal)
    assert (result.status, result.error) == ("aborted", "enough")
    role, reply = texts(logged)[-1]
    assert role == "assistant" and reply.startswith("w0 w1 w2 ") and "w10" not in reply


def test_threading_event_works_as_a_signal(logged: Logged) -> None:
    Logged.script = Reply(text=SLOW, stall_after=10)
    event = threading.Event()
    when_streamed(logged, 3, event.set)
    result = logged.save_messages([user("hi")], signal=event)
    assert result.status == "aborted"
    role, reply = texts(logged)[-1]
    assert role == "assistant" and reply.startswith("w0 w1 w2 ") and "w10" not in reply


def test_blocking_turn_waits_behind_a_running_submission(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    agent.submit_messages([directive("m1", label="submitted", text="a b c d e", delay_s=0.03)])
    with worker(jobs):
        wait_until(lambda: any(e["what"] == "start" for e in read_events(jobs)))
        result = agent.save_messages([directive("m2", label="blocking")])
    assert result.status == "completed"
    runs = [(e["what"], e["label"]) for e in read_events(jobs)]
    assert runs == [
        ("start", "submitted"),
        ("end", "submitted"),
        ("start", "blocking"),
        ("end", "blocking"),
    ]


def test_reset_while_queued_skips_the_blocking_turn(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    running = agent.submit_messages([directive("m1", label="long", text=SLOW, delay_s=0.01)])
    outcome: list[Any] = []
    with worker(jobs):
        wait_for_status(agent, running.submission_id, "running")
        caller = threading.Thread(
            target=lambda: outcome.append(agent.save_messages([directive("m2", label="queued")]))
        )
        caller.start()
        wait_until(lambda: len(_active(jobs, agent)) == 2)
        agent.reset_turn_state()
        caller.join(20)
    assert outcome[0].status == "skipped"
    assert agent.inspect_submission(running.submission_id).status == "aborted"  # type: ignore[union-attr]
    assert "m2" not in [m.id for m in agent.get_messages()]


def _active(jobs: ThinkJobs, agent: Think) -> list[Any]:
    from think_jobs.db import turns as turn_ops

    agent_id = jobs.agent_id_of(agent, create=False)
    with jobs.db.read() as conn:
        return turn_ops.active_turns(conn, agent_id)  # type: ignore[arg-type]


# -- continue_last_turn ------------------------------------------------------------------------


def test_continue_last_turn_is_skipped_unless_the_last_message_is_the_assistants(
    logged: Logged,
) -> None:
    assert logged.continue_last_turn().model_dump() == {
        "request_id": "",
        "status": "skipped",
        "error": None,
    }
    logged.save_messages([user("hi")], body={"tone": "warm"})
    Logged.log = []
    result = logged.continue_last_turn()
    assert result.status == "completed"
    assert Logged.log[0] == ("before_turn", "continue_last_turn", True, {"tone": "warm"})
    assert Logged.log[1] == ("on_chat_response", "completed", None, True)
    assistant = [m for m in logged.get_messages() if m.role == "assistant"]
    assert len(assistant) == 2 and assistant[0].id != assistant[1].id  # a NEW message


def test_continue_last_turn_body_overrides_and_is_remembered(logged: Logged) -> None:
    logged.save_messages([user("hi")], body={"tone": "warm"})
    logged.continue_last_turn({"tone": "brief"})
    Logged.log = []
    logged.continue_last_turn()
    assert Logged.log[0] == ("before_turn", "continue_last_turn", True, {"tone": "brief"})


# -- chat --------------------------------------------------------------------------------------


def test_chat_success_calls_back_in_order(logged: Logged) -> None:
    log: list[Any] = Logged.log
    logged.chat("hello", Recording(log))
    assert names(log)[0] == "on_start"
    assert names(log)[-3:] == ["on_event", "on_done", "on_chat_response"]
    events = [entry[1] for entry in log if entry[0] == "on_event"]
    assert events == [
        "start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish",
    ]  # fmt: skip
    assert log.index(("before_turn", "chat", False, None)) == 1
    assert texts(logged) == [("user", "hello"), ("assistant", "ok")]


def test_chat_model_error_reports_response_then_on_error(logged: Logged) -> None:
    Logged.script = Reply(text="partial", error="model overloaded")
    log: list[Any] = Logged.log
    logged.chat("hello", Recording(log))
    assert ("on_event", "error") not in log  # the error chunk is not forwarded
    assert [entry for entry in log if entry[0] != "on_event"][-3:] == [
        ("on_chat_error", "model overloaded"),
        ("on_chat_response", "error", "model overloaded", False),
        ("on_error", "model overloaded"),
    ]
    assert "on_done" not in names(log)


def test_chat_thrown_error_reports_response_then_on_error(logged: Logged) -> None:
    Logged.script = Reply(raise_error="kaput")
    log: list[Any] = Logged.log
    logged.chat("hello", Recording(log))
    assert names(log)[-2:] == ["on_chat_response", "on_error"]
    assert log[-1] == ("on_error", "kaput")


def test_chat_raises_what_on_error_raised_after_on_chat_response_ran_once(logged: Logged) -> None:
    Logged.script = Reply(error="bad")
    log: list[Any] = Logged.log
    with pytest.raises(ValueError, match="callback failed on: bad"):
        logged.chat("hello", Recording(log, raise_on_error=True))
    assert names(log).count("on_chat_response") == 1


def test_chat_abort_calls_neither_on_done_nor_on_error(logged: Logged) -> None:
    Logged.script = Reply(text=SLOW, stall_after=10)
    log: list[Any] = Logged.log
    controller = AbortController()

    class AbortAfterThree(Recording):
        def on_event(self, json_chunk: str) -> None:
            super().on_event(json_chunk)
            if self.log.count(("on_event", "text-delta")) == 3:
                controller.abort("user left")

    logged.chat("hello", AbortAfterThree(log), signal=controller.signal)
    assert log.count(("on_event", "text-delta")) == 3
    assert "on_done" not in names(log) and "on_error" not in names(log)
    assert ("on_chat_response", "aborted", "user left", False) in log
    assert names(log)[-1] == "on_chat_response"


def test_chat_accepts_message_objects_lists_empty_text_and_function_builders(
    logged: Logged,
) -> None:
    got: list[str] = []
    callback = StreamCallback(on_event=got.append)
    logged.chat("", callback)
    logged.chat(user("as dict", "m-d"), callback)
    logged.chat([user("in a list", "m-l")], callback)
    logged.chat(lambda current: [user(f"after {len(current)}", "m-f")], callback)
    users = [text for role, text in texts(logged) if role == "user"]
    assert users == ["", "as dict", "in a list", "after 6"]
    assert sum(1 for chunk in got if json.loads(chunk)["type"] == "finish") == 4


def test_chat_tools_keyword_is_ignored_with_a_warning(logged: Logged) -> None:
    with pytest.warns(DeprecationWarning, match="chat\\(\\) no longer accepts tools"):
        logged.chat("hi", StreamCallback(), tools={"x": object()})
    assert texts(logged)[-1] == ("assistant", "ok")


def test_duck_typed_callback_object_works(logged: Logged) -> None:
    class Minimal:
        def __init__(self) -> None:
            self.events = 0

        def on_event(self, json_chunk: str) -> None:
            self.events += 1

    minimal = Minimal()
    logged.chat("hi", minimal)
    assert minimal.events == 7


# -- parent and child --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_parent_on_a_single_slot_worker_calls_a_child_without_deadlock(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    parent = jobs.get_agent(Parent, "parent")
    child = jobs.get_agent(Child, "child-1")
    queued_for_child = child.submit_messages([user("earlier work for the child", "c0")])
    result = parent.submit_messages([user("please delegate", "p1")])
    with worker_processes(settings_env, count=1, concurrency=1, pool="solo"):
        done = wait_for_status(parent, result.submission_id, "completed", "error", timeout_s=60)
    assert done.status == "completed", done.error
    assert child.inspect_submission(queued_for_child.submission_id).status == "completed"  # type: ignore[union-attr]
    tool_part = next(p for p in parent.get_messages()[-1].parts if p.type == "tool-ask_child")
    output = tool_part.output  # type: ignore[union-attr]
    assert output["text"] == "findings: all systems nominal"
    child_events = list(child.stream(output["request_id"], timeout_s=5))
    assert len(child_events) == output["chunks"] + 1 and child_events[-1].status == "completed"
    assert texts(child)[-2:] == [("user", "check the systems"), ("assistant", output["text"])]


# -- cancellation from other processes ---------------------------------------------------------


def run_in_subprocess(env: dict[str, str], code: str) -> None:
    """Run Python ``code`` in a fresh interpreter with the test's THINK_JOBS_* settings."""
    import os

    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr


def test_cancel_chat_from_another_process_stops_the_stream(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    agent = jobs.get_agent(Recorder, "a")
    collected: list[str] = []
    started = threading.Event()

    def on_event(chunk: str) -> None:
        collected.append(chunk)
        if sum(1 for c in collected if json.loads(c)["type"] == "text-delta") == 3:
            started.set()

    ids: list[str] = []
    callback = StreamCallback(on_start=lambda e: ids.append(e.request_id), on_event=on_event)
    caller = threading.Thread(
        target=agent.chat,
        args=(json.dumps({"label": "x", "text": SLOW, "stall_after": 5}), callback),
    )
    caller.start()
    assert started.wait(20)
    run_in_subprocess(
        settings_env,
        "from tests.apps.agents import jobs, Recorder\n"
        f"jobs.get_agent(Recorder, 'a').cancel_chat({ids[0]!r}, 'client disconnected')\n",
    )
    caller.join(20)
    deltas = [json.loads(c) for c in collected if json.loads(c)["type"] == "text-delta"]
    assert len(deltas) == 5  # the model stalled after five words until the cancel arrived
    assert json.loads(collected[-1])["type"] == "abort"
    reply = texts(agent)[-1]
    assert reply[0] == "assistant" and reply[1] == "".join(d["delta"] for d in deltas)


def test_abort_all_requests_from_another_process(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    agent = jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="long", text=SLOW, stall_after=5)])
    with worker(jobs):
        wait_until(lambda: read_events(jobs), 60)  # the model is streaming
        run_in_subprocess(
            settings_env,
            "from tests.apps.agents import jobs, Recorder\n"
            "jobs.get_agent(Recorder, 'a').abort_all_requests()\n",
        )
        found = wait_for_status(agent, result.submission_id, "aborted")
        wait_until(lambda: len(read_events(jobs)) == 2, 60)  # the model call ended
    assert found.error is None
    assert "w299" not in texts(agent)[-1][1]


# -- reset and clear ---------------------------------------------------------------------------


def test_clear_messages_skips_pending_aborts_running_and_deletes_history(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "a")
    agent.save_messages([directive("m0", label="history")])
    running = agent.submit_messages([directive("m1", label="long", text=SLOW, delay_s=0.01)])
    pending = agent.submit_messages([directive("m2", label="pending")])
    with worker(jobs):
        wait_for_status(agent, running.submission_id, "running")
        agent.clear_messages()
        assert agent.get_messages() == []
        found = agent.inspect_submission(pending.submission_id)
        assert found is not None
        assert (found.status, found.error) == ("skipped", "Submission was skipped by turn reset.")
        assert agent.inspect_submission(running.submission_id).status == "aborted"  # type: ignore[union-attr]
        after = agent.save_messages([directive("m3", label="fresh")])
    assert after.status == "completed"
    assert next(m.id for m in agent.get_messages()) == "m3"


# -- nesting -----------------------------------------------------------------------------------


class Nested(Think):
    outcome: list[Any] = []

    def get_model(self) -> ScriptedModel:
        return ScriptedModel("done")

    def on_chat_response(self, result: ChatResponseResult) -> None:
        if message_text_of(result) != "done" or len(Nested.outcome) >= 2:
            return
        try:
            self.save_messages([user("nested")])
        except NestedTurnError as error:
            Nested.outcome.append(str(error))
        Nested.outcome.append(self.submit_messages([user("follow-up", "f1")]).submission_id)


def message_text_of(result: ChatResponseResult) -> str:
    return message_text(result.message) if result.message else ""


def test_blocking_admission_inside_a_turn_raises_and_submit_runs_next(jobs: ThinkJobs) -> None:
    Nested.outcome = []
    agent = jobs.get_agent(Nested, "a")
    agent.save_messages([user("start", "s1")])
    assert Nested.outcome[0] == (
        "Think turn admission (save_messages) cannot be called from inside an active turn; "
        "use submit_messages() instead"
    )
    with worker(jobs):
        wait_for_status(agent, Nested.outcome[1], "completed")
    assert [m.id for m in agent.get_messages() if m.role == "user"] == ["s1", "f1"]


# -- tools -------------------------------------------------------------------------------------


class ToolUser(Think):
    max_steps = 4

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(
            Reply(
                tool_calls=[ToolCall("add", {"a": 1, "b": 2})],
                then=Reply(
                    tool_calls=[ToolCall("add", {"a": 3, "b": 4}), ToolCall("explode")],
                    then=Reply(text="1+2=3 and 3+4=7"),
                ),
            )
        )

    def get_tools(self) -> dict[str, Tool]:
        @tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @tool
        def explode() -> None:
            """Always fails."""
            raise RuntimeError("tool blew up")

        return {"add": add, "explode": explode}


def test_tool_loop_of_three_steps_persists_tool_parts(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(ToolUser, "a")
    chunks: list[dict[str, Any]] = []
    agent.chat("compute", StreamCallback(on_event=lambda c: chunks.append(json.loads(c))))
    kinds = [c["type"] for c in chunks]
    assert kinds.count("start-step") == 3 and kinds.count("finish") == 1
    outputs = [c for c in chunks if c["type"] in ("tool-output-available", "tool-output-error")]
    assert [(c["type"], c.get("output"), c.get("errorText")) for c in outputs] == [
        ("tool-output-available", 3, None),
        ("tool-output-available", 7, None),
        ("tool-output-error", None, "tool blew up"),
    ]
    reply = agent.get_messages()[-1]
    tool_parts = [p for p in reply.parts if p.type.startswith("tool-")]
    assert [p.state for p in tool_parts] == [  # type: ignore[union-attr]
        "output-available",
        "output-available",
        "output-error",
    ]
    assert message_text(reply) == "1+2=3 and 3+4=7"


class Looping(ToolUser):
    max_steps = 2

    def get_model(self) -> ScriptedModel:
        call = Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 1})])
        return ScriptedModel(lambda request: call)


def test_tool_loop_stops_at_max_steps(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Looping, "a")
    result = agent.save_messages([user("loop")])
    assert result.status == "completed"
    steps = [p for p in agent.get_messages()[-1].parts if p.type == "step-start"]
    assert len(steps) == 2


def test_bad_tool_input_becomes_a_tool_error_not_a_crashed_turn(jobs: ThinkJobs) -> None:
    class BadInput(ToolUser):
        def get_model(self) -> ScriptedModel:
            return ScriptedModel(
                Reply(tool_calls=[ToolCall("add", {"a": "x"})], then=Reply(text="sorry"))
            )

    agent = jobs.get_agent(BadInput, "a")
    assert agent.save_messages([user("go")]).status == "completed"
    part = next(p for p in agent.get_messages()[-1].parts if p.type == "tool-add")
    assert part.state == "output-error" and "a" in (part.error_text or "")  # type: ignore[union-attr]


def test_regenerate_replaces_the_last_reply_with_a_new_turn_in_its_place(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "regen")
    agent.save_messages([directive("m1", label="a", text="first answer")])
    first_reply = agent.get_messages()[-1].id
    again = agent.regenerate(idempotency_key="regen-1")
    assert agent.regenerate(idempotency_key="regen-1").accepted is False  # a retried request
    with worker(jobs):
        wait_for_status(agent, again.submission_id, "completed")
    roles = [(m.role, message_text(m)) for m in agent.get_messages()]
    assert [role for role, _ in roles] == ["user", "assistant"]
    assert roles[-1][1] == "first answer"  # the same model answering the same conversation
    assert agent.get_messages()[-1].id != first_reply  # ... in a new reply, in its place
    assert [e["label"] for e in read_events(jobs) if e["what"] == "start"] == ["a", "a"]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_caller_running_a_long_turn_ahead_of_its_own_keeps_its_own(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """Caller A runs the submission queued ahead of its turn itself (no worker), for longer
    than a lease TTL; caller B, behind it, polls fast. A's liveness lapsed while it ran that
    turn, and B, claiming as the turn ended, aborted A's turn as its caller gone ("The caller
    went away before its turn started"; 1 to 6 rounds of 6 before 2026-12-07)."""
    jobs_a = make_jobs(lease_ttl_s=1.0)
    jobs_b = make_jobs(lease_ttl_s=1.0, caller_poll_interval_s=0.001)
    words = " ".join(f"w{i}" for i in range(30))
    for round_ in range(4):
        name = f"helper-{round_}"
        agent_a, agent_b = jobs_a.get_agent(Recorder, name), jobs_b.get_agent(Recorder, name)
        ahead = agent_a.submit_messages(
            [directive(f"s{round_}", label="S", text=words, delay_s=0.05)]
        )
        results: dict[str, SaveMessagesResult] = {}

        def call(
            key: str,
            agent: Recorder,
            message_id: str,
            results: dict[str, SaveMessagesResult] = results,
        ) -> None:
            results[key] = agent.save_messages([user(key, message_id)])

        a = threading.Thread(target=call, args=("a", agent_a, f"m-a{round_}"))
        a.start()
        wait_for_status(agent_a, ahead.submission_id, "running")  # A runs it
        b = threading.Thread(target=call, args=("b", agent_b, f"m-b{round_}"))
        b.start()
        a.join(30)
        b.join(30)
        assert (results["a"].status, results["a"].error) == ("completed", None)
        assert results["b"].status == "completed"
