"""Fixtures of the web tests: a ThinkJobs with tokens and a webhook secret on this test's real
database and Redis, the standalone app built on it, and a Flask test client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.apps.agents import Recorder, Support
from tests.web.support import FULL_TOKEN, READ_TOKEN, SECRET_KEY, WEBHOOK_SECRET, served
from think_jobs import ThinkJobs
from web import create_app

if TYPE_CHECKING:
    from playwright.sync_api import Browser

TEST_CONFIG = {
    "TESTING": True,
    "THINK_JOBS_SSE_HEARTBEAT_S": 0.5,
    "THINK_JOBS_SSE_MAX_DURATION_S": 30.0,
}
CHROMIUM = "/usr/bin/chromium"  # Debian's build; scripts/ensure-services installs it
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def web_jobs(make_jobs: Callable[..., ThinkJobs]) -> ThinkJobs:
    jobs = make_jobs(
        api_tokens=FULL_TOKEN,
        read_tokens=READ_TOKEN,
        webhook_secret=WEBHOOK_SECRET,
        secret_key=SECRET_KEY,
    )
    jobs.register(Recorder)
    jobs.register(Support)
    return jobs


@pytest.fixture
def app(web_jobs: ThinkJobs) -> Flask:
    return create_app(web_jobs, TEST_CONFIG)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def base_url(app: Flask) -> Iterator[str]:
    """``app`` served over real HTTP on a free loopback port (threaded, as in production)."""
    app.testing = False
    with served(app) as url:
        yield url


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Headless chromium driven by Playwright."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian's build)")
    with sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield found
        found.close()
