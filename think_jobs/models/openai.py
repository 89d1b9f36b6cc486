"""``OpenAIChatModel``: a think-jobs model for any OpenAI-compatible Chat Completions server.

Built on the official ``openai`` package (the optional extra ``think-jobs[openai]``) so auth,
retries, timeouts and SSE parsing are the provider's own; this module only maps one streamed
completion onto AI SDK chunks and the turn's abort signal onto the HTTP connection:

* ``delta.reasoning_content`` (or ``delta.reasoning``) streams as ``reasoning-*`` chunks,
  ``delta.content`` (and ``delta.refusal``) as ``text-*`` chunks; a block is closed when the
  other kind or a tool call starts, and at the end of the step;
* tool calls stream as ``tool-input-start`` then one ``tool-input-delta`` per arguments piece;
  when the completion ends, each call gets ``tool-input-available`` with its parsed input, or
  ``tool-input-error`` when the arguments are not a JSON object (empty arguments mean ``{}``);
* provider failures (``openai.APIError``: error statuses after the client's retries,
  connection errors, timeouts, in-stream error events) become one in-band ``error`` chunk
  carrying the provider's message, and the step ends; nothing is raised;
* an abort hangs up the HTTP stream at once, from the aborting thread, by shutting down the
  response's socket, which wakes the read this thread is blocked in (closing alone would not).
  After an abort the stream ends quietly. The signal is honoured once the response started:
  an abort while the request is still being sent, waiting for headers, or between retries
  takes effect when the response arrives (``timeout_s`` bounds that wait).

Request body: ``model``, the converted ``messages`` (see ``openai_convert``), ``tools`` when
the agent has any, then ``extra_params`` from the constructor, then per-request overrides from
``request.body["openai"]`` (a mapping; later wins, so a request may set ``temperature`` or even
``model``). ``stream`` is always true.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

try:
    import openai
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "OpenAIChatModel needs the openai package: pip install 'think-jobs[openai]'"
    ) from error

from think_jobs.models.base import ModelRequest
from think_jobs.models.openai_convert import to_openai_messages, to_openai_tools

if TYPE_CHECKING:
    from openai import Stream
    from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
    from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall

ChunkDict = dict[str, Any]

PLACEHOLDER_API_KEY = "not-needed"
"""Sent when no key is given and ``OPENAI_API_KEY`` is unset (local servers ignore it)."""

BODY_KEY = "openai"
"""The key of ``request.body`` whose mapping is merged into the request params."""

_REASONING_KEYS = ("reasoning_content", "reasoning")


class OpenAIChatModel:
    """Streams one Chat Completions call per step (see the module docstring).

    ``base_url``, ``api_key``, ``timeout_s`` and ``max_retries`` configure the ``openai``
    client built on first use; pass ``client`` to use a configured one instead (then those
    four are ignored). ``extra_params`` are merged into every request body.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        extra_params: Mapping[str, Any] | None = None,
        client: openai.OpenAI | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.extra_params: dict[str, Any] = dict(extra_params or {})
        self._api_key = api_key
        self._client = client
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def client(self) -> openai.OpenAI:
        """The ``openai`` client, built once on first use."""
        with self._client_lock:
            if self._client is None:
                api_key = self._api_key or os.environ.get("OPENAI_API_KEY")
                self._client = openai.OpenAI(
                    api_key=api_key or PLACEHOLDER_API_KEY,
                    base_url=self.base_url,
                    timeout=self.timeout_s,
                    max_retries=self.max_retries,
                )
            return self._client

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for ``request``, without ``stream`` (always true when sent)."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(request.system, request.messages),
        }
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
        params.update(self.extra_params)
        params.update(_body_overrides(request.body))
        params.pop("stream", None)
        return params

    def stream(self, request: ModelRequest) -> Generator[ChunkDict, None, None]:
        """The chunks of one step; provider errors end it with an ``error`` chunk.

        Closing the generator (the runner does) closes the HTTP stream.
        """
        if request.signal.aborted:
            return
        try:
            response = self._open(request)
        except openai.APIError as error:
            if not request.signal.aborted:
                yield error_chunk(error)
            return
        hangup = _Hangup(response)
        unsubscribe = request.signal.add_listener(hangup.abort)
        try:
            yield from _translate(response, request)
        except Exception as error:
            if request.signal.aborted:  # the hang-up broke the read: not an error
                return
            if not isinstance(error, openai.APIError):
                raise
            yield error_chunk(error)
        finally:
            unsubscribe()
            hangup.close()

    def _open(self, request: ModelRequest) -> Stream[ChatCompletionChunk]:
        params = self.request_params(request)
        model = str(params.pop("model"))
        messages = cast("list[ChatCompletionMessageParam]", params.pop("messages"))
        return self.client.chat.completions.create(
            model=model, messages=messages, stream=True, extra_body=params
        )


