"""One object per process, made on first use: a forked child makes its own.

The stream flusher and sender are threads serving every writer of their process. A thread does
not survive ``fork``, so a child must never use the object its parent made (whose thread is not
running there) nor a lock the parent's other threads may have held at the fork.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``get()`` returns this process's object, made by ``make`` on first use."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._pid = 0
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget_inherited)

    def _forget_inherited(self) -> None:
        self._value = None
        self._lock = threading.Lock()  # the parent's may have been held by another thread

    def get(self) -> T:
        value = self._value
        if value is not None and self._pid == os.getpid():
            return value
        with self._lock:
            if self._value is None or self._pid != os.getpid():
                self._value, self._pid = self._make(), os.getpid()
            return self._value
