"""Operator repairs of a conversation whose stored messages no longer read back.

A message stored before the input limits existed (or edited by hand) can make reading the
conversation fail with ``StoredMessageError``. These functions find such messages, remove
one, or repair one in place by dropping what cannot be read back (unreadable or over-limit
parts, its metadata). ``think-jobs messages check|remove|repair`` runs them.

They read rows as JSON text, never through the reader that failed, and write in one
transaction each. A repaired message is checked to read back before it is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from think_jobs.db import conversation as conversation_ops
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.errors import InvalidInputError, MessageValidationError
from think_jobs.limits import Limits, well_formed
from think_jobs.messages import coerce_message, stored_message_problem

__all__ = ["Repair", "UnreadableMessage", "remove_message", "repair_message", "unreadable_messages"]


@dataclass(frozen=True)
class UnreadableMessage:
    """A stored message that does not read back: its id, position and why."""

    message_id: str
    position: int
    reason: str


@dataclass(frozen=True)
class Repair:
    """What ``repair_message`` did: the parts it kept, and each thing it dropped with why
    (empty when the message already read back and nothing was written)."""

    message_id: str
    kept_parts: int
    dropped: tuple[str, ...]
    mended: bool = False  # lone surrogates in its text were replaced by U+FFFD


def unreadable_messages(services: Services, agent: AgentHooks) -> list[UnreadableMessage]:
    """Every message of the agent's conversation that cannot be read back, in order."""
    found: list[UnreadableMessage] = []
    for position, (message_id, text) in enumerate(_rows(services, agent)):
        reason = stored_message_problem(text)
        if reason is not None:
            found.append(UnreadableMessage(message_id, position, reason))
    return found


def remove_message(services: Services, agent: AgentHooks, message_id: str) -> bool:
    """Delete one message from the conversation; False if the agent has none with that id."""
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return False
    with services.db.write() as conn:
        return conversation_ops.delete_message(conn, agent_id, message_id)


def repair_message(services: Services, agent: AgentHooks, message_id: str) -> Repair:
    """Keep what reads back of a stored message (id, role, readable parts, readable metadata)
    and write it in place. Raises InvalidInputError when there is no such message or when
    nothing of it can be kept (then remove it)."""
    limits = Limits.of(services.settings)
    text = _stored_text(services, agent, message_id)
    if stored_message_problem(text) is None:
        kept = len(_parsed(message_id, text).get("parts") or [])
        return Repair(message_id, kept_parts=kept, dropped=())
    data, mended = _mended(_parsed(message_id, text))
    rebuilt, dropped = _rebuilt(message_id, data, limits)
    wire = coerce_message(rebuilt, limits=limits).to_wire()
    if stored_message_problem(json.dumps(wire)) is not None:  # defence: never write a bad row
        raise InvalidInputError(f"message {message_id!r} cannot be repaired; remove it")
    agent_id = services.agents.agent_id_of(agent, create=False)
    assert agent_id is not None  # _stored_text found the row
    with services.db.write() as conn:
        conversation_ops.replace_message(conn, agent_id, message_id, wire)
    return Repair(message_id, len(wire["parts"]), tuple(dropped), mended=mended)


def _rows(services: Services, agent: AgentHooks) -> list[tuple[str, str]]:
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return []
    with services.db.read() as conn:
        return conversation_ops.message_rows_json(conn, agent_id)


def _stored_text(services: Services, agent: AgentHooks, message_id: str) -> str:
    agent_id = services.agents.agent_id_of(agent, create=False)
    text = None
    if agent_id is not None:
        with services.db.read() as conn:
            text = conversation_ops.message_json(conn, agent_id, message_id)
    if text is None:
        raise InvalidInputError(f"agent {agent.address} has no stored message {message_id!r}")
    return text


def _parsed(message_id: str, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise InvalidInputError(
            f"message {message_id!r} is not readable JSON ({error}); remove it instead"
        ) from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"message {message_id!r} is not a JSON object; remove it instead")
    return data


def _mended(data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``data`` with each lone surrogate in its strings and keys replaced by U+FFFD, as a
    turn writes its reply since 2026-12-05 (an earlier reply holding one does not read back),
    and whether there was any. JSON's own characters are ASCII: mending the text of the
    whole message touches only what is inside its strings."""
    text = json.dumps(data, ensure_ascii=False)
    mended = well_formed(text)
    return (data, False) if mended == text else (json.loads(mended), True)


def _rebuilt(
    message_id: str, data: Mapping[str, Any], limits: Limits
) -> tuple[dict[str, Any], list[str]]:
    """The message with only what passes the edge's checks, and what was dropped."""
    base: dict[str, Any] = {"id": message_id, "role": data.get("role"), "parts": []}
    _check(base, limits, message_id)
    found = data.get("parts")
    parts = found if isinstance(found, list) else []
    problems = [_part_problem(base, part, index, limits) for index, part in enumerate(parts)]
    kept = [part for part, problem in zip(parts, problems, strict=True) if problem is None]
    dropped = [problem for problem in problems if problem is not None]
    rebuilt = {**base, "parts": kept}
    metadata = data.get("metadata")
    if metadata is not None:
        problem = _problem({**base, "metadata": metadata}, limits)
        rebuilt.update({"metadata": metadata} if problem is None else {})
        dropped.extend([] if problem is None else [f"metadata: {problem}"])
    return rebuilt, dropped


def _part_problem(base: dict[str, Any], part: object, index: int, limits: Limits) -> str | None:
    """Why one part cannot be kept (named ``parts[<index>]``), or None."""
    problem = _problem({**base, "parts": [part]}, limits)
    if problem is None:
        return None
    if problem.startswith("parts[0]"):
        return problem.replace("parts[0]", f"parts[{index}]", 1)
    return f"parts[{index}]: {problem}"


def _problem(candidate: dict[str, Any], limits: Limits) -> str | None:
    """Why ``candidate`` fails the edge's checks or does not read back, or None."""
    try:
        wire = coerce_message(candidate, limits=limits).to_wire()
    except MessageValidationError as error:
        return str(error).removeprefix("message.")
    return stored_message_problem(json.dumps(wire))


def _check(candidate: dict[str, Any], limits: Limits, message_id: str) -> None:
    """The id and role alone must pass, or nothing of the message can be kept."""
    problem = _problem(candidate, limits)
    if problem is not None:
        raise InvalidInputError(
            f"message {message_id!r} cannot be repaired ({problem}); remove it instead"
        )
