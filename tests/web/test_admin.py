"""Admin pages: agents, submissions (filter, pages, cancel, delete), the detail page, schedules.
Everything here works without JavaScript; the browser test covers the live part."""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.apps.agents import Recorder
from tests.support.builders import directive, user, wait_for_status
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL_TOKEN, READ_TOKEN, csrf_from, log_in
from think_jobs import ScheduledTask, Think, ThinkJobs
from think_jobs.models import ScriptedModel
from think_jobs.testing import worker
from web import create_app

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])
AGENT_PAGE = "/admin/agents/Recorder/a/"


class Planner(Think):
    def get_model(self) -> ScriptedModel:
        return ScriptedModel("Digest: all quiet.")

    def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
        return {"digest": ScheduledTask("every day at 09:00 in Europe/Paris", prompt="digest")}


@pytest.fixture
def operator(app: Flask) -> FlaskClient:
    client = app.test_client()
    log_in(client, FULL_TOKEN)
    return client


def rows(page: str) -> list[str]:
    return re.findall(r'class="tj-mono" href="[^"]+">([^<]+)</a>', page)


def test_agents_overview_and_open_form(operator: FlaskClient, web_jobs: ThinkJobs) -> None:
    agent = web_jobs.get_agent(Recorder, "support-7")
    agent.submit_messages([user("x")])
    page = operator.get("/admin/").get_data(as_text=True)
    assert "support-7" in page and '<td class="tj-num">1</td>' in page
    assert "<option>Recorder</option>" in page and "<option>Support</option>" in page
    opened = operator.get(
        "/admin/open", query_string={"agent_type": "Recorder", "agent_name": "new one"}
    )
    assert opened.status_code == 302
    assert opened.headers["Location"] == "/admin/agents/Recorder/new%20one/"
    assert operator.get("/admin/open?agent_type=Nope&agent_name=x").status_code == 404


def test_submissions_filter_and_pages(web_jobs: ThinkJobs) -> None:
    client = create_app(web_jobs, {**TEST_CONFIG, "THINK_JOBS_ADMIN_PAGE_SIZE": 2}).test_client()
    log_in(client, READ_TOKEN)
    agent = web_jobs.get_agent(Recorder, "a")
    for i in range(5):
        agent.submit_messages([user(str(i))], submission_id=f"s-{i}")
    agent.cancel_submission("s-1")
    first = client.get(AGENT_PAGE).get_data(as_text=True)
    assert rows(first) == ["s-4", "s-3"] and "older →" in first and "← newest" not in first
    second = client.get(AGENT_PAGE, query_string={"before": "s-3"}).get_data(as_text=True)
    assert rows(second) == ["s-2", "s-1"] and "before=s-1" in second and "← newest" in second
    last = client.get(AGENT_PAGE, query_string={"before": "s-1"}).get_data(as_text=True)
    assert rows(last) == ["s-0"] and "older →" not in last and "← newest" in last
    filtered = client.get(AGENT_PAGE, query_string={"status": "aborted"}).get_data(as_text=True)
    assert rows(filtered) == ["s-1"] and 'value="aborted" checked' in filtered
    both = client.get(AGENT_PAGE + "?status=aborted&status=pending&before=s-3")
    assert rows(both.get_data(as_text=True)) == ["s-2", "s-1"]
    assert "status=aborted&amp;status=pending&amp;before=s-1" in both.get_data(as_text=True)
    assert client.get(AGENT_PAGE + "?before=nope").status_code == 404
    assert client.get(AGENT_PAGE + "?before=%00").status_code == 400
    assert client.get(AGENT_PAGE + "?status=bogus").status_code == 400


