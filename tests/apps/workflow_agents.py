"""Agents and plain Celery steps for the workflow tests. Worker subprocesses import ``jobs``
from here (``think-jobs worker --app tests.apps.workflow_agents:jobs``); settings come from
THINK_JOBS_* env.

Test knobs, read at import (so only the workers of the test that sets them see them):
``TJ_TEST_PRIVATE_UNACKED`` gives the workers an unacked-message registry of their own (a
test that shortens ``THINK_JOBS_BROKER_VISIBILITY_TIMEOUT_S`` must not redeliver the messages
of other test runs sharing the Redis); ``TJ_TEST_TURN_RETRIES`` makes Celery retry a failed
turn step that many times (``autoretry_for`` through ``task_annotations``, as a user would
configure it).
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from celery import Celery

from tests.apps.agents import Recorder
from think_jobs import SubmissionInspection, Think, ThinkJobs, TurnFailedError
from think_jobs.engine.workflows import TURN_TASK
from think_jobs.messages import message_text
from think_jobs.models import EchoModel, ModelRequest, Reply, ScriptedModel


def posted_key(jobs: ThinkJobs) -> str:
    return f"{jobs.keys.prefix}:workflow-posted"


def failures_key(jobs: ThinkJobs) -> str:
    return f"{jobs.keys.prefix}:workflow-failures"


def read_list(jobs: ThinkJobs, key: str) -> list[Any]:
    return [json.loads(raw) for raw in jobs.redis.lrange(key, 0, -1)]


class Echo(Think):
    """Replies ``echo: <the last user message>`` (so a test can check what a step sent)."""

    def get_model(self) -> EchoModel:
        return EchoModel(prefix="echo: ")


class Fragile(Recorder):
    """Kills its own worker process (SIGKILL), once per agent, right after a workflow step
    submitted to it: the step's message is then neither acked nor re-scheduled."""

    def on_submission_status(self, inspection: SubmissionInspection) -> None:
        from_workflow = (inspection.metadata or {}).get("source") == "workflow"
        if inspection.status != "pending" or not from_workflow:
            return
        if self.jobs.redis.set(f"{self.jobs.keys.prefix}:killed:{self.name}", os.getpid(), nx=True):
            os.kill(os.getpid(), signal.SIGKILL)


class Flaky(Think):
    """Its first turn (per agent) ends with an error; later turns echo the user message."""

    def get_model(self) -> ScriptedModel:
        counter = f"{self.jobs.keys.prefix}:flaky:{self.name}"

        def script(request: ModelRequest) -> Reply:
            if self.jobs.redis.incr(counter) == 1:
                return Reply(error="flaky model failed")
            last = next(m for m in reversed(request.messages) if m.role == "user")
            return Reply(text=f"echo: {message_text(last)}")

        return ScriptedModel(script)


def register_steps(app: Celery, jobs: ThinkJobs) -> None:
    """The non-agent steps of the test workflows (results kept, so ``.get()`` works)."""

    @app.task(name="tests.fetch", shared=False, ignore_result=False)  # type: ignore[untyped-decorator]
    def fetch(source: str) -> dict[str, Any]:
        return {"source": source, "values": [3, 1, 2]}

    @app.task(name="tests.post", shared=False, ignore_result=False)  # type: ignore[untyped-decorator]
    def post(result: dict[str, Any], channel: str) -> dict[str, Any]:
        jobs.redis.rpush(posted_key(jobs), json.dumps({"channel": channel, "result": result}))
        return {"channel": channel, "posted": result["text"]}

    @app.task(name="tests.record_failure", shared=False)  # type: ignore[untyped-decorator]
    def record_failure(request: Any, exc: BaseException, traceback: Any) -> None:
        failure = {"task_id": request.id, "type": type(exc).__name__, "message": str(exc)}
        jobs.redis.rpush(failures_key(jobs), json.dumps(failure))


def configure_for_tests(app: Celery, jobs: ThinkJobs) -> None:
    if os.environ.get("TJ_TEST_PRIVATE_UNACKED"):
        # The unacked registry is per Redis db by default and the test Redis is shared with
        # other test runs. Only the keys change: how often the workers look for expired
        # messages, and how long their lock lasts, are think-jobs' own (sized from the
        # visibility timeout, ``celery_redis.restore_options``), which is what is tested.
        private = f"{jobs.keys.prefix}:unacked"
        app.conf.broker_transport_options = {
            **app.conf.broker_transport_options,
            "unacked_key": private,
            "unacked_index_key": f"{private}_index",
            "unacked_mutex_key": f"{private}_mutex",
        }
    retries = os.environ.get("TJ_TEST_TURN_RETRIES")
    if retries:
        app.conf.task_annotations = {
            TURN_TASK: {
                "autoretry_for": (TurnFailedError,),
                "max_retries": int(retries),
                "retry_kwargs": {"countdown": 0.1},
            }
        }


jobs = ThinkJobs()
for agent_class in (Recorder, Echo, Fragile, Flaky):
    jobs.register(agent_class)
configure_for_tests(jobs.celery, jobs)
register_steps(jobs.celery, jobs)
