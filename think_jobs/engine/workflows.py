"""Agent turns as steps of Celery workflows: ``chain``, ``group`` and ``chord``.

``jobs.turn`` is the Celery task ``think_jobs.turn``. Its arguments are
``([previous,] agent_type, agent_name, *, messages=None, prompt=None, idempotency_key=None,
metadata=None, poll_interval_s=1.0)``: Celery passes the previous step's result as the first
positional argument, so ``jobs.turn.s("Support", "a")`` works both as a first step and chained.

One step:

1. builds its input: ``messages=`` (a string or a list of messages) if given; otherwise one
   user message made of ``prompt`` and the previous result (a string as is, a turn result as
   its text, a list of results item by item, anything else as JSON), separated by a blank line;
2. submits it durably under the idempotency key ``think-workflow:<task id>`` (or the
   ``idempotency_key`` given). Polls and redeliveries of the step keep the task id, so a step
   re-run after its worker died finds its submission instead of submitting again;
3. waits without holding a worker slot or a message: it stores its own task message as the
   turn's *follow-up* and ends (the message is acknowledged). Whoever ends the turn sends the
   follow-up right after (a sweeper sends it if that process died first), and the step runs
   again, finds its submission finished, and returns. A worker killed while a turn ran
   therefore delays the chain by about the lease TTL plus a sweep interval (the turn's
   recovery), not by the broker's visibility timeout. Only while the database is unreachable
   does the step poll, with a countdown of ``poll_interval_s``;
4. returns ``{"submission_id", "status", "text", "message", "agent_type", "agent_name"}``
   (``message``: the assistant reply as AI SDK JSON, or None) or raises ``TurnFailedError`` if
   the turn ended ``error``, ``aborted`` or ``skipped``.

This module is the engine's side of a step (Celery-free); the task itself, which raises
Celery's ``Ignore``/``Retry`` and builds the follow-up from its request, is in
``think_jobs.worker.tasks``. A poll keeps ``request.retries`` unchanged, so it counts genuine
Celery retries only: retry options given to ``think_jobs.turn`` through ``task_annotations``
(``autoretry_for``, ``max_retries``, ``retry_backoff``) apply to failed turns, and a retry is a
new attempt with its own submission (key ``<key>:retry-<n>``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.domain.records import TurnRecord
from think_jobs.engine import followups, submissions
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.errors import InvalidInputError, TurnFailedError
from think_jobs.messages import UIMessage, message_text, user_text_message
from think_jobs.results import SubmissionInspection, SubmissionStatus

MessageInput = UIMessage | Mapping[str, Any]

TURN_TASK: Final = "think_jobs.turn"
KEY_PREFIX: Final = "think-workflow"
DEFAULT_POLL_INTERVAL_S: Final = 1.0
MIN_POLL_INTERVAL_S: Final = 0.05
# The step's own bookkeeping in its kwargs: the key it already submitted under.
SUBMITTED_KEY: Final = "_submitted_key"
_AGENT_PARAMS: Final = ("agent_type", "agent_name")
_RESULT_KEYS: Final = frozenset({"submission_id", "status", "text", "message"})


# -- the step's arguments (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One call of ``think_jobs.turn``: whom to ask, what, and how to wait."""

    agent_type: str
    agent_name: str
    previous: Any = None
    messages: str | list[Any] | None = None
    prompt: str | None = None
    idempotency_key: str | None = None
    metadata: dict[str, Any] | None = None
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    submitted_key: str | None = None

    def key(self, task_id: str, retries: int) -> str:
        """The idempotency key of this attempt: the same for every poll and redelivery."""
        base = self.idempotency_key or f"{KEY_PREFIX}:{task_id}"
        return base if retries == 0 else f"{base}:retry-{retries}"


