"""Admin fixes of issue 16: the detail page shows what the turn was asked and why a pending
one waits, the agents page pages, the dashboard names workers and waiting reasons, the queue
gauges say 0, and a login over plain HTTP says why it cannot work."""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from tests.apps.agents import Recorder
from tests.support.builders import directive, user, wait_for_status, wait_until
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL, FULL_TOKEN, READ_TOKEN, csrf_from, log_in
from think_jobs import ThinkJobs
from think_jobs.testing import worker
from web import create_app

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture
def operator(app: Flask) -> FlaskClient:
    client = app.test_client()
    log_in(client, FULL_TOKEN)
    return client


def test_the_detail_page_shows_the_messages_the_turn_answered(
    operator: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "asked")
    first = user("What is the status of ticket #9?")
    result = agent.submit_messages([first, user("And #10?")])
    with worker(web_jobs, concurrency=1):
        wait_for_status(agent, result.submission_id, "completed")
    page = operator.get(f"/admin/agents/Recorder/asked/requests/{result.submission_id}")
    text = page.get_data(as_text=True)
    asked = text[text.index('id="tj-asked"') : text.index("<h2>Reply</h2>")]
    assert "What is the status of ticket #9?" in asked and "And #10?" in asked
    assert asked.index("#9?") < asked.index("#10?")


def test_a_pending_turn_without_a_worker_says_why_on_its_page(
    operator: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "waits")
    result = agent.submit_messages([directive(label="x")])
    page = operator.get(f"/admin/agents/Recorder/waits/requests/{result.submission_id}")
    assert "pending: no live worker serves agent type Recorder" in page.get_data(as_text=True)


def test_the_agents_page_pages(web_jobs: ThinkJobs) -> None:
    client = create_app(web_jobs, {**TEST_CONFIG, "THINK_JOBS_ADMIN_PAGE_SIZE": 5}).test_client()
    log_in(client, READ_TOKEN)
    for n in range(12):
        web_jobs.get_agent(Recorder, f"agent-{n:02d}").submit_messages([user("x")])
    first = client.get("/admin/").get_data(as_text=True)
    assert "12 agents · page 1 of 3" in first
    assert len(re.findall(r">agent-\d\d</a>", first)) == 5
    assert 'href="/admin/?page=2" rel="next"' in first and 'rel="prev"' not in first
    last = client.get("/admin/?page=3").get_data(as_text=True)
    assert len(re.findall(r">agent-\d\d</a>", last)) == 2 and 'rel="next"' not in last
    assert client.get("/admin/?page=99").status_code == 200  # past the end: the last page
    for bad in ("0", "-1", "x"):
        assert client.get(f"/admin/?page={bad}").status_code == 400, bad


def test_the_dashboard_names_live_workers_and_why_a_type_waits(
    operator: FlaskClient, web_jobs: ThinkJobs, make_jobs: object
) -> None:
    agent = web_jobs.get_agent(Recorder, "dash")
    agent.submit_messages([directive(label="x")])
    page = operator.get("/admin/dashboard").get_data(as_text=True)
    assert "pending: no live worker serves agent type Recorder" in page
    assert 'id="tj-no-workers"' in page
    other = make_jobs(worker_heartbeat_interval_s=0.2)  # type: ignore[operator]
    with worker(other, concurrency=2) as controller:  # serves no agent types
        wait_until(lambda: controller.hostname in operator.get("/admin/dashboard").get_data(True))
        page = operator.get("/admin/dashboard").get_data(as_text=True)
        assert "none (started without --app?)" in page
        assert "(the live workers on queue" in page


def test_queue_gauges_say_zero_when_nothing_waits(app: Flask, web_jobs: ThinkJobs) -> None:
    text = app.test_client().get("/metrics", headers=FULL).get_data(as_text=True)
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    for name in ("think_jobs_pending_turns", "think_jobs_running_turns"):
        values = {s.labels["agent_type"]: s.value for s in families[name]}
        assert values == {"Recorder": 0.0, "Support": 0.0}, name


def test_login_over_plain_http_from_another_machine_says_why_it_fails(app: Flask) -> None:
    client = app.test_client()
    remote = "http://ops.example.net"
    page = client.get("/admin/login", base_url=remote).get_data(as_text=True)
    assert "session cookie is HTTPS-only" in page and "THINK_JOBS_SESSION_COOKIE_SECURE" in page
    browser_without_cookie = app.test_client()  # what a browser sends back: no Secure cookie
    answer = browser_without_cookie.post(
        "/admin/login",
        base_url=remote,
        data={"token": FULL_TOKEN, "csrf_token": csrf_from(page)},
    )
    assert answer.status_code == 400
    assert "THINK_JOBS_SESSION_COOKIE_SECURE=false" in answer.get_data(as_text=True)
    assert "CSRF" not in answer.get_data(as_text=True)
    over_tls = client.get("/admin/login", base_url="https://ops.example.net").get_data(True)
    assert "session cookie is HTTPS-only" not in over_tls


def test_plain_http_mode_makes_the_login_work_over_http(
    make_jobs: object,
) -> None:
    jobs: ThinkJobs = make_jobs(  # type: ignore[operator]
        api_tokens=FULL_TOKEN, secret_key="k" * 32, session_cookie_secure=False
    )
    client = create_app(jobs, TEST_CONFIG).test_client()
    remote = "http://ops.example.net"
    page = client.get("/admin/login", base_url=remote)
    assert "Secure" not in page.headers.get("Set-Cookie", "")
    assert "HTTPS-only" not in page.get_data(as_text=True)
    logged_in = client.post(
        "/admin/login",
        base_url=remote,
        data={"token": FULL_TOKEN, "csrf_token": csrf_from(page.get_data(as_text=True))},
    )
    assert logged_in.status_code == 302
