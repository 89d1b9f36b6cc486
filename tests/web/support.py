"""Helpers of the web tests: tokens, headers, an SSE parser, logging in through the form, and
an app served over real HTTP."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from flask import Flask
from flask.testing import FlaskClient
from playwright.sync_api import Page
from werkzeug.serving import ThreadedWSGIServer
from werkzeug.test import TestResponse

from tests.support.processes import ROOT, free_port

if TYPE_CHECKING:
    from schemathesis import Case

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


class _Server(ThreadedWSGIServer):
    """Werkzeug's threaded server, keeping its connections so that they can be ended and waited
    for (its own threads are daemons, left running after ``shutdown()``: a keep-alive connection
    from a page still open went on being served, and used the database after the test closed it)."""

    def __init__(self, app: Flask) -> None:
        super().__init__("127.0.0.1", free_port(), app)
        self.connections: list[tuple[socket.socket, threading.Thread]] = []

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        self.connections.append((request, thread))
        thread.start()

    def end_connections(self) -> int:
        """Shut every connection and wait for its thread; how many did not end in 10 s."""
        for connection, _ in self.connections:
            with suppress(OSError):  # already closed by its handler
                connection.shutdown(socket.SHUT_RDWR)
        for _, thread in self.connections:
            thread.join(10)
        return sum(thread.is_alive() for _, thread in self.connections)


@contextmanager
def served(app: Flask) -> Iterator[str]:
    """``app`` on a free loopback port (threaded, as in production); leaving the block stops
    the server, ends the connections it was serving and waits for them (a page still open
    sees the server gone)."""
    server = _Server(app)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        running = server.end_connections()
        if running:
            raise RuntimeError(f"{running} request(s) still being served 10 s after shutdown")


def screenshot(page: Page, name: str, *, full_page: bool = False) -> None:
    """Save the page as ``name`` in $TJ_SCREENSHOT_DIR (``TJ_SCREENSHOT_DIR=docs`` refreshes the
    pictures the docs show); nothing otherwise. A picture asserts nothing, and chromium on a
    loaded machine sometimes cannot capture one ("Unable to capture screenshot", CI)."""
    target = os.environ.get("TJ_SCREENSHOT_DIR")
    if target:
        page.screenshot(path=str(ROOT / target / name), full_page=full_page)


# -- schemathesis cases the harness, not the server, would spoil ------------------------------


def keeps_its_flaw(case: Case[Any]) -> bool:
    """Negative cases with a flawed header are left out: every request is sent with a valid
    bearer token, which repairs a missing or bad ``Authorization`` header, so the server would
    rightly accept it. (Bad ``Idempotency-Key`` headers have their own test in test_api.)"""
    from schemathesis.core.parameters import ParameterLocation  # only the fuzz tests pay for it

    meta = case.meta
    return meta is None or not meta.is_negative_at(ParameterLocation.HEADER)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def sent_as_generated(case: Case[Any]) -> bool:
    """Positive cases whose path values reach the server as something else are left out:
    schemathesis unquotes a value before quoting it, so a generated ``%11`` (valid text) is
    sent as the byte 0x11, which no identifier may hold (seen: a valid request id
    "rejected"), and a generated ``%80`` as a byte that is no UTF-8 at all, which the server
    reads as U+FFFD (seen: a valid agent name "rejected"). Control bytes and anything
    outside ASCII are what that turns valid text into."""
    from schemathesis import GenerationMode

    meta = case.meta
    if meta is not None and meta.generation.mode is GenerationMode.NEGATIVE:
        return True
    values = (case.path_parameters or {}).values()
    return all(not isinstance(v, str) or _printable_once_unquoted(v) for v in values)


def _printable_once_unquoted(value: str) -> bool:
    try:
        unquoted = unquote(value, errors="strict")
    except UnicodeDecodeError:
        return False
    return unquoted.isascii() and not _CONTROL.search(unquoted)
