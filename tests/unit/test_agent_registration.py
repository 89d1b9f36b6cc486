"""``jobs.register`` refuses an agent class whose turn settings cannot work, naming the
attribute; ``before_turn``'s overrides are checked as its turn starts
(tests/integration/test_turn_timeout.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from think_jobs import Think, ThinkJobs
from think_jobs.errors import ConfigurationError, ScheduleError
from think_jobs.scheduled_task import ScheduledTask
from think_jobs.settings import Settings
from think_jobs.validation import seconds_or_none


def agent_class(**attributes: Any) -> type[Think]:
    return type("Probe", (Think,), {"agent_type": "Probe", **attributes})


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"turn_timeout_s": 0}, "Probe.turn_timeout_s must be a positive, finite number"),
        ({"turn_timeout_s": -1.5}, "Probe.turn_timeout_s must be a positive, finite number"),
        ({"turn_timeout_s": float("inf")}, "Probe.turn_timeout_s must be a positive, finite"),
        ({"stall_timeout_s": "10"}, "Probe.stall_timeout_s must be None (no limit) or a number"),
        ({"stall_timeout_s": True}, "Probe.stall_timeout_s must be None (no limit) or a number"),
        ({"max_steps": 0}, "Probe.max_steps must be None (THINK_JOBS_MAX_STEPS) or an integer"),
        ({"max_steps": 2.5}, "Probe.max_steps must be None (THINK_JOBS_MAX_STEPS) or an integer"),
    ],
)
def test_a_class_with_a_turn_setting_that_cannot_work_is_refused(
    attributes: dict[str, Any], message: str
) -> None:
    jobs = ThinkJobs(Settings())
    with pytest.raises(ConfigurationError, match="^" + re.escape(message)):
        jobs.register(agent_class(**attributes))
    with pytest.raises(ConfigurationError, match="unknown agent type"):
        jobs.agent_class("Probe")  # nothing was registered


def test_a_class_with_working_turn_settings_is_registered() -> None:
    jobs = ThinkJobs(Settings())
    cls = agent_class(turn_timeout_s=600, stall_timeout_s=30.5, max_steps=3)
    assert jobs.register(cls) is cls and jobs.agent_class("Probe") is cls


def test_a_time_is_returned_as_seconds() -> None:
    assert seconds_or_none(None, "x") is None
    assert seconds_or_none(2, "x") == 2.0


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"ratio": float("nan")}, "Probe.digest: "),
        ({"blob": "x" * 20_000}, "Probe.digest: its metadata is "),
    ],
)
def test_a_prompt_task_whose_fires_metadata_could_not_be_admitted_is_refused(
    metadata: dict[str, Any], message: str
) -> None:
    """What every fire of the task would submit (the task's metadata and the reserved keys)
    is checked against the submission limits at registration, not at each fire."""

    class Probe(Think):
        agent_type = "Probe"

        def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
            return {"digest": ScheduledTask("every 1 hour", prompt="p", metadata=metadata)}

    jobs = ThinkJobs(Settings())
    with pytest.raises(ScheduleError, match="^" + re.escape(message)):
        jobs.register(Probe)
    assert jobs.agent_types == []
