"""Issue 9: agent turns as steps of Celery workflows (chain, group, chord), against real
``think-jobs worker`` subprocesses (two processes each), the real broker and result backend.

Each test starts its own pair of workers (about 5 s here), so tests whose outcome does not
depend on the database run on one backend only; the chain, the FIFO group and the killed
worker run on both."""

from __future__ import annotations

import gc
import json
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import chain, chord, group
from sqlalchemy import select

from tests.apps.agents import Recorder, read_events
from tests.apps.workflow_agents import (
    Echo,
    Flaky,
    Fragile,
    failures_key,
    posted_key,
    read_list,
)
from tests.support.builders import buffer_key, directive, texts, wait_for_status
from tests.support.ordering import (
    agents_ran_in_parallel,
    order_violations,
    overlaps_within_agents,
    turns_by_agent,
)
from tests.support.processes import (
    WorkerProcess,
    connections_to,
    private_postgres,
    worker_processes,
)
from think_jobs import ConfigurationError, InvalidInputError, Think, ThinkJobs, TurnFailedError
from think_jobs.db.tables import turns
from think_jobs.engine.workflows import parse_step, render, step_messages
from think_jobs.messages import UIMessage, message_text
from think_jobs.testing import wait_until

APP = "tests.apps.workflow_agents:jobs"
TIMEOUT_S = 60


@contextmanager
def workers(
    settings_env: dict[str, str], *, concurrency: int = 2, **extra_env: str
) -> Iterator[list[WorkerProcess]]:
    env = {**settings_env, **extra_env}
    with worker_processes(env, count=2, concurrency=concurrency, app=APP) as processes:
        yield processes


def step(jobs: ThinkJobs, name: str, *args: Any, **kwargs: Any) -> Any:
    """A signature of one of the test app's plain steps (tests.fetch, tests.post, ...)."""
    return jobs.celery.signature(name, args=args, kwargs=kwargs)


