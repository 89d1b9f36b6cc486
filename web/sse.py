"""A request's stream as Server-Sent Events in the AI SDK "UI message stream" protocol (v1).

Each chunk is ``id: <seq>`` + ``data: <chunk JSON>``; the final ``done`` event becomes a
transient ``data-think-status`` chunk (a valid AI SDK data part carrying the final status) and
then ``data: [DONE]``. Comments (``: ping``) keep proxies from timing the connection out.

One response must not pin a server thread forever. The core follower is read in windows of
``heartbeat_s``: after each window the client gets a ping, which is also how a vanished client
is detected (the write fails and the server closes this generator, which closes the Redis
subscription). After ``max_duration_s`` the response ends without ``[DONE]``; an EventSource
reconnects with ``Last-Event-ID`` and resumes where it stopped. A turn that is over but whose
stream never got its end is completed from the database by the core follower (``stream``).

A resume past the end of a stream that has ended (``StreamResetError``: a ``Last-Event-ID``
from before the buffer was lost and rebuilt from seq 0, or a bogus one) is a 409 before the
response starts (the view opens the first window); found in a later window, or once the
follower rebuilt the stream, it ends the response with an ``error`` chunk and ``[DONE]``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from flask import Response

from think_jobs.errors import BrokerUnavailableError, StorageUnavailableError, StreamResetError
from think_jobs.results import StreamEvent
from web.current import StreamLimits
from web.errors import ApiError
from web.schemas import EVENT_ID_PATTERN, SEQ_DIGITS

log = logging.getLogger(__name__)
DONE = "data: [DONE]\n\n"
PING = ": ping\n\n"
HEADERS = {
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
    "x-vercel-ai-ui-message-stream": "v1",
}
_EVENT_ID = re.compile(EVENT_ID_PATTERN)


@dataclass(frozen=True)
class StreamSource:
    """Where the events of one request come from (the agent, bound by the view)."""

    follow: Callable[[int, float], Iterator[StreamEvent]]  # (after_seq, timeout_s)


def status_chunk(status: str | None, error: str | None) -> dict[str, Any]:
    data = {"status": status, "error": error}
    return {"type": "data-think-status", "data": data, "transient": True}


def _data(payload: dict[str, Any], seq: int | None = None) -> str:
    line = "data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n\n"
    return line if seq is None else f"id: {seq}\n{line}"


def format_event(event: StreamEvent) -> str:
    if event.done:
        return _data(status_chunk(event.status, event.error), event.seq) + DONE
    return _data(event.chunk or {}, event.seq)


def reset_event(error: StreamResetError) -> str:
    """The end of a response resumed past its stream's end: an AI SDK ``error`` chunk (no id,
    it is no event of the stream) that says to read it again, then ``[DONE]``."""
    return _data({"type": "error", "errorText": str(error)}) + DONE


def parse_event_id(value: str | None) -> int | None:
    """``Last-Event-ID`` as a seq (None: no header). Our event ids are seqs, so anything but
    1 to 18 ASCII digits is a 400: ``str.isdigit`` takes "²", which ``int`` refuses, and
    ``int`` of thousands of digits fails."""
    if value is None:
        return None
    if not _EVENT_ID.fullmatch(value):
        raise ApiError(
            400,
            f"Last-Event-ID must be a seq: 1 to {SEQ_DIGITS} ASCII digits",
            type="validation_error",
        )
    return int(value)


class _Reader:
    """One SSE response: the last seq sent and the deadline."""

    def __init__(self, source: StreamSource, after_seq: int, limits: StreamLimits) -> None:
        self.source = source
        self.last_seq = after_seq
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_duration_s

    def window(self) -> Generator[str, None, bool]:
        """Follow for one heartbeat window; True when the response is over (``done`` sent,
        the stream had ended at ``last_seq`` or before it, or the maximum duration reached).
        A stream that ended before ``last_seq`` (a position from before its buffer was lost
        and rebuilt) ends the response with an ``error`` chunk, never a bare ``[DONE]``."""
        timeout_s = min(self.limits.heartbeat_s, self.deadline - time.monotonic())
        if timeout_s <= 0:
            return True
        try:
            return (yield from self._follow(timeout_s))
        except StreamResetError as error:
            log.info("SSE stream reset: %s", error)
            yield reset_event(error)
            return True

    def _follow(self, timeout_s: float) -> Generator[str, None, bool]:
        """The events of one window; True when the response is over."""
        events = self.source.follow(self.last_seq, timeout_s)
        try:
            for event in events:
                self.last_seq = event.seq
                yield format_event(event)
                if event.done:
                    return True
        except TimeoutError:
            return False
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
        yield DONE  # resumed at the end: nothing more will come
        return True


def events(source: StreamSource, *, after_seq: int | None, limits: StreamLimits) -> Iterator[str]:
    """The SSE text of one request, replayed after ``after_seq`` and then live.

    If Redis or the database fails mid-stream the response ends without ``[DONE]`` (the
    status line is already sent); an EventSource reconnects and resumes.
    """
    try:
        yield from _events(source, after_seq, limits)
    except (StorageUnavailableError, BrokerUnavailableError) as error:
        log.warning("SSE stream ended early: %s", error)


def _events(source: StreamSource, after_seq: int | None, limits: StreamLimits) -> Iterator[str]:
    reader = _Reader(source, -1 if after_seq is None else after_seq, limits)
    yield "retry: 3000\n\n"  # sends the headers now, even if the turn is still queued
    while True:
        if (yield from reader.window()):
            return
        yield PING


def response(body: Iterator[str]) -> Response:
    return Response(body, mimetype="text/event-stream", headers=HEADERS)
