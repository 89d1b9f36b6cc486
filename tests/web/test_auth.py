"""Who may do what, on every route: no token, wrong token, read token, full token; sessions,
CSRF, cookie flags, security headers, and tokens never appearing in logs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.apps.agents import Recorder
from tests.support.builders import user
from tests.web.conftest import TEST_CONFIG
from tests.web.support import (
    FULL,
    FULL_TOKEN,
    READ,
    READ_TOKEN,
    SECRET_KEY,
    WEBHOOK_SECRET,
    csrf_from,
    log_in,
)
from think_jobs import ThinkJobs
from web import auth, create_app

PARAMS = {
    "agent_type": "Recorder",
    "agent_name": "a",
    "submission_id": "s-1",
    "request_id": "s-1",
    "task_id": "t",
    "approval_id": "ap-1",
    "decision": "approve",
    "filename": "style.css",
}
WRONG = {"Authorization": "Bearer not-a-token"}


@dataclass(frozen=True)
class Route:
    endpoint: str
    method: str
    url: str
    scope: str

    @property
    def html(self) -> bool:
        return self.endpoint.startswith("think_jobs_admin.")


def routes(app: Flask) -> Iterator[Route]:
    for rule in app.url_map.iter_rules():
        if rule.endpoint.endswith(".static"):
            continue  # the admin's CSS and JS
        scope = auth.scope_of(app.view_functions[rule.endpoint])
        assert scope is not None, f"{rule.endpoint} declares no auth scope"
        url = rule.rule
        for name in rule.arguments:
            url = url.replace(f"<{name}>", PARAMS[name])
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            yield Route(rule.endpoint, method, url, scope)


def call(client: FlaskClient, route: Route, headers: dict[str, str] | None = None) -> TestResponse:
    return client.open(route.url, method=route.method, headers=headers or {})


@pytest.fixture
def seeded(web_jobs: ThinkJobs) -> ThinkJobs:
    web_jobs.get_agent(Recorder, "a").submit_messages([user("x")], submission_id="s-1")
    return web_jobs


def test_every_route_declares_a_scope_and_all_are_covered(app: Flask) -> None:
    found = {(r.endpoint, r.method): r.scope for r in routes(app)}
    assert found[("think_jobs_api_submissions.submit", "POST")] == auth.WRITE
    assert found[("think_jobs_api_streams.stream", "GET")] == auth.READ
    assert found[("think_jobs_webhooks.receive", "POST")] == auth.SIGNED
    assert found[("think_jobs_health.healthz", "GET")] == auth.PUBLIC
    assert len(found) >= 25


def test_no_token_wrong_token_and_malformed_headers_are_401(app: Flask, seeded: ThinkJobs) -> None:
    client = app.test_client()
    for route in routes(app):
        if route.scope not in (auth.READ, auth.WRITE):
            continue
        for headers in (
            None,
            WRONG,
            {"Authorization": "Basic dXNlcjpwYXNz"},
            {"Authorization": "Bearer "},
        ):
            response = call(client, route, headers)
            if route.html and route.method == "GET":  # a page: go and log in
                assert response.status_code == 302, route
                assert "/admin/login?next=" in response.headers["Location"]
                continue
            assert response.status_code == 401, (route, headers)
            if not route.html:
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                assert response.json["error"]["type"] in ("unauthorized", "invalid_token")  # type: ignore[index]


def test_read_token_reads_but_may_not_write(app: Flask, seeded: ThinkJobs) -> None:
    client = app.test_client()
    for route in routes(app):
        if route.scope == auth.READ:
            status = call(client, route, READ).status_code
            assert status not in (401, 403) and status < 500, (route, status)
        elif route.scope == auth.WRITE:
            response = call(client, route, READ)
            assert response.status_code == 403, route
            if not route.html:
                assert response.json["error"]["type"] == "forbidden"  # type: ignore[index]


def test_full_token_may_do_everything(app: Flask, seeded: ThinkJobs) -> None:
    client = app.test_client()
    for route in routes(app):
        if route.scope in (auth.READ, auth.WRITE):
            status = call(client, route, FULL).status_code
            assert status not in (401, 403) and status < 500, (route, status)


def test_public_and_signed_routes(app: Flask, seeded: ThinkJobs) -> None:
    client = app.test_client()
    for route in routes(app):
        if route.scope == auth.PUBLIC and route.method == "GET":
            assert call(client, route).status_code in (200, 302), route
        if route.scope == auth.SIGNED:
            assert call(client, route, FULL).status_code == 401  # a bearer token is no signature


def test_admin_session_matrix(app: Flask, seeded: ThinkJobs) -> None:
    reader, operator = app.test_client(), app.test_client()
    assert log_in(reader, READ_TOKEN).status_code == 302
    assert log_in(operator, FULL_TOKEN).status_code == 302
    page = reader.get("/admin/agents/Recorder/a/").get_data(as_text=True)
    assert "s-1" in page and ">Cancel<" not in page and ">Delete<" not in page
    page = operator.get("/admin/agents/Recorder/a/").get_data(as_text=True)
    assert ">Cancel<" in page
    cancel = "/admin/agents/Recorder/a/requests/s-1/cancel"
    denied = reader.post(cancel, data={"csrf_token": csrf_from(page)})
    assert denied.status_code == 403
    done = operator.post(cancel, data={"csrf_token": csrf_from(page)})
    assert done.status_code == 302
    inspected = seeded.get_agent(Recorder, "a").inspect_submission("s-1")
    assert inspected is not None and inspected.status == "aborted"


def test_wrong_login_token_is_401_and_not_echoed(app: Flask) -> None:
    client = app.test_client()
    response = log_in(client, "guess-" + FULL_TOKEN[:10])
    assert response.status_code == 401
    assert FULL_TOKEN[:10] not in response.get_data(as_text=True)
    assert client.get("/admin/").status_code == 302


def test_csrf_is_required_for_every_session_change(app: Flask, seeded: ThinkJobs) -> None:
    client = app.test_client()
    assert client.post("/admin/login", data={"token": FULL_TOKEN}).status_code == 403
    log_in(client, FULL_TOKEN)
    token = csrf_from(client.get("/admin/").get_data(as_text=True))
    cancel = "/admin/agents/Recorder/a/requests/s-1/cancel"
    # The next-to-last character: the last one of the base64 signature carries only 4 bits,
    # so changing it between A, B, C and D decodes to the same signature (a valid token).
    altered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    for data in ({}, {"csrf_token": "forged"}, {"csrf_token": altered}):
        response = client.post(cancel, data=data)
        assert response.status_code == 403
        assert "CSRF" in response.get_data(as_text=True)
    api_cancel = "/api/agents/Recorder/a/submissions/s-1/cancel"
    refused = client.post(api_cancel)  # the session cookie alone cannot change anything
    assert refused.status_code == 403 and refused.json["error"]["type"] == "csrf_failed"  # type: ignore[index]
    assert client.post(api_cancel, headers={"X-CSRF-Token": token}).status_code == 200
    other = app.test_client()
    log_in(other, FULL_TOKEN)  # another session's token is worthless here
    assert other.post(cancel, data={"csrf_token": token}).status_code == 403
    assert client.post(cancel, data={"csrf_token": token}).status_code == 302


def test_logout_ends_the_session(app: Flask) -> None:
    client = app.test_client()
    log_in(client, READ_TOKEN)
    token = csrf_from(client.get("/admin/").get_data(as_text=True))
    assert client.post("/admin/logout", data={"csrf_token": token}).status_code == 302
    assert client.get("/admin/").status_code == 302


def test_session_cookie_flags_and_security_headers(app: Flask) -> None:
    client = app.test_client()
    response = log_in(client, FULL_TOKEN)
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" in cookie
    assert FULL_TOKEN not in cookie
    for url in ("/admin/", "/api/agents", "/healthz", "/api/openapi.json"):
        found = client.get(url, headers=FULL).headers
        assert found["X-Content-Type-Options"] == "nosniff"
        assert found["X-Frame-Options"] == "DENY"
        assert found["Referrer-Policy"] == "same-origin"
        assert "frame-ancestors 'none'" in found["Content-Security-Policy"]
        assert "unsafe-inline" not in found["Content-Security-Policy"]


def test_removing_a_token_ends_its_sessions(make_jobs: Callable[..., ThinkJobs]) -> None:
    before = create_app(
        make_jobs(api_tokens=FULL_TOKEN, secret_key=SECRET_KEY), TEST_CONFIG
    ).test_client()
    log_in(before, FULL_TOKEN)
    after_app = create_app(
        make_jobs(api_tokens="rotated-token", secret_key=SECRET_KEY), TEST_CONFIG
    )
    after = after_app.test_client()
    cookie = before.get_cookie("think_jobs_session")
    assert cookie is not None
    after.set_cookie("think_jobs_session", cookie.value)
    assert after.get("/admin/").status_code == 302
    assert after.get("/api/agents").status_code == 401


def test_no_tokens_configured_refuses_everything(make_jobs: Callable[..., ThinkJobs]) -> None:
    client = create_app(make_jobs(secret_key=SECRET_KEY), TEST_CONFIG).test_client()
    assert client.get("/api/agents").status_code == 401
    assert client.get("/api/agents", headers={"Authorization": "Bearer "}).status_code == 401


def test_auth_disabled_only_by_the_explicit_setting(make_jobs: Callable[..., ThinkJobs]) -> None:
    jobs = make_jobs(secret_key=SECRET_KEY, auth_disabled=True)
    jobs.register(Recorder)
    client = create_app(jobs, TEST_CONFIG).test_client()
    assert client.get("/api/agents").status_code == 200
    submitted = client.post("/api/agents/Recorder/a/submissions", json={"messages": [user("x")]})
    assert submitted.status_code == 202


def test_tokens_and_secrets_never_reach_the_logs(
    app: Flask, seeded: ThinkJobs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = app.test_client()
    for route in routes(app):
        for headers in (None, WRONG, READ, FULL):
            call(client, route, headers)
    log_in(client, FULL_TOKEN)
    log_in(client, "wrong-" + READ_TOKEN)
    for secret in (FULL_TOKEN, READ_TOKEN, SECRET_KEY, WEBHOOK_SECRET, "not-a-token"):
        assert secret not in caplog.text
