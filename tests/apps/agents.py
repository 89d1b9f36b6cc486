"""Agent classes used by the integration tests. Worker subprocesses import ``jobs`` from here
(``think-jobs worker --app tests.apps.agents:jobs``); settings come from THINK_JOBS_* env."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import redis

from think_jobs import Think, ThinkJobs
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


class RecordingModel:
    """Records the start and end of each model call with a Redis counter (a global order that
    needs no clocks), then streams the scripted reply the directive asks for."""

    def __init__(self, client: redis.Redis, key: str, agent: str) -> None:
        self._client = client
        self._key = key
        self._agent = agent

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        spec = directive(request)
        label = spec.get("label", "")
        self._record("start", label)
        reply = Reply(
            text=spec.get("text", f"reply to {label}"),
            delay_s=float(spec.get("delay_s", 0.0)),
            stall_after=spec.get("stall_after"),
            error=spec.get("error"),
            raise_error=spec.get("raise"),
        )
        try:
            yield from ScriptedModel(reply).stream(request)
        finally:
            self._record("end", label)

    def _record(self, what: str, label: str) -> None:
        tick = self._client.incr(f"{self._key}:clock")
        event = {
            "tick": tick,
            "what": what,
            "agent": self._agent,
            "label": label,
            "pid": os.getpid(),
        }
        self._client.rpush(self._key, json.dumps(event))


def events_client(jobs: ThinkJobs) -> redis.Redis:
    """Where test events go: $TJ_TEST_EVENTS_REDIS (a Redis that stays up while a test restarts
    the one under test), else the jobs' own Redis."""
    url = os.environ.get("TJ_TEST_EVENTS_REDIS")
    return redis.Redis.from_url(url) if url else jobs.redis


class Recorder(Think):
    def get_model(self) -> RecordingModel:
        return RecordingModel(events_client(self.jobs), events_key(self.jobs), self.name)


class Support(Think):
    def get_model(self) -> ScriptedModel:
        return ScriptedModel("Thanks, we are on it.")


def read_events(jobs: ThinkJobs) -> list[dict[str, Any]]:
    client = events_client(jobs)
    return [json.loads(raw) for raw in client.lrange(events_key(jobs), 0, -1)]


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
