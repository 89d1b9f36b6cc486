"""Issue 15, case 9: logging out ends the admin session on the server, so a copy of the cookie
taken before stops working; an operator can log everyone out; a Redis that lost its data
logged everyone out (the safe direction)."""

from __future__ import annotations

import os
import subprocess

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.support.processes import think_jobs_command
from tests.web.support import FULL_TOKEN, READ_TOKEN, csrf_from, log_in
from think_jobs import ThinkJobs
from web import sessions

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])
COOKIE = "think_jobs_session"


def logged_in(app: Flask, token: str = FULL_TOKEN) -> FlaskClient:
    client = app.test_client()
    assert log_in(client, token).status_code == 302
    return client


def copy_of(app: Flask, client: FlaskClient) -> FlaskClient:
    """Another browser holding a copy of ``client``'s session cookie."""
    cookie = client.get_cookie(COOKIE)
    assert cookie is not None
    thief = app.test_client()
    thief.set_cookie(COOKIE, cookie.value)
    return thief


def can_read(client: FlaskClient) -> bool:
    api = client.get("/api/agents").status_code
    page = client.get("/admin/").status_code
    assert (api, page) in {(200, 200), (401, 302)}, (api, page)
    return api == 200


def test_case_9_a_cookie_copied_before_logout_stops_working(app: Flask) -> None:
    client = logged_in(app)
    copy = copy_of(app, client)
    assert can_read(copy)
    token = csrf_from(client.get("/admin/").get_data(as_text=True))
    assert client.post("/admin/logout", data={"csrf_token": token}).status_code == 302
    assert not can_read(client)
    assert not can_read(copy)


def test_logging_in_again_starts_a_new_session_the_old_copy_stays_dead(app: Flask) -> None:
    client = logged_in(app, READ_TOKEN)
    copy = copy_of(app, client)
    token = csrf_from(client.get("/admin/").get_data(as_text=True))
    client.post("/admin/logout", data={"csrf_token": token})
    log_in(client, READ_TOKEN)
    assert can_read(client)
    assert not can_read(copy)


def test_an_operator_logs_everyone_out(app: Flask, web_jobs: ThinkJobs) -> None:
    first, second = logged_in(app), logged_in(app, READ_TOKEN)
    assert can_read(first) and can_read(second)
    assert sessions.end_all(web_jobs) == 2
    assert not can_read(first)
    assert not can_read(second)
    assert can_read(logged_in(app))


def test_the_web_command_logs_everyone_out(app: Flask, settings_env: dict[str, str]) -> None:
    first, second = logged_in(app), logged_in(app, READ_TOKEN)
    ended = subprocess.run(
        think_jobs_command("web", "--end-sessions"),
        env={**os.environ, **settings_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.strip() == "2 admin sessions ended"
    assert not can_read(first)
    assert not can_read(second)


def test_sessions_lost_with_redis_data_mean_everyone_is_logged_out(
    app: Flask, web_jobs: ThinkJobs
) -> None:
    client = logged_in(app)
    for key in web_jobs.redis.scan_iter(match=f"{web_jobs.keys.prefix}:admin-session:*"):
        web_jobs.redis.delete(key)  # what a restart of our Redis (nothing on disk) does
    assert not can_read(client)


def test_a_session_lives_admin_session_ttl_s_after_its_last_request(
    app: Flask, web_jobs: ThinkJobs
) -> None:
    client = logged_in(app)
    (key,) = web_jobs.redis.scan_iter(match=f"{web_jobs.keys.prefix}:admin-session:*")
    web_jobs.redis.expire(key, 600)
    assert can_read(client)
    assert web_jobs.redis.ttl(key) > 600  # renewed by the request
    assert web_jobs.redis.ttl(key) <= web_jobs.settings.admin_session_ttl_s