def parse_step(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Step:
    """Read ``([previous,] agent_type, agent_name, **options)``; the two names may also be
    keywords. Raises InvalidInputError for any other shape."""
    options = dict(kwargs)
    missing = [name for name in _AGENT_PARAMS if name not in options]
    if len(args) not in (len(missing), len(missing) + 1):
        raise InvalidInputError(
            f"{TURN_TASK} takes ([previous,] agent_type, agent_name); got {len(args)} "
            f"positional argument(s) and keywords {sorted(options)}"
        )
    has_previous = len(args) > len(missing)
    options.update(zip(missing, args[int(has_previous) :], strict=True))
    submitted = options.pop(SUBMITTED_KEY, None)
    try:
        step = Step(previous=args[0] if has_previous else None, submitted_key=submitted, **options)
    except TypeError as error:
        raise InvalidInputError(f"{TURN_TASK}: {error}") from None
    _check(step)
    return step


def _check(step: Step) -> None:
    for name in _AGENT_PARAMS:
        if not isinstance(getattr(step, name), str) or not getattr(step, name):
            raise InvalidInputError(f"{TURN_TASK}: {name} must be a non-empty string")
    if not isinstance(step.poll_interval_s, int | float) or step.poll_interval_s <= 0:
        raise InvalidInputError(f"{TURN_TASK}: poll_interval_s must be a positive number")
    if step.messages is not None and step.prompt is not None:
        raise InvalidInputError(f"{TURN_TASK}: pass messages= or prompt=, not both")


def step_messages(step: Step) -> list[MessageInput]:
    """What the step submits (see the module docstring)."""
    if isinstance(step.messages, str):
        return [user_text_message(step.messages)]
    if step.messages is not None:
        return list(step.messages)
    pieces = [step.prompt] if step.prompt is not None else []
    if step.previous is not None:
        pieces.append(render(step.previous))
    if not pieces:
        raise InvalidInputError(
            f"{TURN_TASK} has nothing to send: pass messages= or prompt=, or chain it after "
            "a step that returns something"
        )
    return [user_text_message("\n\n".join(pieces))]


def render(value: Any) -> str:
    """A previous step's result as text: a turn result gives its reply text; in a list (group
    or chord results) each turn result is headed by its agent's ``[type:name]``."""
    if isinstance(value, str):
        return value
    if is_turn_result(value):
        return str(value["text"])
    if isinstance(value, list | tuple):
        return "\n\n".join(_render_item(item) for item in value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _render_item(item: Any) -> str:
    if is_turn_result(item) and "agent_type" in item and "agent_name" in item:
        return f"[{item['agent_type']}:{item['agent_name']}]\n{item['text']}"
    return render(item)


def is_turn_result(value: Any) -> bool:
    """True for a dict shaped like what ``think_jobs.turn`` returns."""
    return isinstance(value, Mapping) and value.keys() >= _RESULT_KEYS


# -- one run of a step ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCall:
    """The Celery call a step runs in: its task id, its workflow's root id, its retries."""

    task_id: str
    root_id: str | None
    retries: int


FollowUp = Callable[[str], dict[str, Any]]  # idempotency key -> this step's task message


def run(
    services: Services, agent: AgentHooks, step: Step, call: StepCall, follow_up: FollowUp
) -> dict[str, Any] | None:
    """Submit (once per attempt); the step's result if the turn already ended, else None once
    ``follow_up(key)`` is stored as the turn's follow-up (the step ends; the turn's end runs it
    again). Raises ``TurnFailedError``, and ``StorageUnavailableError`` (poll again later)."""
    key = step.key(call.task_id, call.retries)
    submission = _find_or_submit(services, agent, step, key, call)
    if not submission.status.terminal and _wait_for_end(services, agent, key, follow_up):
        return None
    return _outcome(services, agent, _refreshed(services, agent, key, submission))


def _wait_for_end(services: Services, agent: AgentHooks, key: str, follow_up: FollowUp) -> bool:
    """Store this step's message as the follow-up of its submission's turn; False if the turn
    ended first (the step can answer now)."""
    turn = _turn_of(services, agent, key)
    return turn is not None and followups.register(services, turn.id, follow_up(key))


def _turn_of(services: Services, agent: AgentHooks, key: str) -> TurnRecord | None:
    agent_id = services.agents.agent_id_of(agent, create=False)
    if agent_id is None:
        return None
    with services.db.read() as conn:
        found = turn_ops.find_by_request_or_key(conn, agent_id, None, key)
    return next((t for t in found if t.is_submission), None)


def _refreshed(
    services: Services, agent: AgentHooks, key: str, submission: SubmissionInspection
) -> SubmissionInspection:
    if submission.status.terminal:
        return submission
    found = find_submission(services, agent, key)
    if found is None:
        raise TurnFailedError(_deleted(agent, key))
    return found


def _deleted(agent: AgentHooks, key: str) -> str:
    return (
        f"the submission of {agent.address} with idempotency key {key} was deleted before "
        "the workflow step saw it finish"
    )


def _find_or_submit(
    services: Services, agent: AgentHooks, step: Step, key: str, call: StepCall
) -> SubmissionInspection:
    found = find_submission(services, agent, key)
    if found is not None:
        return found
    if step.submitted_key == key:
        raise TurnFailedError(_deleted(agent, key))
    submission = submissions.validated(
        services,
        step_messages(step),
        submission_id=None,
        idempotency_key=key,
        metadata=_metadata(step, call),
        trigger="submission",
    )
    return submissions.submit(services, agent, submission)


def _metadata(step: Step, call: StepCall) -> dict[str, Any]:
    ours = {
        "source": "workflow",
        "celery_task_id": call.task_id,
        "workflow_id": call.root_id or call.task_id,
    }
    return {**ours, **(step.metadata or {})}


def _outcome(
    services: Services, agent: AgentHooks, submission: SubmissionInspection
) -> dict[str, Any]:
    if submission.status is SubmissionStatus.COMPLETED:
        reply = assistant_reply(services, agent, submission.submission_id)
        return turn_result(agent, submission, reply)
    detail = f": {submission.error}" if submission.error else ""
    raise TurnFailedError(
        f"turn of {agent.address} (submission {submission.submission_id}) ended "
        f"{submission.status.value}{detail}",
        submission.submission_id,
        submission.status.value,
    )


def turn_result(
    agent: AgentHooks, submission: SubmissionInspection, reply: UIMessage | None
) -> dict[str, Any]:
    """What the step hands to the next one (JSON-ready)."""
    return {
        "submission_id": submission.submission_id,
        "status": submission.status.value,
        "text": message_text(reply) if reply is not None else "",
        "message": reply.to_wire() if reply is not None else None,
        "agent_type": agent.agent_type,
        "agent_name": agent.name,
    }


# -- reads -------------------------------------------------------------------------------------


def find_submission(
    services: Services, agent: AgentHooks, idempotency_key: str
) -> SubmissionInspection | None:
    """The agent's submission with this idempotency key, if any (read-only: no re-enqueue)."""
    turn = _turn_of(services, agent, idempotency_key)
    return None if turn is None else submissions.inspection_of(turn)


def assistant_reply(services: Services, agent: AgentHooks, submission_id: str) -> UIMessage | None:
    """The assistant message the submission's turn stored (None if it produced nothing)."""
    turn = submissions.find_turn(services, agent, submission_id)
    if turn is None or turn.assistant_message_id is None:
        return None
    with services.db.read() as conn:
        raw = conversation_ops.message_json(conn, turn.agent_id, turn.assistant_message_id)
    return None if raw is None else UIMessage.model_validate_json(raw)
