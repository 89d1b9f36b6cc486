"""Small builders shared by the tests."""

from __future__ import annotations

import json
import uuid
from typing import Any

from think_jobs import Think
from think_jobs.testing import wait_until


def user(text: str, message_id: str | None = None) -> dict[str, Any]:
    """A user message in AI SDK wire form."""
    return {
        "id": message_id or f"m-{uuid.uuid4().hex[:8]}",
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


def directive(message_id: str | None = None, **spec: Any) -> dict[str, Any]:
    """A user message whose text steers tests.apps.agents.RecordingModel."""
    return user(json.dumps(spec), message_id)


def wait_for_status(
    agent: Think, submission_id: str, *statuses: str, timeout_s: float = 20.0
) -> Any:
    """Wait until the submission reaches one of ``statuses``; returns its inspection."""

    def reached() -> Any:
        found = agent.inspect_submission(submission_id)
        return found if found is not None and found.status in statuses else None

    def describe() -> str:
        found = agent.inspect_submission(submission_id)
        return f"submission {submission_id} is {found.status if found else 'missing'}"

    reached.__name__ = f"status in {statuses}"
    return wait_until(reached, timeout_s, message=describe)


def texts(agent: Think) -> list[tuple[str, str]]:
    """The conversation as (role, text) pairs."""
    from think_jobs.messages import message_text

    return [(m.role, message_text(m)) for m in agent.get_messages()]
