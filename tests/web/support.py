"""Helpers of the web tests: tokens, headers, an SSE parser, logging in through the form."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flask.testing import FlaskClient
from werkzeug.test import TestResponse

FULL_TOKEN = "tj-full-7b0c9d0e5f5a4c7e9a1b"
READ_TOKEN = "tj-read-3c1f2e4d5a6b7c8d9e0f"
SECRET_KEY = "tj-test-secret-key-0123456789abcdef"
WEBHOOK_SECRET = "tj-webhook-secret-0f1e2d3c"
FULL = {"Authorization": f"Bearer {FULL_TOKEN}"}
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def agent_url(agent_type: str = "Recorder", name: str = "a", rest: str = "") -> str:
    return f"/api/agents/{agent_type}/{name}{rest}"


@dataclass
class SseEvent:
    data: str | None = None
    id: str | None = None
    comments: list[str] = field(default_factory=list)

    @property
    def chunk(self) -> dict[str, Any] | None:
        if self.data is None or self.data == "[DONE]":
            return None
        found: dict[str, Any] = json.loads(self.data)
        return found


def sse_events(chunks: Iterable[bytes]) -> Iterator[SseEvent]:
    """Parse an SSE byte stream into events as they complete (comments become events too)."""
    buffer = ""
    for chunk in chunks:
        buffer += chunk.decode()
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            yield _parse_block(block)


def _parse_block(block: str) -> SseEvent:
    event = SseEvent()
    for line in block.split("\n"):
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "":
            event.comments.append(value)
        elif name == "data":
            event.data = value if event.data is None else f"{event.data}\n{value}"
        elif name == "id":
            event.id = value
    return event


def stream_text(events: Iterable[SseEvent]) -> str:
    return "".join(
        e.chunk["delta"] for e in events if e.chunk and e.chunk.get("type") == "text-delta"
    )


def read_all(response: TestResponse) -> list[SseEvent]:
    return list(sse_events(response.iter_encoded()))


def csrf_from(page: str) -> str:
    found = _CSRF.search(page)
    assert found is not None, "no CSRF token in the page"
    return found.group(1)


def log_in(client: FlaskClient, token: str, prefix: str = "/admin") -> TestResponse:
    page = client.get(f"{prefix}/login").get_data(as_text=True)
    return client.post(f"{prefix}/login", data={"token": token, "csrf_token": csrf_from(page)})
