"""/healthz: database and Redis reachability, public, 200 or 503 without details."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from tests.support.processes import free_port
from tests.web.conftest import TEST_CONFIG
from tests.web.support import SECRET_KEY
from think_jobs import ThinkJobs
from web import create_app


def test_healthy(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json == {"status": "ok", "database": "ok", "redis": "ok"}


@pytest.mark.parametrize("backend", ["postgres"])
def test_database_down(make_jobs: Callable[..., ThinkJobs]) -> None:
    dead = f"postgresql+psycopg://postgres:secret-pw@127.0.0.1:{free_port()}/none"
    client = create_app(make_jobs(database_url=dead, secret_key=SECRET_KEY), TEST_CONFIG)
    response = client.test_client().get("/healthz")
    assert response.status_code == 503
    assert response.json == {"status": "unavailable", "database": "unavailable", "redis": "ok"}
    assert b"secret-pw" not in response.data


@pytest.mark.parametrize("backend", ["sqlite"])
def test_redis_down(make_jobs: Callable[..., ThinkJobs]) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = create_app(make_jobs(redis_url=dead, secret_key=SECRET_KEY), TEST_CONFIG)
    response = client.test_client().get("/healthz")
    assert response.status_code == 503
    assert response.json == {"status": "unavailable", "database": "ok", "redis": "unavailable"}
