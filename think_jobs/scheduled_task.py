"""What an agent declares to run on a schedule, and the checks made when it is registered.

An agent class lists ``ScheduledTask`` values by task id. Each pairs a schedule phrase (see
``think_jobs.scheduling``) with either a prompt (a fixed string, or a function of the
``ScheduleContext``) that becomes a turn, or a handler called as ``handler(agent, ctx)``.
Definitions are checked when the class is registered so a typo fails at start-up, with the
owner and task id in the message, instead of at 3 a.m. on the first run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from think_jobs.errors import ScheduleError
from think_jobs.scheduling import Schedule, parse_schedule
from think_jobs.validation import AGENT_NAME_MAX_CHARS, MAX_IDEMPOTENCY_KEY_LENGTH

_TASK_ID: Final = re.compile(r"[A-Za-z0-9_-]+")
_UNIX_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS: Final = timedelta(milliseconds=1)
_LAST_DATE: Final = datetime(9999, 12, 31, tzinfo=UTC)  # the longest epoch ms a key holds
_TASK_ID_MAX_CHARS: Final = 255  # the schedules table's column


@dataclass(frozen=True)
class ScheduleContext:
    """One occurrence of a scheduled task, handed to a prompt function or a handler.

    ``occurrence_key`` and ``idempotency_key`` are the same string today (see
    ``occurrence_key``); ``attempt`` counts from 1.
    """

    task_id: str
    scheduled_for: datetime
    occurrence_key: str
    idempotency_key: str
    schedule: str
    timezone: str | None
    metadata: dict[str, Any]
    attempt: int = 1


PromptFunction = Callable[[ScheduleContext], str]
Handler = Callable[[Any, ScheduleContext], None]


@dataclass(frozen=True)
class ScheduledTask:
    """A schedule phrase plus exactly one of ``prompt=`` or ``handler=``.

    ``timezone`` is the task's zone for wall-clock phrases (the agent's default applies when
    neither it nor an ``in <zone>`` suffix is given). ``metadata`` must be JSON-serialisable;
    it is copied into every ``ScheduleContext``. A failed run is tried ``max_attempts`` times.
    """

    schedule: str
    _: KW_ONLY
    prompt: str | PromptFunction | None = None
    handler: Handler | None = None
    timezone: str | None = None
    metadata: Mapping[str, Any] | None = None
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, str):
            raise ScheduleError(f"ScheduledTask schedule must be a string, got {self.schedule!r}")
        _check_action(self.prompt, self.handler)
        _check_max_attempts(self.max_attempts)
        _check_metadata(self.metadata)


def validate_scheduled_tasks(
    tasks: Mapping[str, ScheduledTask], *, default_timezone: str | None, owner: str
) -> dict[str, Schedule]:
    """Check every task id and definition of ``owner``; return each task's parsed schedule.

    Errors are ``ScheduleError``; a schedule error is prefixed with ``<owner>.<task_id>: ``.
    """
    return {
        task_id: _validated_schedule(task_id, task, default_timezone, owner)
        for task_id, task in tasks.items()
    }


def occurrence_key(agent_type: str, agent_name: str, task_id: str, scheduled_for: datetime) -> str:
    """``think-schedule:<agent_type>:<agent_name>:<task_id>:<epoch ms>``, one per occurrence.

    It is both the occurrence key and the idempotency key of the run it starts, so it keeps
    the idempotency-key rule (no spaces): a space inside the agent's type or name is written
    ``+``. Keys are unique per agent, whose type and name every key of it shares, so this
    cannot make two of its occurrences collide.
    """
    if scheduled_for.tzinfo is None or scheduled_for.utcoffset() is None:
        raise ScheduleError(
            f"scheduled_for must be timezone-aware, got naive {scheduled_for.isoformat()}"
        )
    epoch_ms = (scheduled_for - _UNIX_EPOCH) // _ONE_MS
    owner = f"{agent_type}:{agent_name}".replace(" ", "+")
    return f"think-schedule:{owner}:{task_id}:{epoch_ms}"


def _check_key_room(task_id: str, owner: str) -> None:
    """A task id short enough that every occurrence key of its agent type fits an idempotency
    key, whatever the agent's name (up to ``AGENT_NAME_MAX_CHARS``) and the date."""
    longest = occurrence_key(owner, "n" * AGENT_NAME_MAX_CHARS, task_id, _LAST_DATE)
    room = MAX_IDEMPOTENCY_KEY_LENGTH - (len(longest) - len(task_id))
    if len(task_id) > min(room, _TASK_ID_MAX_CHARS):
        raise ScheduleError(
            f'Scheduled task id "{task_id[:40]}…" in {owner} is too long: use at most '
            f"{min(room, _TASK_ID_MAX_CHARS)} characters (its occurrence keys must fit an "
            f"idempotency key of {MAX_IDEMPOTENCY_KEY_LENGTH} with agent names of up to "
            f"{AGENT_NAME_MAX_CHARS})"
        )


def _check_action(prompt: object, handler: object) -> None:
    if (prompt is None) == (handler is None):
        raise ScheduleError("ScheduledTask needs exactly one of prompt= or handler=")
    if prompt is not None and not (isinstance(prompt, str) or callable(prompt)):
        raise ScheduleError(f"ScheduledTask prompt= must be a string or a callable, got {prompt!r}")
    if isinstance(prompt, str) and not prompt.strip():
        raise ScheduleError("ScheduledTask prompt= must not be empty")
    if handler is not None and not callable(handler):
        raise ScheduleError(f"ScheduledTask handler= must be callable, got {handler!r}")


def _check_max_attempts(max_attempts: object) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ScheduleError(
            f"ScheduledTask max_attempts must be an integer >= 1, got {max_attempts!r}"
        )


def _check_metadata(metadata: object) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise ScheduleError(f"ScheduledTask metadata must be a mapping, got {metadata!r}")
    try:
        json.dumps(dict(metadata))
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"ScheduledTask metadata must be JSON-serialisable: {exc}") from exc


def _validated_schedule(
    task_id: object, task: object, default_timezone: str | None, owner: str
) -> Schedule:
    if not isinstance(task_id, str) or _TASK_ID.fullmatch(task_id) is None:
        raise ScheduleError(
            f'Invalid scheduled task id "{task_id}" in {owner}; use letters, digits, "_" and "-"'
        )
    _check_key_room(task_id, owner)
    if not isinstance(task, ScheduledTask):
        raise ScheduleError(f"{owner}.{task_id} must be a ScheduledTask, got {type(task).__name__}")
    try:
        return parse_schedule(
            task.schedule, timezone=task.timezone, default_timezone=default_timezone
        )
    except ScheduleError as exc:
        raise ScheduleError(f"{owner}.{task_id}: {exc}") from exc


__all__ = [
    "Handler",
    "PromptFunction",
    "ScheduleContext",
    "ScheduledTask",
    "occurrence_key",
    "validate_scheduled_tasks",
]
