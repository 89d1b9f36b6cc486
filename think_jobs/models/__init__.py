"""Models: the ``Model`` protocol, the deterministic ``ScriptedModel``/``EchoModel``, and
``OpenAIChatModel`` for any OpenAI-compatible server (optional extra ``think-jobs[openai]``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from think_jobs.models.base import Model, ModelOutput, ModelRequest
from think_jobs.models.scripted import EchoModel, Reply, ScriptedModel, ToolCall

if TYPE_CHECKING:
    from think_jobs.models.openai import OpenAIChatModel


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":  # imported lazily: the openai package is an optional extra
        from think_jobs.models.openai import OpenAIChatModel

        return OpenAIChatModel
    raise AttributeError(name)


__all__ = [
    "EchoModel",
    "Model",
    "ModelOutput",
    "ModelRequest",
    "OpenAIChatModel",
    "Reply",
    "ScriptedModel",
    "ToolCall",
]
