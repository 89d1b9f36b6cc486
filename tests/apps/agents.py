"""Agent classes used by the integration tests. Worker subprocesses import ``jobs`` from here
(``think-jobs worker --app tests.apps.agents:jobs``); settings come from THINK_JOBS_* env."""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import redis

from think_jobs import ChatResponseResult, Think, ThinkJobs
from think_jobs.messages import message_text
from think_jobs.models import ModelRequest, Reply, ScriptedModel


def events_key(jobs: ThinkJobs) -> str:
    return f"{jobs.keys.prefix}:test-events"


def directive(request: ModelRequest) -> dict[str, Any]:
    """Tests steer the scripted model with a JSON object as the last user message's text."""
    for message in reversed(request.messages):
        if message.role == "user":
            try:
                found = json.loads(message_text(message))
            except ValueError:
                return {}
            return found if isinstance(found, dict) else {}
    return {}


class Journal:
    """Where the recording model writes: $TJ_TEST_JOURNAL, a file outside Redis and the
    database (what a fault can touch), else a Redis list. In the file each event is one line
    appended with O_APPEND, so the line order is the global order of events across processes,
    whatever their clocks say."""

    def __init__(self, jobs: ThinkJobs) -> None:
        self.path = os.environ.get("TJ_TEST_JOURNAL")
        self.client = None if self.path else events_client(jobs)
        self.key = events_key(jobs)

    def write(self, event: dict[str, Any]) -> None:
        if self.path is not None:
            line = (json.dumps(event) + "\n").encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return
        assert self.client is not None
        event["tick"] = self.client.incr(f"{self.key}:clock")
        self.client.rpush(self.key, json.dumps(event))

    def read(self) -> list[dict[str, Any]]:
        if self.path is not None:
            if not os.path.exists(self.path):
                return []
            with open(self.path) as journal:  # a last line still being written is left out
                lines = [
                    json.loads(line) for line in journal if line.endswith("\n") and line.strip()
                ]
            return [{**event, "tick": tick} for tick, event in enumerate(lines, start=1)]
        assert self.client is not None
        return [json.loads(raw) for raw in self.client.lrange(self.key, 0, -1)]


class RecordingModel:
    """Records the start and end of each model call in the journal (a global order that needs
    no clocks), then streams the scripted reply the directive asks for. In a file journal it
    also records each chunk it yields, and ``holding`` when it waits ``hold_s`` after its
    last chunk (the window just before the final write; the wait ends early when the turn's
    signal aborts, as a real model's call does)."""

    def __init__(self, journal: Journal, agent: str) -> None:
        self._journal = journal
        self._agent = agent

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        spec = directive(request)
        label = spec.get("label", "")
        self._record("start", label, continuation=request.continuation)
        reply = Reply(
            text=spec.get("text", f"reply to {label}"),
            delay_s=float(spec.get("delay_s", 0.0)),
            stall_after=spec.get("stall_after"),
            error=spec.get("error"),
            raise_error=spec.get("raise"),
        )
        try:
            for chunk in ScriptedModel(reply).stream(request):
                if self._journal.path is not None:
                    self._record("chunk", label)
                yield chunk
            if spec.get("hold_s"):
                self._record("holding", label)
                request.signal.wait(float(spec["hold_s"]))  # as a real model's call, aborted
                # when the attempt must stop (its lease could not be renewed in time)
        finally:
            self._record("end", label)

    def _record(self, what: str, label: str, **extra: Any) -> None:
        event = {"what": what, "agent": self._agent, "label": label, "pid": os.getpid()}
        self._journal.write({**event, "t": time.time(), **extra})


def events_client(jobs: ThinkJobs) -> redis.Redis:
    """Where test events go: $TJ_TEST_EVENTS_REDIS (a Redis that stays up while a test restarts
    the one under test), else the jobs' own Redis."""
    url = os.environ.get("TJ_TEST_EVENTS_REDIS")
    return redis.Redis.from_url(url) if url else jobs.redis


class Recorder(Think):
    def get_model(self) -> RecordingModel:
        return RecordingModel(Journal(self.jobs), self.name)


class Support(Think):
    def get_model(self) -> ScriptedModel:
        return ScriptedModel("Thanks, we are on it.")


def read_events(jobs: ThinkJobs) -> list[dict[str, Any]]:
    return Journal(jobs).read()


