"""Where each socket of the test process was made, told when one is collected while open.

Python's own "unclosed socket" ResourceWarning names the socket but not its maker, and
tracemalloc, which would, slows the suite several times over. ``install()`` makes every
``socket.socket`` (redis-py, kombu and psycopg's Python side all make theirs through it)
remember the stack that made it; one collected while still open raises the same
ResourceWarning (an error in this suite, reported as the test's unraisable exception) with
that stack, then closes the socket. Behaviour is otherwise that of ``socket.socket``.
"""

from __future__ import annotations

import socket
import threading
import traceback
import warnings
from typing import Any

_STACK_LIMIT = 30


class _RememberingSocket(socket.socket):
    _made_at = ""
    _made_in = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._made_at = "".join(traceback.format_stack(limit=_STACK_LIMIT)[:-1])
        self._made_in = threading.current_thread().name

    def __del__(self) -> None:
        if self.fileno() == -1:
            return
        described = repr(self)
        self.close()
        warnings.warn(
            f"unclosed {described}, made in thread {self._made_in!r} at:\n{self._made_at}",
            ResourceWarning,
            stacklevel=1,
        )


def install() -> None:
    """From now on every ``socket.socket(...)`` of this process remembers where it was made."""
    socket.socket = _RememberingSocket  # type: ignore[misc]
