"""ScheduledTask definitions, task-table validation and occurrence keys."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from think_jobs.errors import ScheduleError
from think_jobs.scheduled_task import (
    ScheduleContext,
    ScheduledTask,
    occurrence_key,
    validate_scheduled_tasks,
)
from think_jobs.scheduling import IntervalSchedule, WallClockSchedule

EXACTLY_ONE = "ScheduledTask needs exactly one of prompt= or handler="


def handler(agent: Any, ctx: ScheduleContext) -> None:
    del agent, ctx


def prompt_for(ctx: ScheduleContext) -> str:
    return f"Run {ctx.task_id} for {ctx.scheduled_for.isoformat()}"


def make_context(**overrides: Any) -> ScheduleContext:
    fields: dict[str, Any] = {
        "task_id": "digest",
        "scheduled_for": datetime(2026, 6, 1, 9, tzinfo=UTC),
        "occurrence_key": "think-schedule:a:b:digest:1",
        "idempotency_key": "think-schedule:a:b:digest:1",
        "schedule": "every day at 09:00",
        "timezone": "Europe/London",
        "metadata": {"team": "ops"},
    }
    return ScheduleContext(**(fields | overrides))


# --- ScheduledTask -------------------------------------------------------------------------


def test_prompt_task_defaults() -> None:
    task = ScheduledTask("every 5 minutes", prompt="Check the queue")
    assert task == ScheduledTask(
        "every 5 minutes",
        prompt="Check the queue",
        handler=None,
        timezone=None,
        metadata=None,
        max_attempts=3,
    )


def test_prompt_callable_receives_the_context() -> None:
    task = ScheduledTask("every day at 09:00", prompt=prompt_for, timezone="Europe/London")
    assert callable(task.prompt)
    assert task.prompt(make_context()) == "Run digest for 2026-06-01T09:00:00+00:00"


def test_handler_task() -> None:
    task = ScheduledTask("every 1 hour", handler=handler, metadata={"a": [1, 2]}, max_attempts=1)
    assert task.handler is handler
    assert task.prompt is None


def test_everything_but_schedule_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        ScheduledTask("every 1 hour", "a prompt")  # type: ignore[call-arg]


def test_scheduled_task_is_frozen() -> None:
    task = ScheduledTask("every 1 hour", prompt="p")
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.prompt = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"prompt": None, "handler": None}, {"prompt": "p", "handler": handler}],
)
def test_exactly_one_of_prompt_or_handler(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ScheduleError) as info:
        ScheduledTask("every 1 hour", **kwargs)
    assert str(info.value) == EXACTLY_ONE


MAX_ATTEMPTS = "ScheduledTask max_attempts must be an integer >= 1, got "


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"prompt": 42}, "ScheduledTask prompt= must be a string or a callable, got 42"),
        ({"prompt": "   "}, "ScheduledTask prompt= must not be empty"),
        ({"prompt": ""}, "ScheduledTask prompt= must not be empty"),
        ({"handler": "nope"}, "ScheduledTask handler= must be callable, got 'nope'"),
        ({"prompt": "p", "max_attempts": 0}, MAX_ATTEMPTS + "0"),
        ({"prompt": "p", "max_attempts": -2}, MAX_ATTEMPTS + "-2"),
        ({"prompt": "p", "max_attempts": 1.5}, MAX_ATTEMPTS + "1.5"),
        ({"prompt": "p", "max_attempts": True}, MAX_ATTEMPTS + "True"),
        ({"prompt": "p", "metadata": [1]}, "ScheduledTask metadata must be a mapping, got [1]"),
    ],
)
def test_invalid_definitions(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ScheduleError) as info:
        ScheduledTask("every 1 hour", **kwargs)
    assert str(info.value) == expected


@pytest.mark.parametrize(
    "metadata",
    [{"when": datetime(2026, 1, 1)}, {"fn": handler}, {"set": {1, 2}}, {(1, 2): "tuple key"}],
)
def test_metadata_must_be_json_serialisable(metadata: dict[Any, Any]) -> None:
    with pytest.raises(ScheduleError, match=r"^ScheduledTask metadata must be JSON-serialisable: "):
        ScheduledTask("every 1 hour", prompt="p", metadata=metadata)


def test_circular_metadata_is_refused() -> None:
    metadata: dict[str, Any] = {}
    metadata["self"] = metadata
    with pytest.raises(ScheduleError, match="JSON-serialisable"):
        ScheduledTask("every 1 hour", prompt="p", metadata=metadata)


def test_schedule_must_be_a_string() -> None:
    with pytest.raises(ScheduleError, match=r"^ScheduledTask schedule must be a string, got 5$"):
        ScheduledTask(5, prompt="p")  # type: ignore[arg-type]


def test_schedule_context_defaults_to_first_attempt() -> None:
    ctx = make_context()
    assert ctx.attempt == 1
    assert make_context(attempt=2).attempt == 2


# --- validate_scheduled_tasks --------------------------------------------------------------


def test_validate_returns_parsed_schedules() -> None:
    tasks = {
        "heartbeat": ScheduledTask("every 5 minutes", prompt="ping"),
        "morning-digest": ScheduledTask("every weekday at 09:00", prompt=prompt_for),
        "weekly_report": ScheduledTask(
            "every week on monday at 08:00", handler=handler, timezone="America/New_York"
        ),
        "Tokyo2": ScheduledTask("every day at 07:00 in Asia/Tokyo", prompt="p"),
    }
    schedules = validate_scheduled_tasks(tasks, default_timezone="Europe/London", owner="Bot")
    assert list(schedules) == list(tasks)
    assert isinstance(schedules["heartbeat"], IntervalSchedule)
    assert schedules["heartbeat"].every_s == 300
    assert schedules["morning-digest"] == WallClockSchedule(
        "every weekday at 09:00", "weekday", 9, 0, (0, 1, 2, 3, 4), "Europe/London"
    )
    weekly = schedules["weekly_report"]
    assert isinstance(weekly, WallClockSchedule)
    assert weekly.timezone == "America/New_York"
    tokyo = schedules["Tokyo2"]
    assert isinstance(tokyo, WallClockSchedule)
    assert tokyo.timezone == "Asia/Tokyo"


def test_validate_empty_table() -> None:
    assert validate_scheduled_tasks({}, default_timezone=None, owner="Bot") == {}


@pytest.mark.parametrize("task_id", ["", "has space", "dots.are.bad", "slash/no", "émoji", "a\n"])
def test_invalid_task_ids(task_id: str) -> None:
    tasks = {task_id: ScheduledTask("every 1 hour", prompt="p")}
    with pytest.raises(ScheduleError) as info:
        validate_scheduled_tasks(tasks, default_timezone=None, owner="SupportAgent")
    assert str(info.value) == (
        f'Invalid scheduled task id "{task_id}" in SupportAgent; use letters, digits, "_" and "-"'
    )


def test_a_task_id_whose_occurrence_keys_could_not_fit_an_idempotency_key_is_refused() -> None:
    """The longest key: prefix, the type, a name of 200 characters, the task id and the
    epoch ms of year 9999 (15 digits), each separated by a colon, within 512 characters (and
    at most 255, the schedules table's column, which a short type leaves room for)."""
    owner = "CustomerSupportAgentForTheEmeaRegionTeam"
    room = 512 - len("think-schedule:") - len(owner) - 200 - 15 - 3
    fits = {"t" * room: ScheduledTask("every 1 hour", prompt="p")}
    assert list(validate_scheduled_tasks(fits, default_timezone=None, owner=owner)) == list(fits)
    too_long = {"t" * (room + 1): ScheduledTask("every 1 hour", prompt="p")}
    with pytest.raises(ScheduleError, match=rf"in {owner} is too long: use at most {room} "):
        validate_scheduled_tasks(too_long, default_timezone=None, owner=owner)


def test_non_string_task_id() -> None:
    tasks: dict[Any, Any] = {7: ScheduledTask("every 1 hour", prompt="p")}
    with pytest.raises(ScheduleError, match=r'^Invalid scheduled task id "7" in Bot;'):
        validate_scheduled_tasks(tasks, default_timezone=None, owner="Bot")


@pytest.mark.parametrize("value", ["every 1 hour", {"schedule": "every 1 hour"}, None])
def test_values_must_be_scheduled_tasks(value: object) -> None:
    tasks: dict[str, Any] = {"digest": value}
    with pytest.raises(ScheduleError) as info:
        validate_scheduled_tasks(tasks, default_timezone=None, owner="Bot")
    assert str(info.value) == f"Bot.digest must be a ScheduledTask, got {type(value).__name__}"


@pytest.mark.parametrize(
    ("task", "default_timezone", "message"),
    [
        (
            ScheduledTask("every day at 09:00", prompt="p"),
            None,
            'Schedule "every day at 09:00" requires a timezone; '
            'add " in <IANA zone>" or pass timezone=',
        ),
        (ScheduledTask("every 5 minutes", prompt="p", timezone="UTC"), None,
         "Interval schedules cannot specify a timezone"),
        (ScheduledTask("every fortnight", prompt="p"), "UTC",
         'Unsupported schedule DSL "every fortnight"'),
        (ScheduledTask("every day at 9:00", prompt="p", timezone="Mars/Base"), "UTC",
         'Invalid timezone "Mars/Base"'),
        (ScheduledTask("every day at 9:00", prompt="p"), "Mars/Base",
         'Invalid timezone "Mars/Base"'),
        (ScheduledTask("every day at 09:00 in UTC", prompt="p", timezone="Europe/London"), None,
         'Schedule timezone "UTC" does not match task timezone "Europe/London"'),
    ],
)  # fmt: skip
def test_schedule_errors_name_owner_and_task(
    task: ScheduledTask, default_timezone: str | None, message: str
) -> None:
    tasks = {"ok": ScheduledTask("every 1 hour", prompt="p"), "bad_one": task}
    with pytest.raises(ScheduleError) as info:
        validate_scheduled_tasks(tasks, default_timezone=default_timezone, owner="SupportAgent")
    assert str(info.value) == f"SupportAgent.bad_one: {message}"
    assert isinstance(info.value.__cause__, ScheduleError)
    assert str(info.value.__cause__) == message


# --- occurrence_key ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheduled_for", "epoch_ms"),
    [
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
        (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), 1774746000000),
        (datetime(2026, 3, 29, 2, 0, tzinfo=timezone(timedelta(hours=1))), 1774746000000),
        (datetime(2026, 6, 1, 9, 0, 0, 123456, tzinfo=UTC), 1780304400123),
    ],
)
def test_occurrence_key_format(scheduled_for: datetime, epoch_ms: int) -> None:
    key = occurrence_key("support", "acme-1", "digest", scheduled_for)
    assert key == f"think-schedule:support:acme-1:digest:{epoch_ms}"


def test_occurrence_key_matches_timestamp() -> None:
    moment = datetime(2026, 6, 1, 9, tzinfo=UTC)
    assert occurrence_key("t", "n", "x", moment).rsplit(":", 1)[1] == str(
        int(moment.timestamp()) * 1000
    )


def test_occurrence_key_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError, match=r"^scheduled_for must be timezone-aware"):
        occurrence_key("t", "n", "x", datetime(2026, 6, 1, 9))
