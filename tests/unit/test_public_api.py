"""The public API is what ``think_jobs`` exports and the SPEC's method names: a refactor of the
layers under it must not change either (a change here is a deliberate, documented one)."""

from __future__ import annotations

import inspect

import think_jobs
from think_jobs import Think, ThinkJobs

EXPORTED = [
    "AbortController",
    "AbortSignal",
    "AgentNotRegisteredError",
    "Approval",
    "BrokerUnavailableError",
    "ChatResponseResult",
    "ChatStartEvent",
    "ConfigurationError",
    "EmptySubmissionError",
    "InvalidInputError",
    "MessageValidationError",
    "Model",
    "ModelRequest",
    "NestedTurnError",
    "SaveMessagesResult",
    "ScheduleContext",
    "ScheduleError",
    "ScheduledTask",
    "Settings",
    "StorageUnavailableError",
    "StreamCallback",
    "StreamEvent",
    "StreamResetError",
    "SubmissionConflictError",
    "SubmissionInspection",
    "SubmissionStatus",
    "SubmitMessagesResult",
    "Think",
    "ThinkJobs",
    "ThinkJobsError",
    "Tool",
    "TurnContext",
    "TurnFailedError",
    "UIMessage",
    "UnknownApprovalError",
    "UnknownCursorError",
    "UnknownRequestError",
    "tool",
]

THINK_METHODS = [  # SPEC.md's agent.* names and the Think hooks it names
    "abort_all_requests",
    "abort_request",
    "before_turn",
    "cancel_chat",
    "cancel_submission",
    "chat",
    "clear_messages",
    "continue_last_turn",
    "delete_submission",
    "delete_submissions",
    "get_messages",
    "get_model",
    "get_scheduled_tasks",
    "get_tools",
    "inspect_submission",
    "list_approvals",
    "list_submissions",
    "next_runs",
    "on_chat_error",
    "on_chat_response",
    "respond_to_approval",
    "run_scheduled_task",
    "save_messages",
    "start",
    "stream",
    "sub_agent",
    "submit_messages",
    "subscribe",
]

THINK_JOBS_MEMBERS = ["celery", "get_agent", "migrate", "register"]


def test_the_package_exports_exactly_the_public_names() -> None:
    assert sorted(think_jobs.__all__) == EXPORTED
    assert all(getattr(think_jobs, name, None) is not None for name in EXPORTED)


def test_every_spec_method_of_an_agent_is_there_and_callable() -> None:
    missing = [name for name in THINK_METHODS if not callable(getattr(Think, name, None))]
    assert missing == []


def test_the_runtime_keeps_its_spec_members() -> None:
    found = dict(inspect.getmembers(ThinkJobs))
    assert [name for name in THINK_JOBS_MEMBERS if name not in found] == []


def test_starting_a_process_does_not_import_alembic_until_it_migrates() -> None:
    """Workers, web processes and CLI commands import the package at start; Alembic (with Mako
    and Pygments) only comes with a migration (``think_jobs.db.migrate``)."""
    import subprocess
    import sys

    probe = (
        "import sys, think_jobs, think_jobs.cli.main, think_jobs.worker.app\n"
        "loaded = sorted(m for m in ('alembic', 'mako', 'pygments') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
        "from think_jobs.db import migrate\n"
        "migrate.alembic_config\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)
