"""The admin pages in a real browser (issue 16): a 200-character agent name does not push the
counts off a 1400-px screen, and a detail page opened mid-turn says it is streaming."""

from __future__ import annotations

import pytest
from flask import Flask
from playwright.sync_api import Browser, Page, expect

from tests.support.builders import directive, user, wait_until
from tests.web.support import FULL_TOKEN
from think_jobs import ThinkJobs
from think_jobs.testing import worker

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["sqlite"])]


def logged_in(browser: Browser, base_url: str) -> Page:
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.goto(f"{base_url}/admin/login")
    page.fill("#tj-token", FULL_TOKEN)
    page.click("button[type=submit]")
    expect(page.get_by_role("heading", name="Agents")).to_be_visible()
    return page


def test_a_long_agent_name_keeps_the_counts_on_screen(
    base_url: str, browser: Browser, web_jobs: ThinkJobs
) -> None:
    long_name = "n" * 200
    web_jobs.get_agent("Recorder", long_name).submit_messages([user("x")])
    page = logged_in(browser, base_url)
    page.goto(f"{base_url}/admin/")
    for header in ("Pending", "Running"):
        box = page.locator("#tj-agents th", has_text=header).bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1400, (header, box)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400


def test_a_detail_page_opened_mid_turn_says_streaming(
    base_url: str, browser: Browser, web_jobs: ThinkJobs, app: Flask
) -> None:
    agent = web_jobs.get_agent("Recorder", "mid")
    words = " ".join(f"w{i}" for i in range(60))
    result = agent.submit_messages([directive(label="mid", text=words, delay_s=0.1)])
    page = logged_in(browser, base_url)
    with worker(web_jobs, concurrency=1):
        wait_until(lambda: _streamed(agent, result.submission_id) >= 5)
        page.goto(f"{base_url}/admin/agents/Recorder/mid/requests/{result.submission_id}")
        expect(page.locator(".tj-status").first).to_have_text("running")
        expect(page.locator("#tj-live")).to_have_text("streaming…", timeout=30_000)
        expect(page.locator("#tj-output")).to_contain_text("w59", timeout=60_000)


def _streamed(agent: object, submission_id: str) -> int:
    """How many text deltas the turn has published so far (read back from the admin data)."""
    from web.admin_data import transcript

    return len(transcript(agent, submission_id).text.split())  # type: ignore[arg-type]