def test_cancel_and_delete_buttons(operator: FlaskClient, web_jobs: ThinkJobs) -> None:
    agent = web_jobs.get_agent(Recorder, "a")
    agent.submit_messages([user("x")], submission_id="s-1")
    page = operator.get(AGENT_PAGE).get_data(as_text=True)
    token = csrf_from(page)
    cancel = "/admin/agents/Recorder/a/requests/s-1/cancel"
    assert f'action="{cancel}"' in page
    response = operator.post(cancel, data={"csrf_token": token, "next": AGENT_PAGE})
    assert response.status_code == 302 and response.headers["Location"] == AGENT_PAGE
    page = operator.get(AGENT_PAGE).get_data(as_text=True)
    assert "Cancel requested for s-1." in page and "tj-status-aborted" in page
    delete = "/admin/agents/Recorder/a/submissions/s-1/delete"
    assert f'action="{delete}"' in page
    assert operator.post(delete, data={"csrf_token": token}).status_code == 302
    assert agent.inspect_submission("s-1") is None
    assert "Deleted submission s-1." in operator.get(AGENT_PAGE).get_data(as_text=True)


def test_redirect_targets_stay_on_this_site(operator: FlaskClient, web_jobs: ThinkJobs) -> None:
    web_jobs.get_agent(Recorder, "a").submit_messages([user("x")], submission_id="s-1")
    token = csrf_from(operator.get(AGENT_PAGE).get_data(as_text=True))
    cancel = "/admin/agents/Recorder/a/requests/s-1/cancel"
    for evil in ("https://evil.example/", "//evil.example/", "/\\evil.example", "/\t/evil.example"):
        response = operator.post(cancel, data={"csrf_token": token, "next": evil})
        assert response.headers["Location"] == "/admin/agents/Recorder/a/requests/s-1"
    anonymous = create_app(web_jobs, TEST_CONFIG).test_client()
    page = anonymous.get("/admin/login?next=//evil.example/").get_data(as_text=True)
    assert "evil.example" not in page


def test_detail_page_of_a_finished_turn_renders_without_javascript(
    operator: FlaskClient, web_jobs: ThinkJobs
) -> None:
    agent = web_jobs.get_agent(Recorder, "a")
    result = agent.submit_messages(
        [directive(label="d", text="<b>bold</b> reply")], metadata={"ticket": 42}
    )
    with worker(web_jobs):
        wait_for_status(agent, result.submission_id, "completed")
    page = operator.get(f"/admin/agents/Recorder/a/requests/{result.submission_id}")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "&lt;b&gt;bold&lt;/b&gt; reply" in html  # escaped, never markup
    assert "tj-status-completed" in html and "ticket" in html
    assert "data-stream-url" not in html  # nothing left to follow
    assert ">Delete<" in html


def test_detail_page_of_a_pending_turn_links_its_stream(
    operator: FlaskClient, web_jobs: ThinkJobs
) -> None:
    result = web_jobs.get_agent(Recorder, "a").submit_messages([user("x")])
    html = operator.get(f"/admin/agents/Recorder/a/requests/{result.submission_id}").get_data(
        as_text=True
    )
    stream = f"/api/agents/Recorder/a/requests/{result.submission_id}/stream?after_seq=-1"
    assert f'data-stream-url="{stream}"' in html
    assert ">Cancel<" in html and "stream.js" in html
    assert operator.get("/admin/agents/Recorder/a/requests/nope").status_code == 404


def test_schedules_page_lists_tasks_and_runs_one_now(
    operator: FlaskClient, web_jobs: ThinkJobs
) -> None:
    web_jobs.register(Planner)
    page = operator.get("/admin/agents/Planner/p1/schedules").get_data(as_text=True)
    assert "digest" in page and "every day at 09:00 in Europe/Paris" in page
    assert re.search(r"<time datetime=\"[0-9T:+-]+", page)  # the next run
    run = "/admin/agents/Planner/p1/schedules/digest/run"
    response = operator.post(run, data={"csrf_token": csrf_from(page)})
    assert response.status_code == 302
    submitted = web_jobs.get_agent(Planner, "p1").list_submissions()
    assert len(submitted) == 1 and submitted[0].metadata["task_id"] == "digest"  # type: ignore[index]
    assert response.headers["Location"].endswith(f"/requests/{submitted[0].request_id}")
    missing = operator.post(
        "/admin/agents/Planner/p1/schedules/nope/run", data={"csrf_token": csrf_from(page)}
    )
    assert missing.status_code == 404


def test_error_pages_are_html(operator: FlaskClient) -> None:
    response = operator.get("/admin/agents/Nope/a/")
    assert response.status_code == 404 and response.mimetype == "text/html"
    assert "agent not registered" in response.get_data(as_text=True)