jobs = ThinkJobs()
jobs.register(Recorder)
jobs.register(Support)


class Child(Think):
    """A research assistant that answers with a fixed, multi-word reply."""

    def get_system_prompt(self) -> str:
        return "You are a research assistant. Analyze data and report findings."

    def get_model(self) -> ScriptedModel:
        return ScriptedModel("findings: all systems nominal")


class ChunkCollector:
    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.request_id = ""
        self.done = False

    def on_start(self, event: Any) -> None:
        self.request_id = event.request_id

    def on_event(self, json_chunk: str) -> None:
        self.chunks.append(json_chunk)

    def on_done(self) -> None:
        self.done = True

    def on_error(self, message: str) -> None:
        raise RuntimeError(message)


class Parent(Think):
    """Delegates to a child agent from inside its own turn, through a tool."""

    def get_model(self) -> ScriptedModel:
        from think_jobs.models import ToolCall

        return ScriptedModel(
            Reply(
                text="Asking the child. ",
                tool_calls=[ToolCall("ask_child", {"task": "check the systems"})],
                then=Reply(text="The child says the systems are nominal."),
            )
        )

    def get_tools(self) -> dict[str, Any]:
        from think_jobs.tools import tool

        @tool
        def ask_child(task: str) -> dict[str, Any]:
            """Ask the child agent and return its streamed chunks and text."""
            collector = ChunkCollector()
            self.sub_agent(Child, "child-1").chat(task, collector)
            deltas = [json.loads(c) for c in collector.chunks]
            text = "".join(c.get("delta", "") for c in deltas if c["type"] == "text-delta")
            return {"request_id": collector.request_id, "chunks": len(deltas), "text": text}

        return {"ask_child": ask_child}


jobs.register(Child)
jobs.register(Parent)


class Staller(Think):
    """Stalls after three words on its first attempt; a continuation finishes the reply."""

    stall_timeout_s = 0.5

    def get_model(self) -> ScriptedModel:
        def script(request: ModelRequest) -> Reply:
            if request.continuation:
                return Reply(text="and the rest.")
            return Reply(text="one two three four five", stall_after=3)

        return ScriptedModel(script)


jobs.register(Staller)


class TimeLimited(Think):
    """A three-second time limit: ``trickle`` streams words 0.05 s apart for 100 s; anything
    else streams four words 0.4 s apart (1.6 s)."""

    turn_timeout_s = 3.0

    def get_model(self) -> ScriptedModel:
        def script(request: ModelRequest) -> Reply:
            if message_text(request.messages[-1]) == "trickle":
                return Reply(text=" ".join(f"w{i}" for i in range(2000)), delay_s=0.05)
            return Reply(text="one two three four", delay_s=0.4)

        return ScriptedModel(script)


jobs.register(TimeLimited)


class HeapProbe(Think):
    """Replies with how many objects its process keeps out of the garbage collector's scans
    (``gc.get_freeze_count()``): what ``worker_gc_freeze`` did there."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(lambda request: Reply(text=str(gc.get_freeze_count())))


jobs.register(HeapProbe)


class HookResetter(Recorder):
    """A ``Recorder`` whose ``on_chat_response``, after a reply that says ``reset``, notes
    ``hook`` in the journal, waits until the file ``$TJ_TEST_JOURNAL.go`` exists (the test
    makes it), then calls ``clear_messages`` and notes how that went: ``reset`` with
    ``raised`` (the error's class name, or None)."""

    def on_chat_response(self, result: ChatResponseResult) -> None:
        if result.message is None or message_text(result.message) != "reset":
            return
        journal = Journal(self.jobs)
        journal.write({"what": "hook", "agent": self.name, "pid": os.getpid(), "t": time.time()})
        go = f"{journal.path}.go"
        deadline = time.monotonic() + 60
        while not os.path.exists(go):  # a file: the test reaches it without Redis or the db
            assert time.monotonic() < deadline, "the test never let the hook go"
            time.sleep(0.01)
        raised = None
        try:
            self.clear_messages()
        except Exception as error:
            raised = type(error).__name__
            raise
        finally:
            event = {"what": "reset", "agent": self.name, "pid": os.getpid(), "raised": raised}
            journal.write({**event, "t": time.time()})


jobs.register(HookResetter)
