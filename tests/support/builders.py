"""Small builders shared by the tests."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

from think_jobs import Think
from think_jobs.testing import wait_until as _wait_until

PATIENCE_S = 60.0  # a loaded 2-core CI box runs 4 test processes plus their workers


def wait_until(predicate: Callable[[], Any], timeout_s: float = PATIENCE_S, **options: Any) -> Any:
    """``think_jobs.testing.wait_until`` with a deadline meant for a busy CI machine."""
    return _wait_until(predicate, timeout_s, **options)


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
    agent: Think, submission_id: str, *statuses: str, timeout_s: float = PATIENCE_S
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


def when_streamed(agent: Think, deltas: int, action: Callable[[], Any]) -> threading.Thread:
    """Call ``action`` (in a thread) once the agent's streams hold ``deltas`` text deltas."""
    jobs = agent.jobs
    pattern = f"{jobs.keys.prefix}:stream:{agent.address}:*"

    def count() -> int:
        keys = list(jobs.redis.scan_iter(pattern))
        return sum(
            1 for key in keys for raw in jobs.redis.lrange(key, 0, -1) if b'"text-delta"' in raw
        )

    def watch() -> None:
        wait_until(lambda: count() >= deltas, 30, interval_s=0.005)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def buffer_key(agent: Think, request_id: str) -> str:
    """The Redis key of the stream buffer of the agent's turn ``request_id`` (keyed by row id;
    a key no stream has while there is no such turn)."""
    from think_jobs.engine.submissions import find_turn

    turn = find_turn(agent.jobs.services, agent, request_id)
    return agent.jobs.keys.stream_buffer(agent.address, turn.id if turn is not None else -1)
