"""Convert think-jobs conversations and tools into OpenAI Chat Completions request shapes.

Pure functions with no ``openai`` import, so they are cheap to test and reuse. The stored
conversation is AI SDK ``UIMessage`` s; Chat Completions wants flat role messages, so:

* the agent's system prompt comes first (when non-empty), ``system`` messages stay system;
* a user message becomes ``{"role": "user", "content": text}`` (its text parts joined, as
  ``message_text`` does). When it has image files (``image/*`` media types) the content becomes
  a list of ``text`` and ``image_url`` parts in message order. Other files, sources and
  ``data-*`` parts are not sent: Chat Completions has no portable shape for them;
* an assistant message becomes one assistant message per step (steps are split at
  ``step-start`` parts): its text as ``content`` (``None`` when it only called tools) and its
  tool calls as ``tool_calls`` (arguments are ``json.dumps(input)``), followed by one ``tool``
  message per call: a string output verbatim, any other output as JSON, an error as its
  ``errorText`` (what the AI SDK's OpenAI provider sends too). Reasoning is not sent back;
* tool calls without a result yet (``input-streaming``/``input-available``) and calls the
  provider executed are left out, because Chat Completions rejects an assistant tool call
  that no ``tool`` message answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from think_jobs.messages import (
    DynamicToolPart,
    FilePart,
    Part,
    StepStartPart,
    TextPart,
    ToolPart,
    UIMessage,
    message_text,
)
from think_jobs.tools import Tool

OpenAIMessage = dict[str, Any]
AnyToolPart = ToolPart | DynamicToolPart

_ANSWERED_STATES = frozenset({"output-available", "output-error", "output-denied"})


def to_openai_messages(system: str, messages: Sequence[UIMessage]) -> list[OpenAIMessage]:
    """The Chat Completions ``messages`` for a system prompt and a conversation."""
    out: list[OpenAIMessage] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        out.extend(_convert_message(message))
    return out


def to_openai_tools(tools: Mapping[str, Tool]) -> list[dict[str, Any]]:
    """Function tools named by their key in ``tools`` (the name the runner looks calls up by)."""
    return [_function_tool(name, tool) for name, tool in tools.items()]


def _function_tool(name: str, tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": dict(tool.input_schema)}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _convert_message(message: UIMessage) -> list[OpenAIMessage]:
    if message.role == "assistant":
        return _assistant_messages(message)
    if message.role == "system":
        return [{"role": "system", "content": message_text(message)}]
    return [_user_message(message)]


def _is_image(part: Part) -> bool:
    return isinstance(part, FilePart) and part.media_type.startswith("image/")


def _user_message(message: UIMessage) -> OpenAIMessage:
    if not any(_is_image(part) for part in message.parts):
        return {"role": "user", "content": message_text(message)}
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart) and _is_image(part):
            content.append({"type": "image_url", "image_url": {"url": part.url}})
    return {"role": "user", "content": content}


def split_steps(parts: Sequence[Part]) -> list[list[Part]]:
    """The parts of each step, split at ``step-start`` parts (empty steps dropped)."""
    steps: list[list[Part]] = [[]]
    for part in parts:
        if isinstance(part, StepStartPart):
            steps.append([])
        else:
            steps[-1].append(part)
    return [step for step in steps if step]


def _assistant_messages(message: UIMessage) -> list[OpenAIMessage]:
    out: list[OpenAIMessage] = []
    for step in split_steps(message.parts):
        out.extend(_assistant_step(step))
    return out


def _answered_calls(parts: Sequence[Part]) -> list[AnyToolPart]:
    return [
        part
        for part in parts
        if isinstance(part, ToolPart | DynamicToolPart)
        and part.state in _ANSWERED_STATES
        and not part.provider_executed
    ]


def _assistant_step(parts: Sequence[Part]) -> list[OpenAIMessage]:
    text = "".join(part.text for part in parts if isinstance(part, TextPart))
    calls = _answered_calls(parts)
    if not text and not calls:
        return []
    assistant: OpenAIMessage = {"role": "assistant", "content": text or None}
    if calls:
        assistant["tool_calls"] = [_tool_call(part) for part in calls]
    return [assistant, *(_tool_result(part) for part in calls)]


def _tool_call(part: AnyToolPart) -> dict[str, Any]:
    arguments = json.dumps(part.input if part.input is not None else {})
    return {
        "id": part.tool_call_id,
        "type": "function",
        "function": {"name": part.tool_name, "arguments": arguments},
    }


def _tool_result(part: AnyToolPart) -> OpenAIMessage:
    if part.state == "output-error":
        content = part.error_text or "tool call failed"
    elif part.state == "output-denied":
        reason = part.approval.reason if part.approval is not None else None
        content = (
            f"The user denied this tool call: {reason}"
            if reason
            else "The user denied this tool call."
        )
    elif isinstance(part.output, str):
        content = part.output
    else:
        content = json.dumps(part.output)
    return {"role": "tool", "tool_call_id": part.tool_call_id, "content": content}


__all__ = ["OpenAIMessage", "split_steps", "to_openai_messages", "to_openai_tools"]
