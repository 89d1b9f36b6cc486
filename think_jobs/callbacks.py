"""``chat()`` stream callbacks, shaped like Think's ``StreamCallback``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatStartEvent:
    """Given to ``on_start`` before the turn is queued: keep ``request_id`` to cancel it."""

    request_id: str


class StreamCallback:
    """No-op callbacks to subclass, or build from functions: ``StreamCallback(on_event=fn)``.

    ``on_start(event)`` before the turn is queued; ``on_event(json)`` once per chunk, in order
    (``error`` chunks are not forwarded); ``on_done()`` after success; ``on_error(message)``
    after a model error; ``on_interrupted()`` when a stalled attempt was handed to recovery.
    """

    def __init__(
        self,
        *,
        on_start: Callable[[ChatStartEvent], Any] | None = None,
        on_event: Callable[[str], Any] | None = None,
        on_done: Callable[[], Any] | None = None,
        on_error: Callable[[str], Any] | None = None,
        on_interrupted: Callable[[], Any] | None = None,
    ) -> None:
        self._functions = {
            "on_start": on_start,
            "on_event": on_event,
            "on_done": on_done,
            "on_error": on_error,
            "on_interrupted": on_interrupted,
        }

    def _call(self, name: str, *args: Any) -> None:
        function = self._functions.get(name) if hasattr(self, "_functions") else None
        if function is not None:
            function(*args)

    def on_start(self, event: ChatStartEvent) -> None:
        self._call("on_start", event)

    def on_event(self, json_chunk: str) -> None:
        self._call("on_event", json_chunk)

    def on_done(self) -> None:
        self._call("on_done")

    def on_error(self, message: str) -> None:
        self._call("on_error", message)

    def on_interrupted(self) -> None:
        self._call("on_interrupted")


def call_optional(callback: object, name: str, *args: Any) -> None:
    """Call ``callback.<name>(*args)`` if the object has that method (duck-typed callbacks)."""
    method = getattr(callback, name, None)
    if callable(method):
        method(*args)
