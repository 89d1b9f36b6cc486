"""In-process abort signals, shaped like the web platform's ``AbortController``.

Signals never cross processes: to cancel a turn from elsewhere use ``agent.cancel_chat`` or
``agent.cancel_submission``, which set a revocation flag in Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[object], None]


class AbortSignal:
    """Becomes aborted once, with an optional reason; listeners run at that moment."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: object = None
        self._listeners: list[Listener] = []

    @property
    def aborted(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> object:
        return self._reason

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until aborted or ``timeout_s`` passes; True if aborted."""
        return self._event.wait(timeout_s)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(reason)`` when aborted (at once if already); returns an unsubscriber."""
        with self._lock:
            if not self._event.is_set():
                self._listeners.append(listener)
                return lambda: self._remove(listener)
        listener(self._reason)
        return lambda: None

    def _remove(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _abort(self, reason: object) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._reason = reason
            self._event.set()
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(reason)

    @classmethod
    def timeout(cls, seconds: float) -> AbortSignal:
        """A signal that aborts by itself after ``seconds`` (reason ``"timeout"``)."""
        signal = cls()
        timer = threading.Timer(seconds, signal._abort, args=("timeout",))
        timer.daemon = True
        timer.start()
        return signal

    @classmethod
    def aborted_with(cls, reason: object = None) -> AbortSignal:
        """A signal that is already aborted."""
        signal = cls()
        signal._abort(reason)
        return signal


class AbortController:
    """Owns one ``AbortSignal`` and aborts it on demand."""

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: object = None) -> None:
        self.signal._abort(reason)


SignalLike = AbortSignal | threading.Event


def signal_reason(signal: SignalLike | None) -> str | None:
    """The abort reason as text, or None."""
    if isinstance(signal, AbortSignal) and signal.reason is not None:
        return str(signal.reason)
    return None