def _body_overrides(body: Mapping[str, Any] | None) -> Mapping[str, Any]:
    overrides = (body or {}).get(BODY_KEY)
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ValueError(f'request body "{BODY_KEY}" must be an object of request params')
    return overrides


def error_message(error: openai.APIError) -> str:
    """The provider's own message: the error body's ``message`` when it has one."""
    body = error.body
    if isinstance(body, Mapping) and isinstance(body.get("message"), str) and body["message"]:
        return str(body["message"])
    if isinstance(error, openai.APITimeoutError):
        return error.message
    cause = error.__cause__
    if isinstance(error, openai.APIConnectionError) and cause is not None and str(cause):
        return f"{error.message} ({cause})"
    return error.message or type(error).__name__


def error_chunk(error: openai.APIError) -> ChunkDict:
    """The in-band ``error`` chunk for a provider error."""
    return {"type": "error", "errorText": error_message(error)}


def _translate(response: Stream[ChatCompletionChunk], request: ModelRequest) -> Iterator[ChunkDict]:
    step = _StepTranslator(request.step)
    for chunk in response:
        if request.signal.aborted:
            return
        yield from step.feed(chunk)
    if not request.signal.aborted:
        yield from step.finish()


class _Hangup:
    """Hangs up a streaming response from another thread (the abort listener), safely.

    The reading thread owns closing; the listener only shuts the socket down (which makes
    the blocked read return at once), under a lock so it never touches a socket the reading
    thread already closed. Without a socket (HTTP/2, custom transports) it closes the stream.
    """

    def __init__(self, response: Stream[ChatCompletionChunk]) -> None:
        self._response = response
        self._lock = threading.Lock()
        self._closed = False

    def abort(self, _reason: object = None) -> None:
        with self._lock:
            if self._closed:
                return
            sock = _http11_socket(self._response)
            if sock is None:  # no socket of its own to shut down: close from here
                self._response.close()
                return
            with contextlib.suppress(OSError):  # already gone: nothing left to hang up
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._response.close()


def _http11_socket(response: Stream[ChatCompletionChunk]) -> socket.socket | None:
    """The response's own socket; only for HTTP/1.1, where it carries this response alone.

    None once the response is closed: its connection may be back in the pool, serving
    another request.
    """
    http = response.response
    if http.is_closed or http.http_version not in ("HTTP/1.1", "HTTP/1.0"):
        return None
    network_stream: Any = http.extensions.get("network_stream")
    get_info = getattr(network_stream, "get_extra_info", None)
    sock = get_info("socket") if callable(get_info) else None
    return sock if isinstance(sock, socket.socket) else None


@dataclass
class _Block:
    kind: str
    id: str


