"""A loopback OpenAI-compatible Chat Completions server for tests.

Why a real server instead of a mocked client: what can break in ``OpenAIChatModel`` is mostly
at the wire (SSE framing, ``chat.completion.chunk`` shapes, tool call deltas split across
chunks, error bodies, retries, a client that hangs up mid-stream), so the tests drive the
official ``openai`` client against this stdlib server over HTTP/1.1 with chunked transfer
encoding, exactly as a real provider streams.

Each test scripts the responses it wants, in order::

    with openai_server() as server:
        server.script(Completion([text("Hel"), text("lo")]))
        server.script(HttpError(500, "overloaded"))
        model = OpenAIChatModel("gpt-test", base_url=server.base_url)

The server records every request body (``server.requests``) and every client that hung up
while it was still streaming (``server.disconnects`` and the ``server.disconnected`` event).
A ``Pause`` in a completion stops the stream until its ``release`` event is set, and sets
``reached`` once everything before it was flushed, so abort tests synchronize on events
rather than sleeps.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Delta = dict[str, Any]

_POLL_S = 0.01  # how often a paused stream looks for a client that hung up


def text(content: str) -> Delta:
    """A delta carrying answer text."""
    return {"content": content}


def reasoning(content: str, key: str = "reasoning_content") -> Delta:
    """A delta carrying reasoning (DeepSeek/vLLM ``reasoning_content``, or ``reasoning``)."""
    return {key: content}


def tool_call(
    index: int, *, id: str | None = None, name: str | None = None, arguments: str | None = None
) -> Delta:
    """A delta carrying one piece of a tool call, shaped like OpenAI's streamed tool calls.

    The first piece of a call has ``id`` and ``name`` (and ``arguments=""``); later pieces
    carry only ``index`` and an ``arguments`` fragment.
    """
    call: dict[str, Any] = {"index": index}
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        call["function"] = function
    return {"tool_calls": [call]}


@dataclass(frozen=True)
class Pause:
    """Stop the stream here until ``release`` is set; ``reached`` is set on arrival."""

    release: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class StreamError:
    """An in-stream error event (``data: {"error": {...}}``), as providers send mid-stream."""

    message: str
    type: str = "server_error"


Event = Delta | Pause | StreamError


@dataclass(frozen=True)
class Completion:
    """A streamed ``chat.completion.chunk`` response: a role chunk, the events, a finish chunk
    and ``data: [DONE]``."""

    events: Sequence[Event] = ()
    finish_reason: str = "stop"


@dataclass(frozen=True)
class HttpError:
    """An error status with an OpenAI-style error body.

    ``retry_after_ms`` is sent as the ``retry-after-ms`` header, which the ``openai`` client
    honours, so retry tests do not wait for its default back-off.
    """

    status: int
    message: str
    type: str = "server_error"
    code: str | None = None
    retry_after_ms: int | None = 1


Response = Completion | HttpError


def error_body(message: str, type: str, code: str | None = None) -> dict[str, Any]:
    """The JSON body OpenAI sends with an error status (and in an in-stream error event)."""
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


@dataclass
class RecordedRequest:
    """One request as received."""

    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any


class OpenAIServer:
    """The scriptable server state; use ``openai_server()`` to run one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._script: deque[Response] = deque()
        self._pauses: list[Pause] = []
        self._ids = itertools.count(1)
        self.received: list[RecordedRequest] = []
        self.disconnects = 0
        self.disconnected = threading.Event()
        self.base_url = ""

    def script(self, *responses: Response) -> None:
        """Queue responses; each request takes the next one (unscripted requests get a 500)."""
        with self._lock:
            self._script.extend(responses)
            for response in responses:
                if isinstance(response, Completion):
                    self._pauses.extend(e for e in response.events if isinstance(e, Pause))

    @property
    def requests(self) -> list[Any]:
        """The JSON bodies received so far, in order."""
        with self._lock:
            return [request.body for request in self.received]

    def release_all(self) -> None:
        """Let every paused stream go on (done on exit so no handler thread is left waiting)."""
        with self._lock:
            pauses = list(self._pauses)
        for pause in pauses:
            pause.release.set()

    def _record(self, request: RecordedRequest) -> Response:
        with self._lock:
            self.received.append(request)
            if self._script:
                return self._script.popleft()
        return HttpError(500, "no scripted response left for this request", retry_after_ms=None)

    def _record_disconnect(self) -> None:
        with self._lock:
            self.disconnects += 1
        self.disconnected.set()

    def _next_id(self) -> str:
        return f"chatcmpl-{next(self._ids)}"


class _Disconnected(Exception):
    """The client went away while the server was streaming to it."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        state = self.server.state
        response = state._record(RecordedRequest(self.path, _headers(self.headers.items()), body))
        if self.path.rstrip("/") != "/v1/chat/completions":
            response = HttpError(404, f"unknown path {self.path}", type="invalid_request_error")
        if isinstance(response, HttpError):
            self._send_error(response)
            return
        try:
            self._stream(response, body)
        except (_Disconnected, BrokenPipeError, ConnectionResetError):
            state._record_disconnect()
            self.close_connection = True

    def _send_error(self, error: HttpError) -> None:
        payload = json.dumps(error_body(error.message, error.type, error.code)).encode()
        self.send_response(error.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if error.retry_after_ms is not None:
            self.send_header("retry-after-ms", str(error.retry_after_ms))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _stream(self, completion: Completion, body: Any) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        model = body.get("model", "") if isinstance(body, dict) else ""
        chunk_id = self.server.state._next_id()
        self._event(_chunk(chunk_id, model, {"role": "assistant", "content": ""}))
        for event in completion.events:
            if isinstance(event, Pause):
                self._pause(event)
            elif isinstance(event, StreamError):
                self._event(error_body(event.message, event.type))
            else:
                self._event(_chunk(chunk_id, model, event))
        self._event(_chunk(chunk_id, model, {}, completion.finish_reason))
        self._data("[DONE]")
        self._write(b"0\r\n\r\n")

    def _event(self, payload: dict[str, Any]) -> None:
        self._data(json.dumps(payload, separators=(",", ":")))

    def _data(self, data: str) -> None:
        frame = f"data: {data}\n\n".encode()
        self._write(f"{len(frame):X}\r\n".encode() + frame + b"\r\n")

    def _write(self, payload: bytes) -> None:
        self.wfile.write(payload)
        self.wfile.flush()

    def _pause(self, pause: Pause) -> None:
        pause.reached.set()
        while not pause.release.wait(_POLL_S):
            if self._client_gone():
                raise _Disconnected

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            peeked: bytes = self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True
        return peeked == b""


def _headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name.lower(): value for name, value in items}


def _chunk(chunk_id: str, model: str, delta: Delta, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: OpenAIServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # a client hung up between requests
            return
        super().handle_error(request, client_address)


@contextmanager
def openai_server() -> Iterator[OpenAIServer]:
    """Run a server on a free loopback port for the duration of the block."""
    state = OpenAIServer()
    server = _Server(state)
    host, port = server.server_address[:2]
    state.base_url = f"http://{host!s}:{port}/v1"
    thread = threading.Thread(
        target=server.serve_forever, args=(_POLL_S,), name="openai-server", daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        state.release_all()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nobody else takes it), not listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
    finally:
        sock.close()
