"""Issue 10: metrics move as expected, /metrics parses, labels never carry ids, logs carry the
transition fields and no message content."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tests.apps.agents import Recorder
from tests.support.builders import directive, wait_for_status, wait_until
from tests.support.processes import free_port
from think_jobs import ThinkJobs
from think_jobs.observe.logs import JsonFormatter
from think_jobs.observe.metrics import exposition, start_metrics_server
from think_jobs.testing import worker

SECRET = "my card number is 4111-1111"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_metrics_move_for_a_scripted_run(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "metrics")
    kind = {"agent_type": "Recorder"}
    before = {
        "accepted": sample("think_jobs_submissions_total", **kind, outcome="accepted"),
        "duplicate": sample("think_jobs_submissions_total", **kind, outcome="duplicate"),
        "completed": sample("think_jobs_turns_finished_total", **kind, status="completed"),
        "error": sample("think_jobs_turns_finished_total", **kind, status="error"),
        "aborted": sample("think_jobs_turns_finished_total", **kind, status="aborted"),
        "waits": sample("think_jobs_queue_wait_seconds_count", **kind),
        "chunks": sample("think_jobs_chunks_published_total", **kind),
    }
    ok = agent.submit_messages([directive(label="ok", text="fine")], idempotency_key="k")
    agent.submit_messages([directive(label="ok", text="fine")], idempotency_key="k")
    bad = agent.submit_messages([directive(label="bad", error="nope")])
    slow = agent.submit_messages([directive(label="slow", text="a b c d e f g h", delay_s=0.2)])
    with worker(jobs):
        wait_for_status(agent, slow.submission_id, "running")
        agent.cancel_submission(slow.submission_id, "enough")
        for item in (ok, bad, slow):
            wait_for_status(agent, item.submission_id, "completed", "error", "aborted")
        # a cancel writes "aborted" at once; the executor counts the turn when it has stopped
        finished = ("think_jobs_turns_finished_total", "aborted")
        wait_until(lambda: sample(finished[0], **kind, status=finished[1]) > before["aborted"])

    def delta(key: str, value: float) -> float:
        return value - before[key]

    assert (
        delta("accepted", sample("think_jobs_submissions_total", **kind, outcome="accepted")) == 3
    )
    assert (
        delta("duplicate", sample("think_jobs_submissions_total", **kind, outcome="duplicate")) == 1
    )
    assert (
        delta("completed", sample("think_jobs_turns_finished_total", **kind, status="completed"))
        == 1
    )
    assert delta("error", sample("think_jobs_turns_finished_total", **kind, status="error")) == 1
    assert (
        delta("aborted", sample("think_jobs_turns_finished_total", **kind, status="aborted")) == 1
    )
    assert delta("waits", sample("think_jobs_queue_wait_seconds_count", **kind)) == 3
    assert delta("chunks", sample("think_jobs_chunks_published_total", **kind)) >= 10


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_exposition_parses_and_labels_never_carry_ids(jobs: ThinkJobs) -> None:
    agent = jobs.get_agent(Recorder, "labels")
    done = agent.submit_messages([directive(label="x")])
    queued = agent.submit_messages([directive(label="y")])
    agent.cancel_submission(queued.submission_id)
    waiting = agent.submit_messages([directive(label="z")])
    with worker(jobs):
        wait_for_status(agent, done.submission_id, "completed")
        agent.cancel_submission(waiting.submission_id)
    agent.submit_messages([directive(label="pending")])
    families = {f.name: f for f in text_string_to_metric_families(exposition(jobs).decode())}
    assert {
        "think_jobs_submissions",
        "think_jobs_pending_turns",
        "think_jobs_turn_duration_seconds",
    } <= set(families)
    pending = {
        s.labels["agent_type"]: s.value for s in families["think_jobs_pending_turns"].samples
    }
    assert pending == {"Recorder": 1.0}
    identifiers = {done.submission_id, queued.submission_id, waiting.submission_id, "labels"}
    ours = [family for name, family in families.items() if name.startswith("think_jobs_")]
    assert len(ours) >= 10
    for family in ours:
        for sample_ in family.samples:
            assert not identifiers & set(sample_.labels.values()), sample_
            assert set(sample_.labels) <= {"agent_type", "status", "outcome", "kind", "le"}


def test_worker_metrics_endpoint_serves_the_text_format(jobs: ThinkJobs) -> None:
    port = free_port()
    start_metrics_server(jobs, port, host="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert "think_jobs_pending_turns" in names and "think_jobs_turns_finished" in names


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_logs_of_a_failing_turn_carry_fields_and_no_content(
    jobs: ThinkJobs, caplog: pytest.LogCaptureFixture
) -> None:
    agent = jobs.get_agent(Recorder, "logs")
    caplog.set_level(logging.DEBUG, logger="think_jobs")
    failing = agent.submit_messages([directive(label="x", text=SECRET, error="model failed")])
    with worker(jobs):
        wait_for_status(agent, failing.submission_id, "error")
    finished = [r for r in caplog.records if r.getMessage() == "turn finished"]
    assert len(finished) == 1
    record = vars(finished[0])
    assert record["status"] == "error" and record["attempt"] == 1
    assert (record["agent_type"], record["agent_name"]) == ("Recorder", "logs")
    assert record["submission_id"] == record["request_id"] == failing.submission_id
    assert record["duration_s"] >= 0
    for entry in caplog.records:
        assert SECRET not in JsonFormatter().format(entry)
    line = json.loads(JsonFormatter().format(finished[0]))
    assert line["message"] == "turn finished" and line["submission_id"] == failing.submission_id
