"""Issue 10: ``/metrics`` on the web app. Who may scrape it, that it parses with Prometheus' own
text parser, that the think_jobs_* families move with real turns made through the API and run
by a real worker, and that no label ever carries an agent name or a submission id."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.builders import directive, wait_for_status
from tests.web.conftest import TEST_CONFIG
from tests.web.host_app import PREFIX, create_host_app
from tests.web.support import FULL, READ, READ_TOKEN, log_in
from think_jobs import ThinkJobs
from think_jobs.testing import worker
from web import ThinkJobsFlask, create_app

TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
LABELS = {"agent_type", "status", "outcome", "kind", "le"}


def scrape(client: FlaskClient, headers: dict[str, str] | None = None) -> dict[str, list[Sample]]:
    response = client.get("/metrics", headers=headers or {})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Content-Type"] == TEXT_FORMAT
    families = text_string_to_metric_families(response.get_data(as_text=True))
    return {family.name: family.samples for family in families}


def submit(client: FlaskClient, name: str, **spec: Any) -> str:
    response = client.post(
        f"/api/agents/Recorder/{name}/submissions",
        headers=FULL,
        json={"messages": [directive(**spec)]},
    )
    assert response.status_code == 202
    return str(response.json["submission_id"])  # type: ignore[index]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_who_may_scrape(app: Flask, web_jobs: ThinkJobs) -> None:
    client = app.test_client()
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused.json is not None
    assert refused.json["error"]["type"] == "unauthorized"
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert "think_jobs_pending_turns" in scrape(client, READ)
    assert "think_jobs_pending_turns" in scrape(client, FULL)
    session = app.test_client()
    log_in(session, READ_TOKEN)
    assert "think_jobs_running_turns" in scrape(session)  # an admin session reads too


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_public_flag_allows_anonymous_scrapes(
    web_jobs: ThinkJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    public = create_app(web_jobs, {**TEST_CONFIG, "THINK_JOBS_METRICS_PUBLIC": True})
    assert "think_jobs_pending_turns" in scrape(public.test_client())
    monkeypatch.setenv("FLASK_THINK_JOBS_METRICS_PUBLIC", "true")  # as deployments set it
    assert "think_jobs_pending_turns" in scrape(create_app(web_jobs, TEST_CONFIG).test_client())
    assert public.test_client().get("/api/agents").status_code == 401  # only /metrics opens


@pytest.mark.parametrize("backend", ["sqlite"])
def test_embedded_mounts_follow_the_prefix_and_the_host_rules(web_jobs: ThinkJobs) -> None:
    host = create_host_app(web_jobs)
    anonymous = host.test_client()
    assert anonymous.get(f"{PREFIX}/metrics").status_code == 401
    assert anonymous.post("/login", data={"user": "bob"}).status_code == 302
    assert anonymous.get(f"{PREFIX}/metrics").status_code == 200
    without = Flask("host")
    ThinkJobsFlask(without, jobs=web_jobs, mounts={"api": "/api"})
    assert without.test_client().get("/metrics", headers=READ).status_code == 404


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_families_parse_move_and_carry_no_ids(app: Flask, web_jobs: ThinkJobs) -> None:
    client = app.test_client()
    before = scrape(client, READ)
    names = ("customer-7731", "customer-7732")
    made = [(name, submit(client, name, label="ok", text="fine")) for name in names]
    made.append((names[0], submit(client, names[0], label="bad", error="model failed")))
    with worker(web_jobs):
        for name, submission_id in made:
            agent = web_jobs.get_agent("Recorder", name)
            wait_for_status(agent, submission_id, "completed", "error")
    waiting = submit(client, names[1], label="later")
    after = scrape(client, READ)
    assert value(after, "think_jobs_pending_turns", agent_type="Recorder") == 1
    assert grew(before, after, "think_jobs_submissions_total", outcome="accepted") == 4
    assert grew(before, after, "think_jobs_turns_finished_total", status="completed") == 2
    assert grew(before, after, "think_jobs_turns_finished_total", status="error") == 1
    assert grew(before, after, "think_jobs_turn_duration_seconds_count") == 3
    ours = {name: samples for name, samples in after.items() if name.startswith("think_jobs_")}
    assert len(ours) >= 10
    identifiers = {*names, waiting, *(submission_id for _, submission_id in made)}
    for samples in ours.values():
        for found in samples:
            assert set(found.labels) <= LABELS, found
            assert not identifiers & set(found.labels.values()), found


def value(families: dict[str, list[Sample]], sample: str, **labels: str) -> float:
    """The sum of ``sample`` over the samples whose labels include ``labels`` (Recorder's)."""
    wanted = {"agent_type": "Recorder", **labels}
    return sum(
        s.value
        for samples in families.values()
        for s in samples
        if s.name == sample and wanted.items() <= s.labels.items()
    )


def grew(
    before: dict[str, list[Sample]], after: dict[str, list[Sample]], sample: str, **labels: str
) -> float:
    return value(after, sample, **labels) - value(before, sample, **labels)
