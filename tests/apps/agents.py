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
