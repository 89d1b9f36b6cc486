"""Issue 8: think-jobs inside an existing Flask app: prefix, the host's login, the host's base
template, SSE through the prefix, custom mounts, ProxyFix, and the standalone wrapper."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from flask import Flask, Request
from flask.testing import FlaskClient

from tests.apps.agents import Recorder
from tests.support.builders import directive, user
from tests.web import host_app
from tests.web.conftest import TEST_CONFIG
from tests.web.host_app import PREFIX, create_host_app
from tests.web.support import FULL, csrf_from, read_all, stream_text
from think_jobs import ThinkJobs
from think_jobs.errors import ConfigurationError
from think_jobs.testing import worker
from web import ThinkJobsFlask, create_app

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])
ADMIN = f"{PREFIX}/admin"
API = f"{PREFIX}/api/agents/Recorder/a"


@pytest.fixture
def host(web_jobs: ThinkJobs) -> Flask:
    web_jobs.get_agent(Recorder, "a").submit_messages([user("x")], submission_id="s-1")
    return create_host_app(web_jobs, THINK_JOBS_SSE_HEARTBEAT_S=0.5)


def signed_in(app: Flask, name: str) -> FlaskClient:
    client = app.test_client()
    assert client.post("/login", data={"user": name}).status_code == 302
    return client


def test_the_host_keeps_its_routes_and_holds_the_extension(host: Flask) -> None:
    assert host.test_client().get("/").get_data(as_text=True) == "host home"
    assert isinstance(host.extensions["think_jobs"], ThinkJobsFlask)
    assert {r.rule for r in host.url_map.iter_rules()} >= {
        f"{ADMIN}/",
        f"{PREFIX}/api/agents",
        f"{PREFIX}/hooks/<agent_type>/<agent_name>",
        f"{PREFIX}/healthz",
        f"{ADMIN}/static/<path:filename>",
    }


def test_anonymous_visitors_go_to_the_host_login_or_get_401(host: Flask) -> None:
    client = host.test_client()
    page = client.get(f"{ADMIN}/")
    assert page.status_code == 302
    assert page.headers["Location"] == "/login?next=%2Fops%2Fagents%2Fadmin%2F"
    assert client.get(f"{ADMIN}/login").headers["Location"] == "/login"
    assert client.get(f"{API}/submissions").status_code == 401
    assert client.get(f"{API}/submissions", headers=FULL).status_code == 401  # host rules here


def test_a_viewer_reads_inside_the_host_layout_but_may_not_cancel(host: Flask) -> None:
    bob = signed_in(host, "bob")
    page = bob.get(f"{ADMIN}/agents/Recorder/a/")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert 'id="host-nav">Host App · signed in as bob' in html  # the host's base template
    assert "s-1" in html and ">Cancel<" not in html
    assert f"{ADMIN}/static/style.css" in html
    with bob.get(f"{ADMIN}/static/style.css") as stylesheet:  # a file response: close it
        assert stylesheet.status_code == 200
    refused = bob.post(f"{ADMIN}/agents/Recorder/a/requests/s-1/cancel")
    assert refused.status_code == 403  # the scope is checked before the CSRF token
    assert "does not grant the &#39;write&#39; scope" in refused.get_data(as_text=True)
    api = bob.post(f"{API}/submissions/s-1/cancel")
    assert api.status_code == 403 and api.json["error"]["type"] == "forbidden"  # type: ignore[index]
    assert bob.get(f"{API}/submissions/s-1").json["status"] == "pending"  # type: ignore[index]


def test_an_operator_cancels_with_csrf_signed_by_the_host_key(host: Flask) -> None:
    alice = signed_in(host, "alice")
    html = alice.get(f"{ADMIN}/agents/Recorder/a/").get_data(as_text=True)
    assert ">Cancel<" in html
    cancel = f"{ADMIN}/agents/Recorder/a/requests/s-1/cancel"
    assert alice.post(cancel).status_code == 403  # no CSRF token
    assert alice.post(cancel, data={"csrf_token": csrf_from(html)}).status_code == 302
    assert alice.get(f"{API}/submissions/s-1").json["status"] == "aborted"  # type: ignore[index]
    api = alice.post(f"{API}/submissions", json={"messages": [user("y")]})
    assert api.status_code == 403  # a cookie-authenticated change needs the CSRF header
    api = alice.post(
        f"{API}/submissions",
        json={"messages": [user("y")]},
        headers={"X-CSRF-Token": csrf_from(html)},
    )
    assert api.status_code == 202


def test_sse_and_openapi_through_the_prefix(host: Flask, web_jobs: ThinkJobs) -> None:
    agent = web_jobs.get_agent(Recorder, "a")
    result = agent.submit_messages([directive(label="p", text="through the prefix")])
    alice = signed_in(host, "alice")
    detail = alice.get(f"{ADMIN}/agents/Recorder/a/requests/{result.submission_id}")
    stream_url = f"{API}/requests/{result.submission_id}/stream?after_seq=-1"
    assert f'data-stream-url="{stream_url}"' in detail.get_data(as_text=True)
    with worker(web_jobs):
        events = read_all(alice.get(stream_url))
    assert stream_text(events) == "through the prefix"
    assert events[-1].data == "[DONE]"
    paths = alice.get(f"{PREFIX}/api/openapi.json").json["paths"]  # type: ignore[index]
    assert f"{PREFIX}/api/agents/{{agent_type}}/{{agent_name}}/submissions" in paths


def test_init_app_later_and_choose_what_to_mount(web_jobs: ThinkJobs) -> None:
    extension = ThinkJobsFlask(jobs=web_jobs, mounts={"api": "/v1", "streams": "/v1"})
    app = Flask("host")
    app.config["SECRET_KEY"] = "k"
    extension.init_app(app)
    assert app.extensions["think_jobs"] is extension
    client = app.test_client()
    assert client.get("/v1/agents", headers=FULL).status_code == 200
    assert client.get("/admin/").status_code == 404
    assert client.post("/hooks/Recorder/a").status_code == 404
    with pytest.raises(ConfigurationError, match="unknown think-jobs blueprint groups"):
        ThinkJobsFlask(jobs=web_jobs, mounts={"admn": "/x"})


def test_create_app_is_a_thin_wrapper_that_finds_jobs_in_the_environment(
    web_jobs: ThinkJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_app, "JOBS", web_jobs)
    monkeypatch.setenv("THINK_JOBS_APP", "tests.web.host_app:JOBS")
    app = create_app(config=TEST_CONFIG)
    assert app.extensions["think_jobs"].jobs is web_jobs
    assert app.test_client().get("/api/agents", headers=FULL).status_code == 200
    monkeypatch.setenv("THINK_JOBS_APP", "tests.web.host_app:nothing")
    with pytest.raises(ConfigurationError, match="does not name a ThinkJobs object"):
        create_app(config=TEST_CONFIG)
    monkeypatch.delenv("THINK_JOBS_APP")
    with pytest.raises(ConfigurationError, match="THINK_JOBS_APP"):
        create_app(config=TEST_CONFIG)


def test_standalone_needs_a_secret_key(make_jobs: Callable[..., ThinkJobs]) -> None:
    with pytest.raises(ConfigurationError, match="THINK_JOBS_SECRET_KEY"):
        create_app(make_jobs(), TEST_CONFIG)


def test_urls_behind_a_reverse_proxy(web_jobs: ThinkJobs) -> None:
    app = create_app(web_jobs, {**TEST_CONFIG, "THINK_JOBS_PROXY_FIX": 1})
    forwarded = {
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "ops.example.org",
        "X-Forwarded-Prefix": "/tj",
        "X-Forwarded-For": "203.0.113.9",
    }
    client = app.test_client()
    response = client.get("/admin/", headers=forwarded)
    assert response.headers["Location"] == "/tj/admin/login?next=%2Ftj%2Fadmin%2F"
    assert response.headers["Strict-Transport-Security"].startswith("max-age=")  # https seen
    login = client.get("/admin/login", headers=forwarded).get_data(as_text=True)
    assert 'action="/tj/admin/login"' in login and "/tj/admin/static/style.css" in login


def _basic_ops(request: Request, scope: str) -> bool:
    """A host's ``authorize=`` behind a proxy's Basic auth: the user ``ops`` may do anything."""
    credentials = request.authorization
    return credentials is not None and credentials.type == "basic" and credentials.username == "ops"


@pytest.mark.parametrize("route", ["admin", "api"])
def test_a_host_that_accepts_basic_auth_still_needs_the_csrf_token_to_write(
    web_jobs: ThinkJobs, route: str
) -> None:
    """A browser sends cached Basic credentials by itself on a cross-site form post, as it
    sends a cookie: a forged cancel (no CSRF token) is refused, on the admin form and on the
    JSON API (whose optional body an empty form post satisfies). Before 2026-12-07 any
    ``Authorization`` header waived the check; only a bearer token does now."""
    host = Flask(__name__)
    host.config.update(SECRET_KEY="host-key", TESTING=True)
    ThinkJobsFlask(host, jobs=web_jobs, url_prefix="/ops", authorize=_basic_ops)
    agent = web_jobs.get_agent(Recorder, "basic")
    submitted = agent.submit_messages([user("hi")])
    basic = "Basic " + base64.b64encode(b"ops:pw").decode()
    path = (
        f"/ops/admin/agents/Recorder/basic/requests/{submitted.submission_id}/cancel"
        if route == "admin"
        else f"/ops/api/agents/Recorder/basic/submissions/{submitted.submission_id}/cancel"
    )
    forged = host.test_client().post(
        path,
        data=b"",
        content_type="application/x-www-form-urlencoded",
        headers={"Authorization": basic},
    )
    assert forged.status_code == 403
    found = agent.inspect_submission(submitted.submission_id)
    assert found is not None and found.status == "pending"
    read = host.test_client().get(
        f"/ops/api/agents/Recorder/basic/submissions/{submitted.submission_id}",
        headers={"Authorization": basic},
    )
    assert read.status_code == 200  # reading needs no token
