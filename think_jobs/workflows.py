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

A poll keeps ``request.retries`` unchanged, so it counts genuine Celery retries only: retry
options given to ``think_jobs.turn`` through ``task_annotations`` (``autoretry_for``,
``max_retries``, ``retry_backoff``) apply to failed turns, and a retry is a new attempt with
its own submission (key ``<key>:retry-<n>``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from celery.exceptions import Ignore, Reject, Retry
from kombu.utils import json as kombu_json
from sqlalchemy import select

from think_jobs import followups, submissions
from think_jobs.context import utcnow
from think_jobs.db import turns as turn_ops
from think_jobs.db.tables import messages as message_rows
from think_jobs.errors import (
    ConfigurationError,
    InvalidInputError,
    StorageUnavailableError,
    TurnFailedError,
)
from think_jobs.messages import UIMessage, message_text, user_text_message
from think_jobs.results import SubmissionInspection, SubmissionStatus

if TYPE_CHECKING:
    from celery import Celery

    from think_jobs.agent import MessageInput, Think
    from think_jobs.runtime import ThinkJobs

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


def next_poll_s(submission: SubmissionInspection, poll_interval_s: float) -> float:
    """Poll a young turn often and an old one every ``poll_interval_s``: a quarter of its age,
    clamped to [MIN_POLL_INTERVAL_S, poll_interval_s]."""
    age_s = (utcnow() - submission.created_at).total_seconds()
    return round(min(poll_interval_s, max(MIN_POLL_INTERVAL_S, age_s / 4)), 3)


# -- the task ----------------------------------------------------------------------------------


def register_tasks(app: Celery, jobs: ThinkJobs) -> None:
    """Register ``think_jobs.turn`` on ``app``. Chords and ``AsyncResult.get()`` need a result
    backend: when the app has none, results go to ``redis_url`` (they expire after
    ``result_expires``, one day by default). Other tasks keep ignoring their results."""
    if not app.conf.result_backend:
        app.conf.result_backend = jobs.settings.result_backend_url or jobs.settings.redis_url

    @app.task(  # type: ignore[untyped-decorator]
        name=TURN_TASK, bind=True, shared=False, ignore_result=False
    )
    def turn(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """An agent turn as a workflow step (see ``think_jobs.workflows``)."""
        return run_step(jobs, self, args, kwargs)


def run_step(
    jobs: ThinkJobs, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Submit (once per attempt), then poll until the turn is over; see the module docstring."""
    request = task.request
    if request.called_directly or request.is_eager:
        raise ConfigurationError(
            f"{TURN_TASK} waits by re-scheduling itself: run it on a worker (.delay(), .s() in a "
            "chain, group or chord), not called directly or with task_always_eager"
        )
    step = parse_step(args, kwargs)
    key = step.key(request.id, request.retries)
    agent = jobs.get_agent(step.agent_type, step.agent_name)
    try:
        submission = _find_or_submit(agent, step, key, request)
        if not submission.status.terminal and _wait_for_end(jobs, agent, task, key, kwargs):
            raise Ignore()  # the turn's end sends this step again
        return _outcome(agent, _refreshed(agent, key, submission))
    except StorageUnavailableError:  # the database is down: ask again later
        raise _poll_again(task, step.poll_interval_s, kwargs) from None


def _wait_for_end(
    jobs: ThinkJobs, agent: Think, task: Any, key: str, kwargs: dict[str, Any]
) -> bool:
    """Store this step's message as the follow-up of its submission's turn; False if the turn
    ended first (the step can answer now)."""
    turn = _turn_of(agent, key)
    if turn is None:
        return False
    again = {**kwargs, SUBMITTED_KEY: key}
    signature = task.signature_from_request(task.request, None, again)
    text = kombu_json.dumps(signature)  # type: ignore[no-untyped-call]  # Celery's own JSON
    message: dict[str, Any] = kombu_json.loads(text)  # type: ignore[no-untyped-call]
    return followups.register(jobs, turn.id, message)


def _turn_of(agent: Think, key: str) -> turn_ops.TurnRecord | None:
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return None
    with agent.jobs.db.read() as conn:
        found = turn_ops.find_by_request_or_key(conn, agent_id, None, key)
    return next((t for t in found if t.is_submission), None)


def _refreshed(agent: Think, key: str, submission: SubmissionInspection) -> SubmissionInspection:
    if submission.status.terminal:
        return submission
    found = find_submission(agent, key)
    if found is None:
        raise TurnFailedError(f"the submission of {agent.address} with idempotency key {key} "
                              "was deleted before the workflow step saw it finish")  # fmt: skip
    return found


def _find_or_submit(agent: Think, step: Step, key: str, request: Any) -> SubmissionInspection:
    found = find_submission(agent, key)
    if found is not None:
        return found
    if step.submitted_key == key:
        raise TurnFailedError(
            f"the submission of {agent.address} with idempotency key {key} was deleted before "
            "the workflow step saw it finish"
        )
    return agent.submit_messages(
        step_messages(step), idempotency_key=key, metadata=_metadata(step, request)
    )


def _metadata(step: Step, request: Any) -> dict[str, Any]:
    ours = {
        "source": "workflow",
        "celery_task_id": request.id,
        "workflow_id": request.root_id or request.id,
    }
    return {**ours, **(step.metadata or {})}


def _poll_again(task: Any, countdown_s: float, kwargs: dict[str, Any]) -> Retry:
    """Publish this step again after ``countdown_s``, as ``Task.retry`` does but keeping
    ``request.retries`` (a poll is not a retry). The caller raises the returned ``Retry``; the
    worker then acks the current message. If publishing fails, the message goes back to the
    queue instead of being lost."""
    signature = task.signature_from_request(task.request, None, kwargs, countdown=countdown_s)
    try:
        signature.apply_async()
    except Exception as error:  # kombu raises several unrelated types when the broker is down
        raise Reject(error, requeue=True) from error
    return Retry(when=countdown_s, sig=signature)


def _outcome(agent: Think, submission: SubmissionInspection) -> dict[str, Any]:
    if submission.status is SubmissionStatus.COMPLETED:
        return turn_result(agent, submission, assistant_reply(agent, submission.submission_id))
    detail = f": {submission.error}" if submission.error else ""
    raise TurnFailedError(
        f"turn of {agent.address} (submission {submission.submission_id}) ended "
        f"{submission.status.value}{detail}",
        submission.submission_id,
        submission.status.value,
    )


def turn_result(
    agent: Think, submission: SubmissionInspection, reply: UIMessage | None
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


def find_submission(agent: Think, idempotency_key: str) -> SubmissionInspection | None:
    """The agent's submission with this idempotency key, if any (read-only: no re-enqueue)."""
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    if agent_id is None:
        return None
    with agent.jobs.db.read() as conn:
        found = turn_ops.find_by_request_or_key(conn, agent_id, None, idempotency_key)
    return next((submissions.inspection_of(t) for t in found if t.is_submission), None)


def assistant_reply(agent: Think, submission_id: str) -> UIMessage | None:
    """The assistant message the submission's turn stored (None if it produced nothing)."""
    turn = submissions.find_turn(agent, submission_id)
    if turn is None or turn.assistant_message_id is None:
        return None
    with agent.jobs.db.read() as conn:
        query = select(message_rows.c.data).where(
            message_rows.c.agent_id == turn.agent_id,
            message_rows.c.message_id == turn.assistant_message_id,
        )
        data = conn.execute(query).scalar_one_or_none()
    return None if data is None else UIMessage.model_validate(data)
