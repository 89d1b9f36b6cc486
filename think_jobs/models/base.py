"""The model interface: one method that streams the content chunks of one step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from think_jobs.signals import AbortSignal

if TYPE_CHECKING:
    from think_jobs.chunks import Chunk
    from think_jobs.messages import UIMessage
    from think_jobs.tools import Tool


@dataclass(frozen=True)
class ModelRequest:
    """What the runner hands a model for one step of a turn.

    ``messages`` is the conversation so far (including the assistant message being built when
    the tool loop calls the model again); ``signal`` aborts when the turn is cancelled, so a
    model that waits should wait on it.
    """

    system: str
    messages: list[UIMessage]
    tools: Mapping[str, Tool] = field(default_factory=dict)
    body: Mapping[str, Any] | None = None
    continuation: bool = False
    signal: AbortSignal = field(default_factory=AbortSignal)
    step: int = 0


ModelOutput = Iterable["Chunk | Mapping[str, Any]"]


@runtime_checkable
class Model(Protocol):
    """Anything with ``stream(request)`` yielding chunks (models or plain dicts with AI SDK keys).

    Yield content chunks only (``text-*``, ``reasoning-*``, ``tool-input-*``, sources, files,
    ``data-*``, or an ``error`` chunk); the runner adds ``start``/``finish`` framing. Raising is
    a model error.
    """

    def stream(self, request: ModelRequest) -> ModelOutput: ...