def new_id(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def admitted_labels(agent: Think) -> list[str]:
    """The directive labels of the agent's turns in admission order (their queue seq)."""
    agent_id = agent.jobs.agent_id_of(agent, create=False)
    query = select(turns.c.messages).where(turns.c.agent_id == agent_id).order_by(turns.c.seq)
    with agent.jobs.db.read() as conn:
        payloads = list(conn.execute(query).scalars())
    return [json.loads(payload[0]["parts"][0]["text"])["label"] for payload in payloads]


# -- chain ----------------------------------------------------------------------------------------


def test_chain_fetches_summarises_and_posts(jobs: ThinkJobs, settings_env: dict[str, str]) -> None:
    turn_id = new_id("summarise")
    workflow = chain(
        step(jobs, "tests.fetch", "sales"),
        jobs.turn.s("Echo", "summariser", prompt="Summarise:").set(task_id=turn_id),
        step(jobs, "tests.post", channel="#reports"),
    )
    with workers(settings_env):
        final = workflow.apply_async().get(timeout=TIMEOUT_S)

    sent = 'Summarise:\n\n{"source": "sales", "values": [3, 1, 2]}'
    assert final == {"channel": "#reports", "posted": f"echo: {sent}"}
    [posted] = read_list(jobs, posted_key(jobs))
    result = posted["result"]
    assert (result["status"], result["agent_type"], result["agent_name"]) == (
        "completed",
        "Echo",
        "summariser",
    )
    assert result["message"]["role"] == "assistant"
    agent = jobs.get_agent(Echo, "summariser")
    [submission] = agent.list_submissions()
    assert submission.submission_id == result["submission_id"]
    assert submission.idempotency_key == f"think-workflow:{turn_id}"
    assert submission.metadata is not None and submission.metadata["source"] == "workflow"
    assert texts(agent) == [("user", sent), ("assistant", f"echo: {sent}")]


# -- group ----------------------------------------------------------------------------------------


def test_group_of_turns_to_one_agent_runs_one_at_a_time_in_submission_order(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    labels = [f"g{i}" for i in range(5)]
    name = "fifo"
    workflow = group(
        jobs.turn.s("Recorder", name, messages=[directive(label=label, text=label, delay_s=0.03)])
        for label in labels
    )
    # Two worker slots in all for five waiting steps: this only finishes if a waiting step
    # does not hold its slot.
    with workers(settings_env, concurrency=1):
        results = workflow.apply_async().get(timeout=TIMEOUT_S)

    assert [r["text"] for r in results] == labels  # group results keep the group's order
    agent = jobs.get_agent(Recorder, name)
    admitted = admitted_labels(agent)
    assert sorted(admitted) == labels
    runs = turns_by_agent(read_events(jobs))
    assert overlaps_within_agents(runs) == []
    assert order_violations(runs, {name: admitted}) == []


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_group_of_turns_to_five_agents_runs_them_in_parallel(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    names = [f"agent-{i}" for i in range(5)]
    workflow = group(
        jobs.turn.s(
            "Recorder", name, messages=[directive(label=name, text="a b c d", delay_s=0.05)]
        )
        for name in names
    )
    with workers(settings_env):
        results = workflow.apply_async().get(timeout=TIMEOUT_S)

    assert [(r["agent_name"], r["text"]) for r in results] == [(n, "a b c d") for n in names]
    runs = turns_by_agent(read_events(jobs))
    assert sorted(runs) == names
    assert agents_ran_in_parallel(runs)


# -- chord ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_chord_fans_out_to_three_agents_and_merges_their_answers(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    experts = ["legal", "finance", "tech"]
    header = [jobs.turn.s("Echo", name, messages=f"review for {name}") for name in experts]
    merge = jobs.turn.s("Echo", "editor", prompt="Merge these reviews:")
    with workers(settings_env):
        final = chord(header)(merge).get(timeout=TIMEOUT_S)

    answers = "\n\n".join(f"[Echo:{name}]\necho: review for {name}" for name in experts)
    assert final["text"] == f"echo: Merge these reviews:\n\n{answers}"
    assert final["agent_name"] == "editor"
    for name in experts:
        [submission] = jobs.get_agent(Echo, name).list_submissions()
        assert submission.status == "completed"


# -- failures -------------------------------------------------------------------------------------


def test_step_redelivered_after_its_worker_is_killed_submits_once(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    """Fragile SIGKILLs the worker running the step right after the step submitted: the step's
    message was neither acked nor re-scheduled. It comes back (visibility timeout, shortened
    for this test: the only setting changed, think-jobs sizes kombu's restore scans and lock
    from it) to the other worker, finds its submission by key and finishes the chain."""
    turn_id = new_id("fragile")
    workflow = chain(
        jobs.turn.s("Fragile", "f1", messages=[directive(label="once", text="survived")]).set(
            task_id=turn_id
        ),
        step(jobs, "tests.post", channel="#ops"),
    )
    short = {**settings_env, "THINK_JOBS_BROKER_VISIBILITY_TIMEOUT_S": "3"}
    with workers(short, TJ_TEST_PRIVATE_UNACKED="1") as processes:
        final = workflow.apply_async().get(timeout=TIMEOUT_S)
        killed = [p for p in processes if p.process.poll() is not None]

    assert final == {"channel": "#ops", "posted": "survived"}
    assert [p.process.returncode for p in killed] == [-9]
    killer = jobs.redis.get(f"{jobs.keys.prefix}:killed:f1")
    assert killer is not None and int(killer) == killed[0].process.pid
    agent = jobs.get_agent(Fragile, "f1")
    [submission] = agent.list_submissions()
    assert submission.idempotency_key == f"think-workflow:{turn_id}"
    assert [role for role, _ in texts(agent)] == ["user", "assistant"]
    assert [e["label"] for e in read_events(jobs) if e["what"] == "start"] == ["once"]


def test_a_step_waiting_on_a_turn_goes_on_when_its_worker_is_killed(
    make_jobs: Callable[..., ThinkJobs], settings_env: dict[str, str]
) -> None:
    """The only worker is SIGKILLed while the step waits on its turn (the broker's visibility
    timeout is the default six hours): the turn recovers on a new worker, and its end sends
    the step on — the step held no message the kill could strand."""
    jobs = make_jobs()
    text = " ".join(f"w{i}" for i in range(60))
    flow = chain(
        jobs.turn.s("Recorder", "wf", messages=[directive(label="slow", text=text, delay_s=0.05)]),
        step(jobs, "tests.post", channel="#ops"),
    )
    fast = {**settings_env, "THINK_JOBS_LEASE_TTL_S": "1.5", "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}
    agent = jobs.get_agent(Recorder, "wf")
    with worker_processes(fast, count=1, app=APP) as [only]:
        result = flow.apply_async()
        wait_until(lambda: jobs.redis.llen(buffer_key(agent, _only_submission(agent))) > 10, 30)
        only.kill()
    with worker_processes(fast, count=1, app=APP):
        final = result.get(timeout=TIMEOUT_S)
    [reply] = [m for m in agent.get_messages() if m.role == "assistant"]
    assert final == {"channel": "#ops", "posted": message_text(reply)}
    assert message_text(reply).endswith(text)  # the partial, then its continuation
    [submission] = agent.list_submissions()
    assert submission.attempt >= 2


def _only_submission(agent: Think) -> str:
    found = agent.list_submissions()
    return found[0].submission_id if found else "none-yet"


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_aborted_turn_fails_its_step_and_stops_the_chain(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    stuck = directive(label="stuck", text="one two three", stall_after=1)
    workflow = chain(
        jobs.turn.s("Recorder", "stuck", messages=[stuck]),
        step(jobs, "tests.post", channel="#never"),
    )
    workflow.link_error(step(jobs, "tests.record_failure"))
    agent = jobs.get_agent(Recorder, "stuck")
    with workers(settings_env):
        result = workflow.apply_async()
        [submitted] = wait_until(agent.list_submissions, 20)
        running = wait_for_status(agent, submitted.submission_id, "running")
        agent.cancel_submission(running.submission_id, "operator stopped it")
        with pytest.raises(TurnFailedError) as failure:
            result.get(timeout=TIMEOUT_S)

    assert (failure.value.submission_id, failure.value.status) == (
        running.submission_id,
        "aborted",
    )
    assert str(failure.value) == (
        f"turn of Recorder:stuck (submission {running.submission_id}) ended aborted: "
        "operator stopped it"
    )
    [recorded] = read_list(jobs, failures_key(jobs))
    assert (recorded["type"], recorded["message"]) == ("TurnFailedError", str(failure.value))
    assert read_list(jobs, posted_key(jobs)) == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_closing_think_jobs_closes_the_connections_a_result_wait_opened(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    """``AsyncResult.get()`` subscribes through the app's result backend; ``close()`` closes
    it (left open, it went with the garbage collector, sometimes as "unclosed socket")."""
    redis_port = int(settings_env["THINK_JOBS_REDIS_URL"].rsplit(":", 1)[1].split("/")[0])
    # The broker's connection pool is kombu's, one per process and broker: opened first.
    jobs.celery.send_task("tests.fetch", args=["warm-up"], queue=jobs.settings.queue)
    gc.collect()
    before = connections_to(redis_port)
    with workers(settings_env):
        fetched = step(jobs, "tests.fetch", "sales").apply_async().get(timeout=TIMEOUT_S)
    assert fetched == {"source": "sales", "values": [3, 1, 2]}
    assert connections_to(redis_port) > before
    jobs.close()
    assert connections_to(redis_port) <= before


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_failed_turn_fails_the_step_with_its_error(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    broken = directive(label="broken", text="partial", error="model exploded")
    workflow = chain(
        jobs.turn.s("Recorder", "broken", messages=[broken]),
        step(jobs, "tests.post", channel="#never"),
    )
    with workers(settings_env), pytest.raises(TurnFailedError) as failure:
        workflow.apply_async().get(timeout=TIMEOUT_S)

    assert failure.value.status == "error"
    assert str(failure.value).endswith("ended error: model exploded")
    assert read_list(jobs, posted_key(jobs)) == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_celery_retry_of_a_failed_turn_submits_a_new_attempt(
    jobs: ThinkJobs, settings_env: dict[str, str]
) -> None:
    """``autoretry_for=(TurnFailedError,)`` configured for think_jobs.turn (task_annotations):
    the first turn errors, the retry is a new submission, the chain finishes. Polls do not use
    up ``max_retries``."""
    turn_id = new_id("flaky")
    workflow = chain(
        jobs.turn.s("Flaky", "flaky", messages="ping").set(task_id=turn_id),
        step(jobs, "tests.post", channel="#ops"),
    )
    with workers(settings_env, TJ_TEST_TURN_RETRIES="1"):
        final = workflow.apply_async().get(timeout=TIMEOUT_S)

    assert final == {"channel": "#ops", "posted": "echo: ping"}
    attempts = sorted(jobs.get_agent(Flaky, "flaky").list_submissions(), key=lambda s: s.created_at)
    assert [(s.idempotency_key, s.status, s.error) for s in attempts] == [
        (f"think-workflow:{turn_id}", "error", "flaky model failed"),
        (f"think-workflow:{turn_id}:retry-1", "completed", None),
    ]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_step_waits_out_a_database_outage_then_submits_once(
    make_jobs: Callable[..., ThinkJobs], settings_env: dict[str, str]
) -> None:
    with private_postgres() as server:
        jobs = make_jobs(database_url=server.url)
        jobs.migrate()
        workflow = chain(
            jobs.turn.s("Echo", "patient", messages="still there?", poll_interval_s=0.2),
            step(jobs, "tests.post", channel="#ops"),
        )
        with workers(settings_env, THINK_JOBS_DATABASE_URL=server.url) as processes:
            server.stop()
            result = workflow.apply_async()
            wait_until(lambda: turn_step_polls(processes) >= 3, 30)
            server.start()
            final = result.get(timeout=TIMEOUT_S)
        [submission] = jobs.get_agent(Echo, "patient").list_submissions()

    assert final == {"channel": "#ops", "posted": "echo: still there?"}
    assert submission.status == "completed"


def turn_step_polls(processes: list[WorkerProcess]) -> int:
    """How many times the workers logged a think_jobs.turn step re-scheduling itself."""
    lines = [line for process in processes for line in list(process.output)]
    return sum("think_jobs.turn[" in line and " retry: " in line for line in lines)


# -- arguments (no worker needed) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (("Support", "a"), {}, (None, "Support", "a")),
        (("prev", "Support", "a"), {}, ("prev", "Support", "a")),
        (("prev",), {"agent_type": "Support", "agent_name": "a"}, ("prev", "Support", "a")),
        (("Support",), {"agent_name": "a"}, (None, "Support", "a")),
    ],
)
def test_positional_arguments_are_previous_then_agent(
    args: tuple[Any, ...], kwargs: dict[str, Any], expected: tuple[Any, str, str]
) -> None:
    parsed = parse_step(args, kwargs)
    assert (parsed.previous, parsed.agent_type, parsed.agent_name) == expected


@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        (("Support",), {}, "takes ([previous,] agent_type, agent_name)"),
        (("a", "b", "c", "d"), {}, "takes ([previous,] agent_type, agent_name)"),
        (("Support", "a"), {"colour": "red"}, "unexpected keyword argument 'colour'"),
        (("Support", "a"), {"messages": "x", "prompt": "y"}, "not both"),
        (("Support", ""), {}, "agent_name must be a non-empty string"),
        (("Support", "a"), {"poll_interval_s": 0}, "poll_interval_s must be a positive"),
    ],
)
def test_bad_arguments_are_refused(
    args: tuple[Any, ...], kwargs: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(fragment)):
        parse_step(args, kwargs)


def test_previous_results_are_rendered_as_one_user_message() -> None:
    result = {"submission_id": "s", "status": "completed", "text": "hi", "message": None}
    labelled = {**result, "agent_type": "Echo", "agent_name": "a"}
    assert render("plain") == "plain"
    assert render(result) == "hi"
    assert render([labelled, "raw", {"b": 1, "a": 2}]) == '[Echo:a]\nhi\n\nraw\n\n{"a": 2, "b": 1}'
    [message] = step_messages(parse_step(({"x": 1}, "Echo", "a"), {"prompt": "Look:"}))
    assert isinstance(message, UIMessage)
    assert message_text(message) == 'Look:\n\n{"x": 1}'
    with pytest.raises(InvalidInputError, match="nothing to send"):
        step_messages(parse_step(("Echo", "a"), {}))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_step_outside_a_worker_is_refused(jobs: ThinkJobs) -> None:
    with pytest.raises(ConfigurationError, match="run it on a worker"):
        jobs.turn("Echo", "a", messages="hi")
    with pytest.raises(ConfigurationError, match="run it on a worker"):
        jobs.turn.apply(("Echo", "a"), {"messages": "hi"}).get()