@dataclass
class _ToolCall:
    """One streamed tool call; pieces that arrive before its name are held back."""

    step: int
    index: int
    id: str | None = None
    name: str | None = None
    pieces: list[str] = field(default_factory=list)
    started: bool = False

    @property
    def call_id(self) -> str:
        return self.id or f"call-{self.step}-{self.index}"

    def feed(self, delta: ChoiceDeltaToolCall) -> Iterator[ChunkDict]:
        self.id = self.id or delta.id
        function = delta.function
        self.name = self.name or (function.name if function else None)
        piece = function.arguments if function else None
        if piece:
            self.pieces.append(piece)
        if self.started:
            if piece:
                yield self._delta(piece)
        elif self.name:
            self.started = True
            yield {"type": "tool-input-start", "toolCallId": self.call_id, "toolName": self.name}
            yield from (self._delta(held) for held in self.pieces)

    def _delta(self, piece: str) -> ChunkDict:
        return {"type": "tool-input-delta", "toolCallId": self.call_id, "inputTextDelta": piece}

    def end(self) -> ChunkDict:
        if not self.name:
            return {"type": "error", "errorText": "the provider streamed a tool call without name"}
        raw = "".join(self.pieces)
        call = {"toolCallId": self.call_id, "toolName": self.name}
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError as error:
            text = f"invalid JSON in tool call arguments: {error}"
            return {"type": "tool-input-error", **call, "input": raw, "errorText": text}
        except RecursionError:
            text = "invalid JSON in tool call arguments: nested too deeply for the JSON parser"
            return {"type": "tool-input-error", **call, "input": raw, "errorText": text}
        if not isinstance(value, dict):
            text = f"tool call arguments must be a JSON object, got {type(value).__name__}"
            return {"type": "tool-input-error", **call, "input": value, "errorText": text}
        return {"type": "tool-input-available", **call, "input": value}


class _StepTranslator:
    """Turns the ``chat.completion.chunk`` s of one step into AI SDK chunks."""

    def __init__(self, step: int) -> None:
        self._step = step
        self._open: _Block | None = None
        self._blocks = {"text": 0, "reasoning": 0}
        self._calls: dict[int, _ToolCall] = {}

    def feed(self, chunk: ChatCompletionChunk) -> Iterator[ChunkDict]:
        for choice in chunk.choices:
            if choice.index == 0:  # n > 1 is not supported: the first choice is the answer
                yield from self._delta(choice.delta)

    def finish(self) -> Iterator[ChunkDict]:
        yield from self._close_block()
        for index in sorted(self._calls):
            yield self._calls[index].end()

    def _delta(self, delta: ChoiceDelta) -> Iterator[ChunkDict]:
        reasoning = _reasoning(delta)
        if reasoning:
            yield from self._block_delta("reasoning", reasoning)
        for text in (delta.content, delta.refusal):
            if text:
                yield from self._block_delta("text", text)
        for call in delta.tool_calls or ():
            yield from self._close_block()
            state = self._calls.setdefault(call.index, _ToolCall(self._step, call.index))
            yield from state.feed(call)

    def _block_delta(self, kind: str, piece: str) -> Iterator[ChunkDict]:
        if self._open is None or self._open.kind != kind:
            yield from self._close_block()
            self._open = self._new_block(kind)
            yield {"type": f"{kind}-start", "id": self._open.id}
        yield {"type": f"{kind}-delta", "id": self._open.id, "delta": piece}

    def _new_block(self, kind: str) -> _Block:
        count = self._blocks[kind]
        self._blocks[kind] = count + 1
        suffix = f"-{count}" if count else ""
        return _Block(kind, f"{kind}-{self._step}{suffix}")

    def _close_block(self) -> Iterator[ChunkDict]:
        if self._open is not None:
            yield {"type": f"{self._open.kind}-end", "id": self._open.id}
            self._open = None


def _reasoning(delta: ChoiceDelta) -> str | None:
    """Reasoning text: not in OpenAI's schema, so servers send it as an extra field."""
    extra = delta.model_extra or {}
    for key in _REASONING_KEYS:
        value = extra.get(key)
        if isinstance(value, str) and value:
            return value
    return None


__all__ = ["BODY_KEY", "PLACEHOLDER_API_KEY", "OpenAIChatModel", "error_chunk", "error_message"]
